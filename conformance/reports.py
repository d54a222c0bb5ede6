"""Report files written by ``--report-dir`` (issue #3): ``report.json`` (schema
:data:`SCHEMA`), ``junit.xml`` (one ``testsuite`` per area, for CI systems) and ``report.md``
(a report card a vendor can publish: per area, per check, what works).

``report.json`` (``"schema": "accelkit.conformance/1"``) holds: ``backend`` (name, device type,
collective backend, process-group backend string, capabilities, origin), ``device`` (as rank 0
saw it), ``torch``, ``python``, ``host``, ``started``, ``duration_s``, ``world_sizes``,
``options`` (timeout, strict, extra modules, memory limit), ``expectations`` (file used),
``unavailable`` (reason or null), ``aborted``
(torchrun mode: why the run stopped early, or null), ``mode`` (``pool`` or ``torchrun``), ``summary`` (counts per outcome + total), ``areas`` (counts and
time per area), ``pool_starts`` (world size, seconds, why, worker pids) and ``checks``: id, area, world_size,
requires, doc, outcome, actual (the outcome an expectation replaced), reason, duration_s,
pool_start_s, peak_host_mb / peak_device_mb (the largest rank's), expectation, ranks (rank, status, message, traceback, duration_s, peak_host_mb, peak_device_mb,
returned, exit, log_tail).
"""

from __future__ import annotations

import json
import platform
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

from accelkit.conformance.api import CHECKS
from accelkit.conformance.outcomes import ORDER, CheckResult, Outcome
from accelkit.conformance.runner import RunReport

SCHEMA = "accelkit.conformance/1"

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


def to_json(report: RunReport) -> dict:
    spec = report.spec
    checks = []
    for r in report.results:
        check = CHECKS.get(r.id)
        checks.append({
            "id": r.id, "area": r.area, "world_size": r.world_size,
            "requires": list(check.requires) if check else [],
            "doc": check.doc if check else "",
            "outcome": r.outcome.value, "actual": r.actual.value if r.actual else None,
            "reason": r.reason, "duration_s": r.duration_s,
            "pool_start_s": r.pool_start_s, "peak_host_mb": r.peak_mb("host"),
            "peak_device_mb": r.peak_mb("device"), "expectation": r.expectation,
            "ranks": [rank.to_dict() for rank in r.ranks]})
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
        "device": report.device,
        "torch": report.torch,
        "python": platform.python_version(),
        "host": report.host,
        "started": report.started,
        "duration_s": report.duration_s,
        "world_sizes": report.world_sizes,
        "options": {"timeout_s": report.options.timeout_s, "strict": report.options.strict,
                    "modules": report.options.modules, "builtin": report.options.builtin,
                    "memory_limit_mb": report.options.memory_limit_mb},
        "expectations": report.options.expectations_path,
        "unavailable": report.unavailable,
        "aborted": report.aborted,
        "mode": report.mode,
        "summary": report.counts(),
        "areas": areas,
        "pool_starts": report.pool_starts,
        "checks": checks,
    }


def _junit_case(suite: ET.Element, r: CheckResult, strict: bool) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"accelkit.conformance.{r.area}",
                         name=r.id.split(".", 1)[1], time=f"{r.duration_s:.3f}")
    detail = r.reason + "".join(
        f"\n\n--- rank {k.rank} ({k.status}) ---\n{k.traceback or k.message}{k.log_tail}"
        for k in r.ranks if k.status not in ("pass", "skip"))
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
    ET.SubElement(props, "property", name="world_size", value=str(r.world_size))
    case.insert(0, props)


def to_junit(report: RunReport) -> ET.ElementTree:
    root = ET.Element("testsuites", name=f"accelkit conformance ({report.spec.name})")
    for area, results in report.by_area().items():
        counts = report.counts(results)
        failures = counts["fail"] + (counts["xpass"] if report.options.strict else 0)
        errors = counts["error"] + counts["timeout"] + counts["crash"]
        skipped = counts["skip"] + counts["unavailable"] + counts["xfail"]
        suite = ET.SubElement(root, "testsuite", name=area, tests=str(len(results)),
                              failures=str(failures), errors=str(errors), skipped=str(skipped),
                              time=f"{sum(r.duration_s for r in results):.3f}")
        for r in results:
            _junit_case(suite, r, report.options.strict)
    ET.indent(root)
    return ET.ElementTree(root)


def to_markdown(report: RunReport) -> str:
    spec, counts = report.spec, report.counts()
    dev = report.device or {}
    lines = [f"# PyTorch distributed conformance: `{spec.name}`", "",
             "| | |", "|---|---|",
             f"| backend | `{spec.name}` ({spec.origin or 'built in'}) |",
             f"| device | `{spec.device_type}` {dev.get('name') or ''} "
             f"{'× ' + str(dev['count']) if dev.get('count') else ''} |",
             f"| collectives | `{spec.process_group_backend}` |",
             f"| RNG class | `{spec.capabilities.rng}` |",
             f"| torch | {report.torch} |",
             f"| world sizes | {', '.join(map(str, report.world_sizes)) or '-'} |",
             f"| run | {report.started}, {report.duration_s:.1f} s |", ""]
    if report.unavailable:
        lines += [f"**Unavailable here:** {report.unavailable}", ""]
    if report.aborted:
        lines += [f"**Run aborted:** {report.aborted}", ""]
    verdict = "❌ not conformant" if not report.ok() else (
        "— not run" if report.unavailable else "✅ conformant (every check passed, was skipped "
        "for a stated reason, or is a documented known failure)")
    lines += [f"**Result: {verdict}** — " + ", ".join(
        f"{counts[o.value]} {o.value}" for o in ORDER if counts[o.value]), ""]
    lines += ["| area | " + " | ".join(o.value for o in ORDER) + " | total |",
              "|---|" + "---:|" * (len(ORDER) + 1)]
    for area, results in report.by_area().items():
        c = report.counts(results)
        lines.append(f"| {area} | " + " | ".join(str(c[o.value]) for o in ORDER)
                     + f" | {c['total']} |")
    for area, results in report.by_area().items():
        lines += ["", f"## {area}", "", "| check | result | what it checks | note |",
                  "|---|---|---|---|"]
        for r in results:
            note = r.first_line.replace("|", "\\|")
            if r.expectation and r.expectation.get("link"):
                note += f" ([link]({r.expectation['link']}))"
            lines.append(f"| `{r.id}` | {_MARK[r.outcome]} | "
                         f"{_doc_line(r.id).replace('|', chr(92) + '|')} | {note} |")
    lines += ["", "Generated by `accelkit conformance`; details per rank in `report.json`.", ""]
    return "\n".join(lines)


def write(report: RunReport, directory: str | Path) -> list[Path]:
    """Write the three report files into ``directory`` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "report.json", directory / "junit.xml", directory / "report.md"]
    paths[0].write_text(json.dumps(to_json(report), indent=2) + "\n")
    to_junit(report).write(paths[1], encoding="utf-8", xml_declaration=True)
    paths[2].write_text(to_markdown(report))
    return paths
