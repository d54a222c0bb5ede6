"""The pool engine: runs a :class:`~accelkit.conformance.engine.plan.Plan` on worker pools; each
check's result is decided from its ranks' answers by :func:`accelkit.conformance.engine.verdict.verdict`.

A step the plan decided (UNAVAILABLE, SKIP) is recorded as it is. Otherwise the check runs on
the pool of its world size (one pool alive at a time), which returns the ranks' answers; every check of a world size whose pool cannot
start is ERROR with the start-up error (the pool is not retried, and a failed
``spec.prepare()`` is not retried for any size). A TIMEOUT or CRASH tears the pool down and the
next check gets a new one. After a check whose ranks disagreed (some passed, some failed), a
barrier makes sure their collectives are still in step, else the pool is rebuilt.

Fail fast: when the pool crashes on :data:`CRASH_STORM` consecutive checks of an area (a
port's broken primitive, e.g. a ``synchronize()`` that does not wait, crashes check after
check, and each crash costs a pool restart), the area's remaining checks are not run: each is
ERROR with one message naming the crashes, the first one's output and ``--keep-going``, which
runs them all. A check's ``duration_s`` excludes the pool (re)start and ``spec.prepare()`` (the
backend's C++ build) before it; both are in its ``pool_start_s`` and in the report's
``pool_starts`` (``seconds``, ``prepare_s``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from accelkit.conformance.api import CheckDef
from accelkit.conformance.engine.expectations import OpExpectation
from accelkit.conformance.engine.options import Options
from accelkit.conformance.engine.plan import Plan, Step, make_plan, probe_host
from accelkit.conformance.engine.session import Session
from accelkit.conformance.engine.verdict import verdict
from accelkit.conformance.launchers.pool import Pool, PoolStartError
from accelkit.conformance.model import RunReport
from accelkit.conformance.outcomes import CheckResult, Outcome, RankResult
from accelkit.core.spec import BackendSpec

#: Consecutive crashes of the pool in one area after which the area's other checks do not run.
CRASH_STORM = 3


class Runner:
    """Runs steps for one backend, one pool (world size) at a time. Use as a context manager
    or call :meth:`close` so the last pool is torn down."""

    def __init__(self, spec: BackendSpec, options: Options,
                 progress: Callable[[CheckResult], None] | None = None,
                 report: RunReport | None = None,
                 ops: Mapping[str, OpExpectation] | None = None) -> None:
        self.spec = spec
        self.options = options
        self.progress = progress
        self.report = report if report is not None else RunReport.start(spec, options)
        self._pool: Pool | None = None
        self._start_errors: dict[tuple[int, bool], str] = {}  # (world size, simulated)
        self._pending_rebuild = ""
        self._started: set[tuple[int, bool]] = set()
        self._prepared = False
        self._prepare_error: str | None = None
        self._prepare_s = 0.0
        self._crashes: dict[str, list[CheckResult]] = {}  # area -> its latest crashes in a row
        self._stopped: dict[str, str] = {}  # area -> why its other checks do not run
        self.ops = dict(ops or {})  # the expectations file's [ops] entries (the session's)

    # -- pools ------------------------------------------------------------------------------
    def _pool_for(self, world_size: int, simulated: bool = False) -> Pool:
        """The pool of ``world_size`` ranks, or for ``simulated``, the one worker that runs
        checks on a fake group of ``world_size`` ranks."""
        simulate = world_size if simulated else None
        procs = 1 if simulated else world_size
        if (self._pool is not None and self._pool.alive and self._pool.world_size == procs
                and self._pool.simulate == simulate):
            return self._pool
        if self._pool is not None:
            self._pool.close()
        why = self._pending_rebuild if (world_size, simulated) in self._started else "first start"
        self._pool = None
        try:
            prepare_s = self._prepare()
            pool = Pool(self.spec.name, procs, modules=self.options.modules,
                        builtin=self.options.builtin, memory_limit_mb=self.options.memory_limit_mb,
                        simulate=simulate)
        except PoolStartError as exc:
            self._start_errors[world_size, simulated] = str(exc)
            raise
        self._pool = pool
        self._started.add((world_size, simulated))
        self.report.device = self.report.device or pool.device
        self.report.pool_starts.append({"world_size": world_size, "seconds": round(pool.startup_s, 3),
                                        "prepare_s": prepare_s, "why": why,
                                        "pids": [p.pid for p in pool.procs],
                                        "simulated": simulated})
        return pool

    def _prepare(self) -> float:
        """Run ``spec.prepare()`` (e.g. compile the backend's C++) once, here, before any rank
        starts, so ranks do not all wait on one compile inside their start-up budget; returns
        the seconds it took this time (0 once done). A failure (even a build tool's
        ``SystemExit``) is kept and raised again for every later pool: the compile is not
        retried per check."""
        if self._prepare_error is not None:
            raise PoolStartError(self._prepare_error)
        if self._prepared or self.spec.prepare is None:
            return 0.0
        self._prepared = True
        started = time.perf_counter()
        try:
            self.spec.prepare()
        except (Exception, SystemExit) as exc:
            self._prepare_error = (f"backend {self.spec.name!r}: prepare() failed: "
                                   f"{type(exc).__name__}: {exc}")
            raise PoolStartError(self._prepare_error) from exc
        finally:
            self._prepare_s = round(time.perf_counter() - started, 3)
        return self._prepare_s

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- steps ------------------------------------------------------------------------------
    def budget(self, check: CheckDef) -> float:
        """Seconds ``check`` may take: its own ``timeout=`` if set, else ``--timeout``."""
        return check.timeout if check.timeout is not None else self.options.timeout_s

    def _decide(self, step: Step) -> tuple[Outcome, str] | None:
        """Why ``step`` does not run (the plan's decision, or its pool's start-up error)."""
        if step.decided is not None:
            return step.decided
        ws = step.check.world_size
        if step.check.area in self._stopped:
            return Outcome.ERROR, self._stopped[step.check.area]
        error = self._start_errors.get((ws, step.check.simulated))
        if error is not None:
            return Outcome.ERROR, f"worker pool of {ws} ranks failed to start: {error}"
        return None

    def run_step(self, step: Step) -> CheckResult:
        """Run one step (or record why it does not run) and report the result."""
        check = step.check
        started = time.perf_counter()
        starts = len(self.report.pool_starts)
        decided = self._decide(step)
        ran = decided is None
        ranks = None
        if ran:
            ranks, decided = self._execute(check)
        result = self.judge(step, ranks, decided)
        if ran:
            self._watch_crashes(result)
        result.pool_start_s = round(sum(s["seconds"] + s.get("prepare_s", 0.0)
                                        for s in self.report.pool_starts[starts:]), 3)
        result.duration_s = round(time.perf_counter() - started - result.pool_start_s, 4)
        self.record(result)
        return result

    def judge(self, step: Step, ranks: list[RankResult] | None,
              decided: tuple[Outcome, str] | None = None) -> CheckResult:
        """``step``'s result: :func:`~accelkit.conformance.engine.verdict.verdict` with this run's
        expectations and ``--strict``."""
        return verdict(step.check, ranks, step.expectation, decided=decided,
                       ops=self.ops, strict=self.options.strict)

    def _watch_crashes(self, result: CheckResult) -> None:
        """Count the area's crashes in a row; at :data:`CRASH_STORM` stop the area (unless
        ``--keep-going``) with one message: what crashed, the first crash's output, the fix."""
        if (result.actual or result.outcome) is not Outcome.CRASH:
            self._crashes.pop(result.area, None)
            return
        crashes = self._crashes.setdefault(result.area, [])
        crashes.append(result)
        if len(crashes) < CRASH_STORM or self.options.keep_going:
            return
        first = "\n".join(crashes[0].reason.splitlines()[:30])
        self._stopped[result.area] = (
            f"not run: the rank pool crashed on {len(crashes)} consecutive checks of area "
            f"{result.area!r} ({', '.join(c.key for c in crashes)}), so its other checks were "
            "not run (each crash costs a pool restart). Fix the crash first; "
            "`accelkit conformance --keep-going` runs them all. The first crash, "
            f"{crashes[0].key}:\n{first}")

    def record(self, result: CheckResult) -> None:
        """Add ``result`` to the report and show progress."""
        self.report.results.append(result)
        if self.progress is not None:
            self.progress(result)

    def _execute(self, check: CheckDef) -> tuple[list[RankResult] | None, tuple[Outcome, str] | None]:
        """Run ``check`` on the pool of its world size: the ranks' answers, or, when the pool
        could not start, why the check did not run."""
        try:
            pool = self._pool_for(check.world_size, check.simulated)
        except PoolStartError as exc:
            return None, (Outcome.ERROR, f"worker pool of {check.world_size} ranks failed to "
                                         f"start: {exc}")
        ranks, torn_down = pool.run(check.id, self.budget(check))
        if torn_down:
            self._pending_rebuild = f"after {torn_down} in {check.id}"
        elif len({r.status for r in ranks}) > 1 and not pool.sync():
            self._pending_rebuild = f"ranks out of step after {check.id}"
        return ranks, None

    def run(self, plan: Plan) -> RunReport:
        """Run every step of ``plan`` in order; the last pool is closed at the end."""
        started = time.perf_counter()
        self.report.left_out = list(plan.left_out)
        try:
            for step in plan.steps:
                self.run_step(step)
        except BaseException:  # Ctrl-C: no polite goodbye to ranks that may be mid-check
            if self._pool is not None:
                self._pool.close(graceful=False)
            raise
        finally:
            self.close()
            self.report.duration_s = round(time.perf_counter() - started, 3)
        return self.report


def plan_session(session: Session) -> tuple[Plan, RunReport]:
    """Probe the host, plan the session's checks, and start its report."""
    host = probe_host(session.spec, session.selected, session.options.world_sizes)
    plan = make_plan(session.selected, session.expectations, host, session.options.world_sizes,
                     session.options.areas)
    report = RunReport.start(session.spec, session.options, unavailable=host.unavailable)
    report.left_out = list(plan.left_out)
    return plan, report
