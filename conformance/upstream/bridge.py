"""The one place ``accelkit upstream`` depends on the conformance suite's report model: an
upstream report as a :class:`~accelkit.conformance.model.RunReport` of
:class:`~accelkit.conformance.outcomes.CheckResult`, so that ``junit.xml`` comes from the
suite's own writer (:func:`accelkit.conformance.reports.files.to_junit`, with the versions and the
backend's settings as suite properties) and the Markdown uses the suite's outcome marks. Each
upstream file becomes a report area (one JUnit ``testsuite``), each test
``<file area>.<Class>::<test>`` with no world size of its own (a test makes its own groups).
``report.json`` and ``report.md`` stay the upstream report's own
(:mod:`accelkit.conformance.upstream.report`).
"""

from __future__ import annotations

from pathlib import Path

from accelkit.conformance.engine.options import Options
from accelkit.conformance.model import RunReport
from accelkit.conformance.outcomes import CheckResult, Outcome
from accelkit.conformance.reports import files as reports
from accelkit.conformance.upstream.report import UpstreamReport
from accelkit.conformance.upstream.runner import slug

_OUTCOME = {"pass": Outcome.PASS, "fail": Outcome.FAIL, "error": Outcome.ERROR,
            "timeout": Outcome.TIMEOUT, "crash": Outcome.CRASH, "skip": Outcome.SKIP,
            "xfail": Outcome.XFAIL, "xpass": Outcome.XPASS,
            "not-run": Outcome.SKIP}  # JUnit: skipped, with the reason it never started


def mark(outcome: str) -> str:
    """The suite's label for an outcome (``✅ pass``, ``❌ FAIL``...)."""
    return reports._MARK[_OUTCOME[outcome]]


def to_run_report(report: UpstreamReport) -> RunReport:
    run = RunReport.start(report.spec, Options(backend=report.spec.name, strict=report.strict),
                          started=report.started, duration_s=report.duration_s,
                          host=report.host)
    for t in report.tests:
        rest = t.nodeid.split("::", 1)[1] if "::" in t.nodeid else t.name
        reason = t.reason + (f"\n\n{t.details}" if t.details else "")
        run.results.append(CheckResult(
            id=f"{slug(t.file)}.{rest}", world_size=None, outcome=_OUTCOME[t.outcome],
            reason=reason, duration_s=t.duration_s, expectation=t.expectation))
    return run


def write_junit(report: UpstreamReport, path: Path) -> None:
    reports.to_junit(to_run_report(report)).write(path, encoding="utf-8", xml_declaration=True)
