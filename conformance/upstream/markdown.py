"""``report.md`` of an ``accelkit upstream`` run, in the order a vendor reads it: what broke
against the baseline, whether the tests ran on the device's backend, per file and per class,
then every test that did not pass with its reason."""

from __future__ import annotations

from accelkit.conformance.upstream.bridge import mark
from accelkit.conformance.upstream.report import OUTCOMES, UpstreamReport

_COLUMNS = OUTCOMES


def _cell(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def _counts_row(label: str, counts: dict, seconds: float | None = None) -> str:
    cells = " | ".join(str(counts[o]) if counts[o] else "" for o in _COLUMNS)
    time = f" {seconds:.1f} |" if seconds is not None else ""
    return f"| {label} | {cells} | {counts['total']} |{time}"


def _comparison(report: UpstreamReport) -> list[str]:
    comp = report.comparison
    if not comp:
        return []
    there, here = comp["against"]["backend"], report.spec.name
    lines = [f"## Passes on `{there}`, fails on `{here}`", ""]
    if comp["regressions"]:
        lines += ["| test | here | reason here |", "|---|---|---|"]
        lines += [f"| `{_cell(e['test'], 300)}` | {mark(e['here'])} | {_cell(e['reason_here'])} |"
                  for e in comp["regressions"]]
    else:
        lines.append(f"None: every test that passes on `{there}` and ran here passes here.")
    lines += ["", f"Compared with the `{there}` run of {comp['against']['started']} "
              f"({comp['matched']} tests in both): {len(comp['regressions'])} regressions, "
              f"{len(comp['skipped_here'])} passing there but skipped or expected to fail here, "
              f"{len(comp['both_fail'])} failing in both, {len(comp['fixed'])} failing there "
              f"only, {len(comp['only_here'])} only here, {len(comp['only_there'])} only there.",
              ""]
    if comp["skipped_here"]:
        lines += [f"### Passes on `{there}`, skipped or expected to fail on `{here}`", "",
                  "| test | here | reason here |", "|---|---|---|"]
        lines += [f"| `{_cell(e['test'], 300)}` | {mark(e['here'])} | {_cell(e['reason_here'])} |"
                  for e in comp["skipped_here"]]
        lines.append("")
    return lines


def _groups(report: UpstreamReport) -> list[str]:
    spec = report.spec
    lines = ["## Process groups (where the tests ran)", ""]
    counts = report.group_counts()
    if counts:
        lines += ["| backend | tests that created such groups |", "|---|---:|"]
        lines += [f"| `{b}` | {n} |" for b, n in counts.items()]
    else:
        lines.append("No test created a process group.")
    flagged, foreign = report.flagged, report.foreign
    lines += ["", f"Expected: `{spec.device_type}` tensors through `{spec.collective_backend}`. "
              + (f"**{len(foreign)} test(s) ran on another backend's groups**, "
                 if foreign else "No test ran on another backend's groups; ")
              + f"{len(flagged) - len(foreign)} only on simulated groups (fake, threaded: "
              "nothing crosses a process).", ""]
    if flagged:
        lines += ["| test | result | groups (size × ranks seen) | devices | flag |",
                  "|---|---|---|---|---|"]
        for t in sorted(flagged, key=lambda t: (t.flag_kind != "foreign", t.nodeid)):
            used = ", ".join(f"`{g['backend']}` ({g['size']} × {g['ranks']})" for g in t.groups)
            lines.append(f"| `{_cell(t.nodeid, 300)}` | {mark(t.outcome)} | {used} | "
                         f"{', '.join(t.devices) or '-'} | {t.flag_kind} |")
        lines.append("")
    return lines


def _files(report: UpstreamReport) -> list[str]:
    header = "| " + " | ".join(_COLUMNS) + " | total |"
    lines = ["## Files", "", "| file " + header + " wall s |",
             "|---|" + "---:|" * (len(_COLUMNS) + 2)]
    by_file = report.by_file()
    for f in report.files:
        label = f"`{f.path}`" + (f" ({f.status})" if f.status != "ok" else "")
        lines.append(_counts_row(label, report.counts(by_file.get(f.path, [])), f.duration_s))
    if report.missing:
        lines += ["", "Default files not in this checkout: "
                  + ", ".join(f"`{m}`" for m in report.missing)]
    lines.append("")
    for f in report.files:
        tests = by_file.get(f.path, [])
        lines += [f"### `{f.path}`", "", f"{f.duration_s:.1f} s, log `{f.log}`", ""]
        for err in f.collect_errors:
            lines += [f"**Collection error** `{err['nodeid']}`: {_cell(err['reason'], 400)}", ""]
        if f.unattributed_groups:
            lines += ["Process groups created outside any test: " + ", ".join(
                f"`{g['backend']}` ({g['size']} × {g['ranks']})" for g in f.unattributed_groups),
                ""]
        for err in f.recorder_errors:
            lines += [f"**Process-group recorder error**: {_cell(err, 400)}", ""]
        if tests:
            lines += ["| class " + header, "|---|" + "---:|" * (len(_COLUMNS) + 1)]
            lines += [_counts_row(f"`{c}`", report.counts(ts))
                      for c, ts in report.by_class(tests).items()]
            lines.append("")
    return lines


def _not_passing(report: UpstreamReport) -> list[str]:
    """Every test that neither passed nor skipped, then the skips grouped by reason."""
    order = {o: i for i, o in enumerate(OUTCOMES)}
    tests = [t for t in report.tests if t.outcome not in ("pass", "skip")]
    lines = []
    if tests:
        lines += ["## Tests that did not pass", "",
                  "| test | result | reason | category / link |", "|---|---|---|---|"]
        for t in sorted(tests, key=lambda t: (order[t.outcome], t.nodeid)):
            exp = t.expectation or {}
            note = exp.get("category", "")
            if exp.get("link"):
                note += f" ([link]({exp['link']}))"
            lines.append(f"| `{_cell(t.nodeid, 300)}` | {mark(t.outcome)} | {_cell(t.reason)} "
                         f"| {note} |")
        lines.append("")
    skips: dict[str, list[str]] = {}
    for t in report.tests:
        if t.outcome == "skip":
            skips.setdefault(t.reason, []).append(t.nodeid)
    if skips:
        lines += ["## Skipped, by reason", "", "| reason | tests | for example |",
                  "|---|---:|---|"]
        for reason, nodes in sorted(skips.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"| {_cell(reason)} | {len(nodes)} | `{_cell(nodes[0], 300)}` |")
        lines.append("")
    return lines


def render(report: UpstreamReport) -> str:
    spec, counts = report.spec, report.counts()
    applied = ", ".join(a["name"] for a in report.adaptations if a["applied"]) or "none"
    lines = [f"# PyTorch's distributed tests on `{spec.name}`", "", "| | |", "|---|---|",
             f"| backend | `{spec.name}`: `{spec.device_type}` through "
             f"`{spec.collective_backend}` |",
             f"| torch | {report.torch} |",
             f"| tests | {report.root} ({report.kind}"
             + (f", PyTorch {report.version}" if report.version else "") + ") |",
             f"| pytest arguments | `{' '.join(report.pytest_args)}` |" if report.pytest_args
             else "| pytest arguments | - |",
             f"| adaptations | {applied} |",
             f"| run | {report.started}, {report.duration_s:.1f} s |", ""]
    verdict = "✅ passed" if report.ok() else "❌ failed"
    lines += [f"**Result: {verdict}** — " + ", ".join(
        f"{counts[o]} {o}" for o in OUTCOMES if counts[o]) + f" ({counts['total']} tests)", ""]
    lines += _comparison(report) + _groups(report) + _files(report) + _not_passing(report)
    if report.patterns:
        lines += ["## Expectations", "", f"From `{report.expectations_path}`.", "",
                  "| pattern | status | category | tests matched |", "|---|---|---|---:|"]
        lines += [f"| `{_cell(p['pattern'], 300)}` | {p['status']} | {p['category']} | "
                  f"{p['matched'] or '**none**'} |" for p in report.patterns]
        lines.append("")
    lines += ["Generated by `accelkit upstream`; every test's details (tracebacks, groups, "
              "devices) are in `report.json`, each file's output in its log.", ""]
    return "\n".join(lines)
