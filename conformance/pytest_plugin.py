"""pytest plugin (entry point ``pytest11: accelkit``): ``pytest --accelkit-backend NAME`` adds
every selected conformance check as a pytest item, so a vendor's pytest/CI setup runs them and
gets pytest's own reports (``--junitxml``, ``-k``, ``-x``...). Issue #3.

Without ``--accelkit-backend`` the plugin only declares its options: nothing is imported and
no item is added, so ordinary pytest runs are unaffected. With it, items are named
``accelkit::<check id>`` (the JUnit test name is the check id), ordered by world size; one worker pool per world size is shared by
its items and torn down at the end of the session (or when the next world size starts).
Expectations become pytest markers: ``xfail`` -> ``pytest.mark.xfail(strict=--accelkit-strict)``,
``skip`` -> ``pytest.mark.skip``. FAIL, ERROR, TIMEOUT and CRASH fail the item with the per-rank
details; SKIP and UNAVAILABLE skip it with the reason.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("accelkit", "accelkit conformance checks")
    group.addoption("--accelkit-backend", metavar="NAME",
                    help="run the accelkit conformance checks on backend NAME as pytest items")
    group.addoption("--accelkit-area", action="append", default=[], metavar="AREA",
                    help="only checks of this area (repeatable)")
    group.addoption("--accelkit-world-size", type=int, metavar="N",
                    help="only checks written for N ranks")
    group.addoption("--accelkit-checks-module", action="append", default=[], metavar="MODULE",
                    help="also load checks from this module (dotted name or .py path)")
    group.addoption("--accelkit-no-builtin-checks", action="store_true",
                    help="do not load the built-in catalogue")
    group.addoption("--accelkit-timeout", type=float, default=60.0, metavar="S",
                    help="per-check budget in seconds (default 60)")
    group.addoption("--accelkit-expectations", metavar="FILE",
                    help="expectations TOML to use instead of the backend's own")
    group.addoption("--accelkit-strict", action="store_true",
                    help="an unexpected pass of an xfail expectation fails the item")
    group.addoption("--accelkit-memory-limit", type=int, metavar="MIB",
                    help="per-rank RLIMIT_DATA growth allowed, in MiB")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("accelkit_backend"):
        config.pluginmanager.register(_Conformance(config), "accelkit-conformance")


class CheckDidNotPass(Exception):
    """Raised by an item whose check FAILED, ERRORED, TIMED OUT or CRASHED."""

    def __init__(self, result) -> None:
        super().__init__(result.reason)
        self.result = result


class CheckItem(pytest.Item):
    """One conformance check run on the shared pool of its world size."""

    def __init__(self, *, check, plugin, **kwargs) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.plugin = plugin

    def runtest(self) -> None:
        from accelkit.conformance.outcomes import Outcome

        result = self.plugin.runner().run_check(self.check)
        if result.outcome in (Outcome.SKIP, Outcome.UNAVAILABLE):
            pytest.skip(f"{result.outcome.label}: {result.reason}")
        if result.outcome is not Outcome.PASS:
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
        return self.path, None, f"accelkit::{self.check.id}"


class _Conformance:
    """Registered only when ``--accelkit-backend`` is given."""

    def __init__(self, config: pytest.Config) -> None:
        import argparse

        from accelkit.conformance import cli

        args = argparse.Namespace(
            backend=config.getoption("accelkit_backend"),
            area=config.getoption("accelkit_area"), patterns=[],
            timeout=config.getoption("accelkit_timeout"),
            expectations=config.getoption("accelkit_expectations"),
            strict=config.getoption("accelkit_strict"),
            modules=config.getoption("accelkit_checks_module"),
            builtin=not config.getoption("accelkit_no_builtin_checks"),
            memory_limit_mb=config.getoption("accelkit_memory_limit"))
        try:
            self.spec, self.options, self.selected, self.expectations = cli.resolve(
                args, config.getoption("accelkit_world_size"))
        except cli.UsageError as exc:
            raise pytest.UsageError(f"accelkit: {exc}") from None
        self._runner = None

    def runner(self):
        if self._runner is None:
            from accelkit.conformance.runner import Runner

            # expectations are applied by pytest's own xfail/skip markers
            self._runner = Runner(self.spec, self.options)
        return self._runner

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config, items) -> None:
        from accelkit.conformance.expectations import lookup

        added = []
        for check in self.selected:
            item = CheckItem.from_parent(session, name=check.id, nodeid=f"accelkit::{check.id}",
                                         check=check, plugin=self)
            exp = lookup(self.expectations, check.id, check.world_size)
            if exp is not None and exp.status == "xfail":
                item.add_marker(pytest.mark.xfail(reason=exp.reason, strict=self.options.strict))
            elif exp is not None:
                item.add_marker(pytest.mark.skip(reason=f"expected skip: {exp.reason}"))
            added.append(item)
        items.extend(added)
        # count them like collected files' items (the terminal's "N tests collected")
        config.hook.pytest_collectreport(report=pytest.CollectReport(
            "accelkit", "passed", None, result=added))

    def pytest_sessionfinish(self, session) -> None:
        if self._runner is not None:
            self._runner.close()
