"""Report files written by ``--report-dir``: ``report.json`` (schema :data:`SCHEMA`),
``junit.xml`` (one ``testsuite`` per area, for CI systems) and ``report.md`` (a report card a
vendor can publish: per area, per check, what works).

Entry points, for any :class:`~accelkit.conformance.model.RunReport` (whoever made it):
:func:`write` (the three files), :func:`to_json`, :func:`to_junit`, :func:`to_markdown`;
:func:`read_json` loads a ``report.json`` back (``accelkit compare``).

Every check appears as ``<area>.<name>`` run on ``N`` ranks, keyed ``<area>.<name>@N``; in
JUnit (the CLI's and the pytest plugin's alike) as ``classname="accelkit.conformance.<area>"``,
``name="<name>@N"``.

``report.json`` (``"schema": "accelkit.conformance/2"``) holds: ``backend`` (name, device type,
collective backend, process-group backend string, capabilities, origin), ``versions``
(accelkit, torch, torch_build — ``CPU``, ``CUDA 13.0``... —, python, the backend's
distribution and its version), ``settings`` (the
backend's settings and modes, ``BackendSpec.settings``), ``device`` (as rank 0 saw it),
``host`` (the machine rank 0 ran on), ``hosts`` (every host the ranks ran on, hostname -> its
ranks: a torchrun launch's hosts, each as its ranks saw their own; in pool and pytest modes one
host with every rank of the largest world size that ran), ``started``, ``duration_s``, ``world_sizes``, ``options`` (areas, patterns, world
sizes, timeout, strict, extra modules, builtin, memory limit), ``expectations`` (file used),
``unavailable`` (reason or null), ``aborted`` (why the run stopped early, or null), ``error``
(why no check could run, with the whole exception, or null), ``left_out`` (checks not
written for the requested world sizes: id and the sizes they are written for), ``mode``
(``pool``, ``pytest`` or ``torchrun``), ``summary`` (counts per outcome + total), ``areas``
(counts and time per area), ``pool_starts`` (world size, seconds, why, worker pids) and
``checks``: key, id, area, world_size, requires, doc, outcome, actual (the outcome an
expectation replaced), reason (complete, every line), duration_s, pool_start_s,
peak_host_mb / peak_device_mb (the largest rank's), expectation, ranks (rank, status, message,
traceback, duration_s, peak_host_mb, peak_device_mb, returned, exit, log_tail).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

from accelkit.conformance.api import CHECKS
from accelkit.conformance.model import RunReport
from accelkit.conformance.outcomes import ORDER, CheckResult, Outcome

SCHEMA = "accelkit.conformance/2"

_MARK = {Outcome.PASS: "✅ pass", Outcome.FAIL: "❌ FAIL", Outcome.ERROR: "❌ ERROR",
         Outcome.TIMEOUT: "⏱️ TIMEOUT", Outcome.CRASH: "💥 CRASH", Outcome.SKIP: "⏭️ skip",
         Outcome.XFAIL: "⚠️ known failure", Outcome.XPASS: "❔ unexpected pass",
         Outcome.UNAVAILABLE: "— unavailable"}


def _doc_line(check_id: str) -> str:
    """The first paragraph of the check's docstring, on one line."""
    check = CHECKS.get(check_id)
    if check is None or not check.doc.strip():
        return ""
    return " ".join(check.doc.strip().split("\n\n")[0].split())


def junit_names(result: CheckResult) -> tuple[str, str]:
    """(classname, name) of a check's JUnit test case (the pytest plugin's items match)."""
    return f"accelkit.conformance.{result.area}", result.key.split(".", 1)[1]


def left_out_text(report: RunReport) -> str:
    """One line naming the checks ``--world-size`` left out, or ''."""
    if not report.left_out:
        return ""
    sizes = ", ".join(map(str, report.options.world_sizes))
    named = ", ".join(f"{c.id} (written for {', '.join(map(str, c.world_sizes))})"
                      for c in report.left_out)
    return f"{len(report.left_out)} check(s) not written for world size {sizes}, not run: {named}"


