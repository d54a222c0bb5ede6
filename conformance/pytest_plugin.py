"""pytest plugin (entry point ``pytest11: accelkit``): ``pytest --accelkit-backend NAME`` adds
every planned conformance check as a pytest item, so a vendor's pytest/CI setup runs them and
gets pytest's own reports (``--junitxml``, ``-k``, ``-x``...).

Without ``--accelkit-backend`` the plugin only declares its options (the same as
``accelkit conformance``'s, prefixed ``--accelkit-``: :mod:`~accelkit.conformance.engine.options`):
nothing is imported and no item is added, so ordinary pytest runs are unaffected. With it, the
plan is :func:`accelkit.conformance.engine.plan.make_plan`'s, executed by the pool engine's
:class:`~accelkit.conformance.engine.runner.Runner`: items are ordered by world size, one worker pool
per world size is shared by its items and torn down at the end of the session (or when the
next world size starts). An item's node id is ``accelkit/conformance/<area>::<name>@N``, so
pytest's JUnit names it like ``accelkit conformance`` does (``classname``
``accelkit.conformance.<area>``, ``name`` ``<name>@N``). Each item's result is the engine's
(:func:`accelkit.conformance.engine.verdict.verdict`, expectations applied), mapped to pytest's
outcome without judging it again: FAIL, ERROR, TIMEOUT and CRASH fail the item with the
per-rank details; SKIP and UNAVAILABLE skip it with the reason; XFAIL is pytest's xfailed,
XPASS its xpassed (failed under ``--accelkit-strict``). ``--accelkit-report-dir`` also writes accelkit's own reports. A
session whose accelkit items all SKIPped fails (exit 1), as ``accelkit conformance`` does.
"""

from __future__ import annotations

import pytest
from accelkit.conformance.engine import options as options_mod


def pytest_addoption(parser: pytest.Parser) -> None:
    options_mod.add_to_pytest(parser)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("accelkit_backend"):
        config.pluginmanager.register(_Conformance(config), "accelkit-conformance")


class CheckDidNotPass(Exception):
    """Raised by an item whose check FAILED, ERRORED, TIMED OUT or CRASHED."""

    def __init__(self, result) -> None:
        super().__init__(result.reason)
        self.result = result


class CheckItem(pytest.Item):
    """One planned step (a check on its world size), run on the shared pool of that size."""

    def __init__(self, *, step, plugin, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step = step
        self.plugin = plugin
        self.xpassed: str | None = None  # the reason, for pytest_runtest_makereport

    def runtest(self) -> None:
        from accelkit.conformance.outcomes import Outcome

        result = self.plugin.runner.run_step(self.step)
        outcome = result.outcome
        if outcome in (Outcome.SKIP, Outcome.UNAVAILABLE):
            pytest.skip(f"{outcome.label}: {result.reason}")
        if outcome is Outcome.XFAIL:
            pytest.xfail(result.reason)
        if outcome is Outcome.XPASS and not self.plugin.options.strict:
            self.xpassed = result.reason
        elif outcome is not Outcome.PASS:
            raise CheckDidNotPass(result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckDidNotPass):
            r = excinfo.value.result
            parts = [f"{r.outcome.label}: {r.id} on {r.world_size} ranks", r.reason]
            for rank in r.ranks:
                if rank.status not in ("pass", "skip"):
                    parts.append(f"--- rank {rank.rank} ({rank.status}) ---\n"
                                 f"{rank.traceback or rank.message}{rank.log_tail}")
            return "\n".join(parts)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, self.nodeid


class _Conformance:
    """Registered only when ``--accelkit-backend`` is given."""

    def __init__(self, config: pytest.Config) -> None:
        from accelkit.conformance.engine.runner import Runner, plan_session
        from accelkit.conformance.engine.session import UsageError, resolve

        try:
            session = resolve(options_mod.from_pytest(config))
        except UsageError as exc:
            raise pytest.UsageError(f"accelkit: {exc}") from None
        self.options = session.options
        self.plan, report = plan_session(session)
        report.mode = "pytest"
        self.runner = Runner(session.spec, self.options, report=report, ops=session.ops)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config, items) -> None:
        added = []
        for step in self.plan.steps:
            check = step.check
            item = CheckItem.from_parent(
                session, name=f"{check.name}@{check.world_size}",
                nodeid=f"accelkit/conformance/{check.area}::{check.name}@{check.world_size}",
                step=step, plugin=self)
            added.append(item)
        items.extend(added)
        # count them like collected files' items (the terminal's "N tests collected")
        config.hook.pytest_collectreport(report=pytest.CollectReport(
            "accelkit", "passed", None, result=added))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """An XPASS is reported as pytest reports an xfail-marked test that passed."""
        report = (yield).get_result()
        if isinstance(item, CheckItem) and call.when == "call" and item.xpassed is not None:
            report.outcome, report.wasxfail = "passed", item.xpassed

    def pytest_sessionfinish(self, session) -> None:
        from accelkit.conformance.reports import files as reports

        self.runner.close()
        report = self.runner.report
        if report.results and report.nothing_ran() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"accelkit: no check ran ({len(report.results)} run, all "
                                    "skipped): the session fails", red=True)
        if self.options.report_dir and report.results:
            reports.write(report, self.options.report_dir)
