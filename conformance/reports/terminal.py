"""What the engine prints: one progress line per check, then a per-area summary table and
the non-passing checks with their whole reason."""

from __future__ import annotations

import sys
import textwrap
from typing import TextIO

from accelkit.conformance.model import RunReport
from accelkit.conformance.outcomes import ORDER, CheckResult, Outcome
from accelkit.conformance.reports.files import hosts_text, left_out_text, versions_text

#: Outcomes listed after the summary table, worst first.
NOT_PASSING = (Outcome.CRASH, Outcome.TIMEOUT, Outcome.ERROR, Outcome.FAIL, Outcome.XPASS,
               Outcome.XFAIL, Outcome.SKIP, Outcome.UNAVAILABLE)


class Progress:
    """Prints ``[  3/27] PASS      0.04s  area.name@4  [pass=3 ...]`` per check, and the
    reason of one that did not pass, every line of it."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self.counts = {o: 0 for o in Outcome}
        self.stream = stream or sys.stdout

    def __call__(self, result: CheckResult) -> None:
        self.done += 1
        self.counts[result.outcome] += 1
        width = len(str(self.total))
        running = " ".join(f"{o.value}={n}" for o, n in self.counts.items() if n)
        line = (f"[{self.done:>{width}}/{self.total}] {result.outcome.label:<11} "
                f"{result.duration_s:7.2f}s  {result.key}  [{running}]")
        if result.pool_start_s:
            line += f"  (+{result.pool_start_s:.1f}s pool start)"
        if result.outcome is not Outcome.PASS and result.reason.strip():
            line += "\n" + textwrap.indent(result.reason.strip(), " " * (2 * width + 4))
        print(line, file=self.stream, flush=True)


def summary(report: RunReport) -> str:
    """The end-of-run text: header, per-area table, non-passing checks, verdict."""
    cols = [o.value for o in ORDER] + ["total"]
    header = ["area"] + cols + ["time"]
    rows = []
    for area, results in report.by_area().items():
        counts = report.counts(results)
        rows.append([area] + [str(counts[c]) for c in cols]
                    + [f"{sum(r.duration_s for r in results):.1f}s"])
    counts = report.counts()
    rows.append(["TOTAL"] + [str(counts[c]) for c in cols] + [f"{report.duration_s:.1f}s"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    spec = report.spec
    lines = [f"accelkit conformance: backend {spec.name} (device {spec.device_type}, "
             f"{spec.process_group_backend}); {versions_text(report)}"]
    if len(report.rank_hosts()) > 1:
        lines.append(f"{len(report.rank_hosts())} hosts: {hosts_text(report)}")
    if report.settings:
        lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in report.settings.items()))
    lines.append("")
    if report.error:
        lines += ["ERROR: no check could run:", textwrap.indent(report.error, "  "), ""]
    if report.unavailable:
        lines += [f"UNAVAILABLE: backend {spec.name!r} cannot run here: {report.unavailable}", ""]
    if report.results:
        lines += [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows[:-1]]
        lines += [fmt(["-" * w for w in widths]), fmt(rows[-1])]
    if report.pool_starts:
        starts = ", ".join(f"{s['world_size']} {'simulated ' if s.get('simulated') else ''}"
                           f"ranks {s['seconds']:.1f}s ({s['why']})" for s in report.pool_starts)
        lines += ["", f"pool start-ups: {starts}"]
    if report.simulated_world_sizes:
        simulated = sorted({r.id for r in report.results if r.simulated})
        lines += ["", f"simulated (one process, torch's fake process group): {len(simulated)} "
                      f"check(s) at {', '.join(map(str, report.simulated_world_sizes))} ranks; "
                      "real processes: "
                      f"{', '.join(map(str, report.world_sizes)) or 'none'}"]
    if report.left_out:
        lines += ["", f"left out: {left_out_text(report)}"]
    listed = [r for o in NOT_PASSING for r in report.results if r.outcome is o]
    if listed:
        lines += ["", "not passing:"]
        for r in listed:
            reason = r.reason.strip().splitlines() or [""]
            lines.append(f"  {r.outcome.label:<11} {r.key}: {reason[0]}")
            lines += [f"{'':14}{line}" for line in reason[1:]]
    failed = report.failed()
    lines.append("")
    if report.aborted:
        lines.append(f"ABORTED: {report.aborted}")
    if report.error:
        lines.append("FAILED: the checks could not be loaded")
    elif failed:
        lines.append(f"FAILED: {len(failed)} check(s) did not pass")
    elif report.unavailable:
        lines.append("NOT RUN: backend unavailable (exit 0; --require-available makes it exit 3)")
    elif report.nothing_ran():
        lines.append(f"FAILED: no check ran ({len(report.results)} planned, all skipped: see "
                     "the reasons above)")
    elif not report.aborted:
        lines.append("OK")
    return "\n".join(lines)
