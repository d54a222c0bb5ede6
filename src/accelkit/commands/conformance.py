"""``accelkit conformance``: run the conformance suite on a backend.

Exit codes: 0 when nothing FAILED, ERRORED, TIMED OUT or CRASHED (and, under ``--strict``,
nothing XPASSED) and some check ran; 1 otherwise (also when every check was SKIPped, and after Ctrl-C: the checks run so far are summarised and
reported); 2 for a usage error (unknown backend or area, malformed expectations, nothing
selected) and when the checks cannot be imported (a check module, or the backend's own
extension that torch loads at import; the reports are still written, with the exception);
3 when the backend is unavailable here and ``--require-available`` was given. Without that
flag an unavailable backend exits 0: every check is reported UNAVAILABLE with the reason, so a
CI matrix can list backends that only some runners have.
"""

from __future__ import annotations

import argparse
import sys

from accelkit.conformance.engine import options as options_mod
from accelkit.conformance.engine.options import Options
from accelkit.conformance.engine.plan import Plan
from accelkit.conformance.engine.session import LoadError, UsageError, resolve
from accelkit.conformance.model import RunReport, describe_exception

EXIT_LOAD_ERROR = 2


EPILOG = """\
expectations file (--expectations, or the backend's own), TOML:
  [checks."area.name"]          # "area.name@N": its run on N ranks only (wins)
  status = "xfail"              # or "skip" (does not run: only for crashes and hangs)
  reason = "why"                # required
  link = "https://..."          # optional
  torch = ">=2.13,<2.15"        # optional: the torch versions it applies to

exit status: 0 conformant (or unavailable without --require-available); 1 a check failed,
errored, timed out or crashed (or XPASS under --strict), or no check ran (all skipped); 2 usage error, or the checks could
not be imported (reports still written); 3 unavailable with --require-available.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options_mod.add_to_parser(parser, options_mod.CLI)
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def load_failure(exc: LoadError, options: Options, mode: str) -> RunReport:
    """The report of a run whose checks could not be imported: the error and the whole
    exception behind it (for a backend whose extension fails when torch loads it, torch's
    "Failed to load the backend extension" and the backend's own error under it)."""
    return RunReport.start(exc.spec, options, mode=mode,
                           error=f"{exc}\n\n{describe_exception(exc.cause)}")


def finish(report: RunReport, options: Options) -> None:
    """Print the summary and write the report files (``--report-dir``)."""
    from accelkit.conformance.reports import files as reports
    from accelkit.conformance.reports import terminal

    print()
    print(terminal.summary(report))
    if options.report_dir:
        for path in reports.write(report, options.report_dir):
            print(f"wrote {path}")


def _print_list(plan: Plan) -> None:
    for step in plan.steps:
        c = step.check
        doc = c.doc.strip().splitlines()[0] if c.doc.strip() else ""
        extra = f" requires={','.join(c.requires)}" if c.requires else ""
        exp = step.expectation
        note = f"  [expected {exp.status}: {exp.reason}]" if exp else ""
        sizes = f" (also {','.join(map(str, c.also_at))})" if c.also_at else ""
        print(f"{c.id}  ws={c.world_size}{sizes}{extra}  {doc}{note}")
    print(f"{len(plan.steps)} check(s)")
    for left in plan.left_out:
        print(f"left out: {left.id} (written for {', '.join(map(str, left.world_sizes))})")


def run(args: argparse.Namespace) -> int:
    from accelkit.conformance.engine.runner import Runner, plan_session
    from accelkit.conformance.reports import terminal

    options = options_mod.from_namespace(args, options_mod.CLI)
    try:
        session = resolve(options)
    except LoadError as exc:
        print(f"accelkit conformance: error: {exc}", file=sys.stderr)
        finish(load_failure(exc, options, "pool"), options)
        return EXIT_LOAD_ERROR
    except UsageError as exc:
        print(f"accelkit conformance: error: {exc}", file=sys.stderr)
        return 2
    plan, report = plan_session(session)
    if options.list_only:
        _print_list(plan)
        return 0
    runner = Runner(session.spec, session.options, terminal.Progress(len(plan.steps)), report,
                    ops=session.ops)
    try:
        runner.run(plan)  # tears its pool down whatever happens
    except KeyboardInterrupt:
        report.aborted = (f"interrupted after {len(report.results)} of {len(plan.steps)} "
                          "check(s); worker pool torn down")
    finish(report, options)
    if not report.ok():
        return 1
    if report.unavailable and options.require_available:
        return 3
    return 0
