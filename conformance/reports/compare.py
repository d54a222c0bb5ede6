"""Conformance reports side by side (``accelkit compare A.json B.json [C.json ...]``, whose
command is :mod:`accelkit.commands.compare`).

The first report is the baseline; every later one is compared with it, check by check (keyed
``id@N``: a check on N ranks): what **newly fails** (FAIL, ERROR, TIMEOUT or CRASH where the
baseline did not fail), what **newly passes** (PASS where the baseline did not pass), what
changed its outcome otherwise (e.g. PASS -> SKIP, FAIL -> ERROR, XFAIL -> PASS...), the
checks only one side has, and the biggest changes in run time. Two runs of one backend show
regressions; two backends (or two torch versions, two drivers) side by side show what one
does that the other does not. When the two runs' versions differ (torch, its build, accelkit,
python, the backend's distribution), the comparison says so first ("changed with: torch
2.13.0+cpu -> 2.15.0, ..."): the outcome changes are what changed with them.

Output as text (default), Markdown (``--format markdown``, for a CI summary or a pull request)
or JSON (``--format json``). Exit status: 0, or 1 when a later report newly fails a check (CI
gating), or 2 when a file is not a report. With ``--same``, 1 when anything but time differs: an
outcome, or a check only one side has (a refactoring's proof that every check gives the result
it gave before).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from accelkit.conformance.outcomes import FAILING, Outcome

#: How many of the biggest run-time changes are listed (``--top``).
DEFAULT_TOP = 10
#: Changes smaller than this are not worth listing (timing noise).
MIN_TIME_CHANGE_S = 0.05


@dataclass
class Change:
    key: str
    before: str | None  # outcome in the baseline (None: the check is not in it)
    after: str | None
    reason: str = ""    # the later report's reason (first line)


@dataclass
class TimeChange:
    key: str
    before_s: float
    after_s: float

    @property
    def delta_s(self) -> float:
        return round(self.after_s - self.before_s, 4)


@dataclass
class Comparison:
    """The baseline against one later report."""

    baseline: str
    other: str
    newly_failing: list[Change] = field(default_factory=list)
    newly_passing: list[Change] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_other: list[str] = field(default_factory=list)
    time_changes: list[TimeChange] = field(default_factory=list)
    #: What differs between the two runs' versions (torch, its build, accelkit, python, the
    #: backend's distribution): "name": [baseline's, other's]. The outcome changes above are
    #: what changed with them.
    versions_changed: dict[str, list] = field(default_factory=dict)

    def changed_with(self) -> str:
        """``torch 2.13.0+cpu -> 2.15.0``-style text of :attr:`versions_changed`, or ''."""
        return ", ".join(f"{name} {before} -> {after}"
                         for name, (before, after) in self.versions_changed.items())

    @property
    def regressed(self) -> bool:
        return bool(self.newly_failing)

    @property
    def same(self) -> bool:
        """Every check of either report is in both, with the same outcome."""
        return not (self.newly_failing or self.newly_passing or self.changed
                    or self.only_in_baseline or self.only_in_other)


_FAILING = {o.value for o in FAILING}


def label(report: dict, path: str) -> str:
    versions = report.get("versions") or {}
    return f"{path} ({report['backend']['name']}, torch {versions.get('torch')}, {report['started']})"


def _checks(report: dict) -> dict[str, dict]:
    return {c["key"]: c for c in report["checks"]}


def compare(baseline: dict, other: dict, *, names: tuple[str, str] = ("A", "B"),
            top: int = DEFAULT_TOP) -> Comparison:
    """``other`` against ``baseline`` (two loaded ``report.json``)."""
    result = Comparison(names[0], names[1])
    before, after = _checks(baseline), _checks(other)
    for key in before.keys() & after.keys():
        was, now = before[key]["outcome"], after[key]["outcome"]
        if was == now:
            continue
        reason = (after[key]["reason"].strip().splitlines() or [""])[0]
        change = Change(key, was, now, reason)
        if now in _FAILING and was not in _FAILING:
            result.newly_failing.append(change)
        elif now == Outcome.PASS.value:
            result.newly_passing.append(change)
        else:
            result.changed.append(change)
    result.only_in_baseline = sorted(before.keys() - after.keys())
    result.only_in_other = sorted(after.keys() - before.keys())
    ran = [TimeChange(k, before[k]["duration_s"], after[k]["duration_s"])
           for k in before.keys() & after.keys()
           if before[k]["ranks"] and after[k]["ranks"]]  # both ran (not decided without running)
    ran = [t for t in ran if abs(t.delta_s) >= MIN_TIME_CHANGE_S]
    result.time_changes = sorted(ran, key=lambda t: -abs(t.delta_s))[:top]
    result.versions_changed = _versions_changed(baseline, other)
    for items in (result.newly_failing, result.newly_passing, result.changed):
        items.sort(key=lambda c: c.key)
    return result


def _versions_changed(baseline: dict, other: dict) -> dict[str, list]:
    def flat(report: dict) -> dict[str, str]:
        versions = dict(report.get("versions") or {})
        dist = versions.pop("backend_distribution", None)
        if dist:
            versions[dist["name"]] = dist["version"]
        return {k: str(v) for k, v in versions.items() if v is not None}

    before, after = flat(baseline), flat(other)
    return {k: [before.get(k, "-"), after.get(k, "-")] for k in {**before, **after}
            if before.get(k) != after.get(k)}


def _outcome(value: str | None) -> str:
    return "-" if value is None else Outcome(value).label


def to_text(comparisons: list[Comparison]) -> str:
    lines = []
    for c in comparisons:
        lines += [f"baseline: {c.baseline}", f"compared: {c.other}"]
        if c.versions_changed:
            lines.append(f"changed with: {c.changed_with()}")
        lines.append("")
        for title, items in (("newly failing", c.newly_failing),
                             ("newly passing", c.newly_passing),
                             ("outcome changed", c.changed)):
            lines.append(f"{title}: {len(items)}")
            lines += [f"  {ch.key}: {_outcome(ch.before)} -> {_outcome(ch.after)}"
                      + (f"  ({ch.reason})" if ch.reason else "") for ch in items]
        for title, keys in (("only in the baseline", c.only_in_baseline),
                            ("only in the compared report", c.only_in_other)):
            if keys:
                lines.append(f"{title}: {len(keys)}: {', '.join(keys)}")
        if c.time_changes:
            lines.append(f"biggest time changes ({len(c.time_changes)}):")
            lines += [f"  {t.key}: {t.before_s:.2f}s -> {t.after_s:.2f}s ({t.delta_s:+.2f}s)"
                      for t in c.time_changes]
        lines += ["", "REGRESSED: a check newly fails" if c.regressed else "no regression",
                  "same results: every check in both, each with its outcome" if c.same else
                  "results differ", ""]
    return "\n".join(lines).rstrip() + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(comparisons: list[Comparison], reports: list[dict] | None = None) -> str:
    lines = ["# accelkit conformance: comparison", ""]
    if reports is not None and len(reports) > 2:  # backends / runs side by side
        keys = sorted({c["key"] for r in reports for c in r["checks"]})
        by = [_checks(r) for r in reports]
        lines += ["| check | " + " | ".join(r["backend"]["name"] for r in reports) + " |",
                  "|---|" + "---|" * len(reports)]
        for key in keys:
            lines.append(f"| `{key}` | " + " | ".join(
                _outcome(b[key]["outcome"]) if key in b else "-" for b in by) + " |")
        lines.append("")
    for c in comparisons:
        verdict = "❌ regressed" if c.regressed else "✅ no regression"
        lines += [f"## {_md(c.other)}", "", f"against {_md(c.baseline)}: **{verdict}**", ""]
        if c.versions_changed:
            lines += [f"Changed with: {_md(c.changed_with())}", ""]
        lines += [f"{len(c.newly_failing)} newly failing, {len(c.newly_passing)} newly passing, "
                  f"{len(c.changed)} other outcome changes", ""]
        changes = [("newly failing", ch) for ch in c.newly_failing] + \
                  [("newly passing", ch) for ch in c.newly_passing] + \
                  [("changed", ch) for ch in c.changed]
        if changes:
            lines += ["| check | before | after | | note |", "|---|---|---|---|---|"]
            lines += [f"| `{ch.key}` | {_outcome(ch.before)} | {_outcome(ch.after)} | {kind} | "
                      f"{_md(ch.reason)} |" for kind, ch in changes]
            lines.append("")
        for title, keys in (("Only in the baseline", c.only_in_baseline),
                            ("Only in the compared report", c.only_in_other)):
            if keys:
                lines += [f"{title}: " + ", ".join(f"`{k}`" for k in keys), ""]
        if c.time_changes:
            lines += ["| biggest time changes | before | after | change |", "|---|---:|---:|---:|"]
            lines += [f"| `{t.key}` | {t.before_s:.2f} s | {t.after_s:.2f} s | {t.delta_s:+.2f} s |"
                      for t in c.time_changes]
            lines.append("")
    return "\n".join(lines)


def to_json(comparisons: list[Comparison]) -> dict:
    return {"schema": "accelkit.compare/1",
            "regressed": any(c.regressed for c in comparisons),
            "same": all(c.same for c in comparisons),
            "comparisons": [dict(asdict(c), regressed=c.regressed, same=c.same,
                                 time_changes=[dict(asdict(t), delta_s=t.delta_s)
                                               for t in c.time_changes])
                            for c in comparisons]}