def ranks_text(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``; ``[3]`` -> ``"rank 3"``."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def hosts_text(report: RunReport, quote: str = "") -> str:
    """The hosts of the run, each with its ranks: ``"a (ranks 0-1), b (ranks 2-3)"``; one
    host: its name alone. ``quote`` surrounds each name (a backtick in Markdown)."""
    hosts = report.rank_hosts()
    if len(hosts) == 1:
        return f"{quote}{next(iter(hosts))}{quote}"
    return ", ".join(f"{quote}{name}{quote} ({ranks_text(ranks)})"
                     for name, ranks in hosts.items())


def versions_text(report: RunReport) -> str:
    v = report.versions
    dist = v.get("backend_distribution")
    torch = f"torch {v.get('torch')}" + (f" ({v['torch_build']} build)" if v.get("torch_build") else "")
    parts = [f"accelkit {v.get('accelkit')}", torch, f"python {v.get('python')}"]
    if dist and dist["name"] != "accelkit":  # a built-in backend ships with accelkit
        parts.append(f"{dist['name']} {dist['version']}")
    return ", ".join(parts)


def to_json(report: RunReport) -> dict:
    spec = report.spec
    checks = []
    for r in report.results:
        check = CHECKS.get(r.id)
        checks.append({
            "key": r.key, "id": r.id, "area": r.area, "world_size": r.world_size,
            "simulated": r.simulated, "requires": list(check.requires) if check else [],
            "doc": check.doc if check else "",
            "outcome": r.outcome.value, "actual": r.actual.value if r.actual else None,
            "reason": r.reason, "duration_s": r.duration_s,
            "pool_start_s": r.pool_start_s, "peak_host_mb": r.peak_mb("host"),
            "peak_device_mb": r.peak_mb("device"), "expectation": r.expectation,
            "ranks": [rank.to_dict() for rank in r.ranks], "rows": r.rows})
    areas = {}
    for area, results in report.by_area().items():
        areas[area] = dict(report.counts(results),
                           duration_s=round(sum(r.duration_s for r in results), 3))
    return {
        "schema": SCHEMA,
        "backend": {"name": spec.name, "device_type": spec.device_type,
                    "collective_backend": spec.collective_backend,
                    "process_group_backend": spec.process_group_backend,
                    "capabilities": asdict(spec.capabilities), "origin": spec.origin},
        "versions": report.versions,
        "settings": report.settings,
        "device": report.device,
        "host": report.host,
        "hosts": report.rank_hosts(),
        "started": report.started,
        "duration_s": report.duration_s,
        "world_sizes": report.world_sizes,
        "simulated_world_sizes": report.simulated_world_sizes,
        "options": report.options.to_dict(),
        "expectations": report.options.expectations,
        "unavailable": report.unavailable,
        "aborted": report.aborted,
        "error": report.error,
        "left_out": [{"id": c.id, "world_sizes": list(c.world_sizes)} for c in report.left_out],
        "mode": report.mode,
        "summary": report.counts(),
        "areas": areas,
        "pool_starts": report.pool_starts,
        "checks": checks,
    }


def read_json(path: str | Path) -> dict:
    """A ``report.json`` written by :func:`write`; ValueError naming the file when it is not
    one (or of another schema)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path} is not an accelkit conformance report of schema {SCHEMA} "
                         f"(found {found!r})")
    return data


def _detail(r: CheckResult) -> str:
    """The full reason and, per rank that did not pass, its traceback and log."""
    return r.reason + "".join(
        f"\n\n--- rank {k.rank} ({k.status}) ---\n{k.traceback or k.message}{k.log_tail}"
        for k in r.ranks if k.status not in ("pass", "skip"))


def _junit_case(suite: ET.Element, r: CheckResult, strict: bool) -> None:
    classname, name = junit_names(r)
    case = ET.SubElement(suite, "testcase", classname=classname, name=name,
                         time=f"{r.duration_s:.3f}")
    detail = _detail(r)
    first = r.first_line
    if r.outcome is Outcome.FAIL:
        ET.SubElement(case, "failure", message=first, type="FAIL").text = detail
    elif r.outcome in (Outcome.ERROR, Outcome.TIMEOUT, Outcome.CRASH):
        ET.SubElement(case, "error", message=first, type=r.outcome.label).text = detail
    elif r.outcome is Outcome.XPASS and strict:
        ET.SubElement(case, "failure", message=first, type="XPASS").text = detail
    elif r.outcome in (Outcome.SKIP, Outcome.UNAVAILABLE, Outcome.XFAIL):
        ET.SubElement(case, "skipped", message=f"{r.outcome.label}: {first}",
                      type=r.outcome.label).text = detail
    props = ET.Element("properties")
    ET.SubElement(props, "property", name="outcome", value=r.outcome.value)
    if r.world_size is not None:
        ET.SubElement(props, "property", name="world_size", value=str(r.world_size))
    if r.actual is not None:
        ET.SubElement(props, "property", name="actual", value=r.actual.value)
    case.insert(0, props)


def _suite_properties(suite: ET.Element, report: RunReport) -> None:
    props = ET.SubElement(suite, "properties")
    values = {"backend": report.spec.name, "versions": versions_text(report),
              "hosts": hosts_text(report)}
    values.update({f"setting.{k}": v for k, v in report.settings.items()})
    if report.left_out:
        values["left_out"] = left_out_text(report)
    for name, value in values.items():
        ET.SubElement(props, "property", name=name, value=value)


def to_junit(report: RunReport) -> ET.ElementTree:
    root = ET.Element("testsuites", name=f"accelkit conformance ({report.spec.name})")
    if report.error is not None:  # nothing ran: one failing case carrying the error
        suite = ET.SubElement(root, "testsuite", name="accelkit", tests="1", failures="0",
                              errors="1", skipped="0", time="0.000")
        _suite_properties(suite, report)
        case = ET.SubElement(suite, "testcase", classname="accelkit.conformance",
                             name="load_checks", time="0.000")
        ET.SubElement(case, "error", message=report.error.splitlines()[0],
                      type="ERROR").text = report.error
    for area, results in report.by_area().items():
        counts = report.counts(results)
        failures = counts["fail"] + (counts["xpass"] if report.options.strict else 0)
        errors = counts["error"] + counts["timeout"] + counts["crash"]
        skipped = counts["skip"] + counts["unavailable"] + counts["xfail"]
        suite = ET.SubElement(root, "testsuite", name=area, tests=str(len(results)),
                              failures=str(failures), errors=str(errors), skipped=str(skipped),
                              time=f"{sum(r.duration_s for r in results):.3f}")
        _suite_properties(suite, report)
        for r in results:
            _junit_case(suite, r, report.options.strict)
    ET.indent(root)
    return ET.ElementTree(root)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: every line kept (``<br>``), pipes escaped."""
    return "<br>".join(line.replace("|", "\\|") for line in text.strip().splitlines())


def not_passed_lines(report: RunReport) -> list[str]:
    """report.md's opening: every check that makes the run fail, with its outcome and the first
    line of why, then how many known failures there are; or that nothing failed."""
    failed = report.failed()
    known = sum(r.outcome is Outcome.XFAIL for r in report.results)
    if not failed:
        return ["**Did not pass:** nothing that ran failed"
                + (f" ({known} known failure(s), listed below)" if known else "") + ".", ""]
    lines = [f"**Did not pass ({len(failed)}):**", ""]
    lines += [f"- `{r.key}` {_MARK[r.outcome]}: {r.first_line}" for r in failed]
    if known:
        lines.append(f"- and {known} known failure(s) (expectations), listed below")
    return lines + [""]


def to_markdown(report: RunReport) -> str:
    spec, counts = report.spec, report.counts()
    dev = report.device or {}
    lines = [f"# PyTorch distributed conformance: `{spec.name}`", "", *not_passed_lines(report),
             "| | |", "|---|---|",
             f"| backend | `{spec.name}` ({spec.origin or 'built in'}) |",
             f"| device | `{spec.device_type}` {dev.get('name') or ''} "
             f"{'× ' + str(dev['count']) if dev.get('count') else ''} |",
             f"| collectives | `{spec.process_group_backend}` |",
             f"| RNG class | `{spec.capabilities.rng}` |",
             f"| versions | {versions_text(report)} |",
             f"| {'hosts' if len(report.rank_hosts()) > 1 else 'host'} | "
             f"{hosts_text(report, quote='`')} |",
             f"| world sizes | {', '.join(map(str, report.world_sizes)) or '-'} |",
             f"| simulated world sizes | {', '.join(map(str, report.simulated_world_sizes)) or '-'}"
             " (one process, torch's fake process group) |",
             f"| run | {report.started}, {report.duration_s:.1f} s |"]
    built = sum(start.get("prepare_s", 0.0) for start in report.pool_starts)
    if built:
        lines.append(f"| backend build | {built:.1f} s in `prepare()` (not in check times) |")
    if report.settings:
        lines.append("| settings | " + ", ".join(f"`{k}={v}`" for k, v in report.settings.items())
                     + " |")
    lines.append("")
    if report.error:
        lines += ["**No check could run:**", "", "```", report.error, "```", ""]
    if report.unavailable:
        lines += [f"**Unavailable here:** {report.unavailable}", ""]
    if report.aborted:
        lines += [f"**Run aborted:** {report.aborted}", ""]
    if report.left_out:
        lines += [f"**Left out:** {left_out_text(report)}", ""]
    verdict = "❌ not conformant" if not report.ok() else (
        "— not run" if report.unavailable else "✅ conformant (every check passed, was skipped "
        "for a stated reason, or is a documented known failure)")
    lines += [f"**Result: {verdict}** — " + (", ".join(
        f"{counts[o.value]} {o.value}" for o in ORDER if counts[o.value]) or "no check ran"), ""]
    lines += ["| area | " + " | ".join(o.value for o in ORDER) + " | total |",
              "|---|" + "---:|" * (len(ORDER) + 1)]
    for area, results in report.by_area().items():
        c = report.counts(results)
        lines.append(f"| {area} | " + " | ".join(str(c[o.value]) for o in ORDER)
                     + f" | {c['total']} |")
    for area, results in report.by_area().items():
        lines += ["", f"## {area}", "", "| check | ranks | result | what it checks | note |",
                  "|---|---:|---|---|---|"]
        for r in results:
            note = _cell(r.reason)
            if r.expectation and r.expectation.get("link"):
                note += f" ([link]({r.expectation['link']}))"
            ranks = f"{r.world_size} simulated" if r.simulated else r.world_size
            lines.append(f"| `{r.id}` | {ranks} | {_MARK[r.outcome]} | "
                         f"{_cell(_doc_line(r.id))} | {note} |")
    lines += row_tables(report)
    lines += capability_tables(report)
    lines += ["", "Generated by `accelkit conformance`; details per rank in `report.json`.", ""]
    return "\n".join(lines)


#: The row statuses of a check's table, in column order.
ROW_STATUSES = ("pass", "fail", "error", "xfail", "xpass", "skip")


def row_tables(report: RunReport) -> list[str]:
    """The op table of the checks that have rows (the ``ops`` area): counts per check, every
    row that did not simply pass or skip, and why rows were skipped (counted by reason);
    ``report.json`` holds every row."""
    with_rows = [r for r in report.results if r.rows and "op" in r.rows[0]]
    if not with_rows:
        return []
    lines = ["", "## op table", "", "| check | ops | " + " | ".join(ROW_STATUSES) + " |",
             "|---|---:|" + "---:|" * len(ROW_STATUSES)]
    for r in with_rows:
        ops = len({row.get("op") for row in r.rows})
        counts = [sum(row["status"] == status for row in r.rows) for status in ROW_STATUSES]
        lines.append(f"| `{r.key}` | {ops} | " + " | ".join(map(str, counts)) + " |")
    notable = [(r, row) for r in with_rows for row in r.rows if row["status"] not in ("pass", "skip")]
    if notable:
        lines += ["", "| op | dtype | result | samples | backward | what differs | expectation |",
                  "|---|---|---|---:|---|---|---|"]
        lines += [f"| `{row['op']}` | {row['dtype']} | {row['status']} | {row['samples']} | "
                  f"{'yes' if row['backward'] else 'no'} | {_cell(row['detail'])} | "
                  f"{_cell(row.get('expectation', ''))} |" for r, row in notable]
    reasons: dict[str, int] = {}
    for r in with_rows:
        for row in r.rows:
            if row["status"] == "skip":
                reasons[row["detail"]] = reasons.get(row["detail"], 0) + 1
    if reasons:
        lines += ["", "| rows skipped | why |", "|---:|---|"]
        lines += [f"| {n} | {_cell(why)} |" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return lines


def guide_level(rows: list[dict]) -> str:
    """The level of PyTorch's guide for out-of-tree c10d backends that a check's capability rows
    (``collectives.capability_levels``) show reached: ``extended`` when every op of both sets
    passed, ``minimal`` when every op of the minimal set did, else ``below minimal``."""
    passed = {kind: all(row["status"] == "pass" for row in rows if row["kind"] == kind)
              for kind in ("minimal", "extended")}
    return ("extended" if passed["minimal"] and passed["extended"] else
            "minimal" if passed["minimal"] else "below minimal")


def capability_tables(report: RunReport) -> list[str]:
    """Per check with capability rows: the guide level reached, then every op and capability
    bit with its result."""
    lines = []
    for r in report.results:
        if not (r.rows and "capability" in r.rows[0]):
            continue
        lines += ["", f"## collective capabilities (`{r.key}`)", "",
                  f"Level of PyTorch's guide for out-of-tree backends "
                  f"(docs/source/accelerator/distributed.md) reached: **{guide_level(r.rows)}**.", "",
                  "| op or capability | set | result | detail |", "|---|---|---|---|"]
        lines += [f"| `{row['capability']}` | {row['kind']} | {row['status']} | {_cell(row['detail'])} |"
                  for row in r.rows]
    return lines


def write(report: RunReport, directory: str | Path) -> list[Path]:
    """Write the three report files into ``directory`` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "report.json", directory / "junit.xml", directory / "report.md"]
    paths[0].write_text(json.dumps(to_json(report), indent=2) + "\n")
    to_junit(report).write(paths[1], encoding="utf-8", xml_declaration=True)
    paths[2].write_text(to_markdown(report))
    return paths
