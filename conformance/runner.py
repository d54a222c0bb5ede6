"""The engine: runs selected checks on a backend through worker pools and decides each
check's outcome (issue #3).

Per check, in order: UNAVAILABLE if the backend cannot run here at all (``spec.probe(1)``);
SKIP from an expectation with ``status = "skip"``; SKIP for a capability the backend does not
declare (``spec.capabilities.missing``); SKIP when the check needs more ranks than the backend
offers (``capabilities.max_world_size`` or ``spec.probe(world_size)``, e.g. "8 devices needed,
4 present"); ERROR for every check of a world size whose pool cannot start (the start-up error
is the reason; the pool is not retried). Otherwise the check runs on the pool of its world size
(one pool alive at a time) and the per-rank results are merged
(:func:`accelkit.conformance.outcomes.merge`); a TIMEOUT or CRASH tears the pool down and the
next check gets a new one. After a check whose ranks disagreed (some passed, some failed), a
barrier makes sure their collectives are still in step, else the pool is rebuilt. Last, an
``xfail`` expectation turns a failing outcome into XFAIL and a pass into XPASS.
"""

from __future__ import annotations

import datetime
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

from accelkit.conformance.api import CheckDef
from accelkit.conformance.expectations import Expectation, lookup
from accelkit.conformance.outcomes import FAILING, CheckResult, Outcome, merge
from accelkit.conformance.pool import Pool, PoolStartError
from accelkit.core.spec import BackendSpec

DEFAULT_TIMEOUT_S = 60.0


def torch_version() -> str:
    """The installed torch's version, without importing torch."""
    return metadata.version("torch")


@dataclass
class RunOptions:
    """Everything that shapes a run, as given on the command line."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    strict: bool = False
    modules: list[str] = field(default_factory=list)
    builtin: bool = True
    memory_limit_mb: int | None = None
    expectations_path: str | None = None


@dataclass
class RunReport:
    """A finished (or interrupted) run: what every report is written from."""

    spec: BackendSpec
    options: RunOptions
    results: list[CheckResult] = field(default_factory=list)
    device: dict = field(default_factory=dict)
    torch: str = ""
    started: str = ""
    duration_s: float = 0.0
    pool_starts: list[dict] = field(default_factory=list)
    unavailable: str | None = None
    aborted: str | None = None  # torchrun mode: why the run stopped early
    mode: str = "pool"          # "pool" (accelkit conformance) or "torchrun"
    host: str = field(default_factory=platform.node)

    @property
    def world_sizes(self) -> list[int]:
        return sorted({r.world_size for r in self.results})

    def counts(self, results: list[CheckResult] | None = None) -> dict[str, int]:
        counts = {o.value: 0 for o in Outcome}
        for r in self.results if results is None else results:
            counts[r.outcome.value] += 1
        counts["total"] = len(self.results if results is None else results)
        return counts

    def by_area(self) -> dict[str, list[CheckResult]]:
        areas: dict[str, list[CheckResult]] = {}
        for r in self.results:
            areas.setdefault(r.area, []).append(r)
        return areas

    def failed(self) -> list[CheckResult]:
        """The results that make the run fail (and the exit code non-zero)."""
        bad = set(FAILING) | ({Outcome.XPASS} if self.options.strict else set())
        return [r for r in self.results if r.outcome in bad]

    def ok(self) -> bool:
        """Whether the run passes (exit code 0)."""
        return not self.failed() and self.aborted is None


class Runner:
    """Runs checks for one backend, one pool (world size) at a time. Use as a context manager
    or call :meth:`close` so the last pool is torn down."""

    def __init__(self, spec: BackendSpec, options: RunOptions,
                 expectations: dict[str, Expectation] | None = None,
                 progress: Callable[[CheckResult], None] | None = None) -> None:
        self.spec = spec
        self.options = options
        self.expectations = expectations or {}
        self.progress = progress
        self.report = RunReport(spec=spec, options=options, torch=torch_version(),
                                started=datetime.datetime.now(datetime.timezone.utc)
                                .isoformat(timespec="seconds"))
        self._pool: Pool | None = None
        self._start_errors: dict[int, str] = {}
        self._probes: dict[int, tuple[bool, str]] = {}
        self._pending_rebuild = ""
        self._started: set[int] = set()
        self._prepared = False
        self._prepare_error: str | None = None
        self.report.unavailable = self._unavailable()

    def _unavailable(self) -> str | None:
        ok, reason = self._probe(1)
        return None if ok else reason

    def _probe(self, world_size: int) -> tuple[bool, str]:
        if world_size not in self._probes:
            try:
                self._probes[world_size] = self.spec.probe(world_size)
            except Exception as exc:  # a probe that raises means "cannot run here"
                self._probes[world_size] = (False, f"probe failed: {type(exc).__name__}: {exc}")
        return self._probes[world_size]

    # -- pools ------------------------------------------------------------------------------
    def _pool_for(self, world_size: int) -> Pool:
        if self._pool is not None and self._pool.alive and self._pool.world_size == world_size:
            return self._pool
        if self._pool is not None:
            self._pool.close()
        why = self._pending_rebuild if world_size in self._started else "first start"
        self._pool = None
        try:
            self._prepare()
            pool = Pool(self.spec.name, world_size, modules=self.options.modules,
                        builtin=self.options.builtin, memory_limit_mb=self.options.memory_limit_mb)
        except PoolStartError as exc:
            self._start_errors[world_size] = str(exc)
            raise
        self._pool = pool
        self._started.add(world_size)
        self.report.device = self.report.device or pool.device
        self.report.pool_starts.append({"world_size": world_size, "seconds": round(pool.startup_s, 3),
                                        "why": why, "pids": [p.pid for p in pool.procs]})
        return pool

    def _prepare(self) -> None:
        """Run ``spec.prepare()`` (e.g. compile the backend's C++) once, here, before any rank
        starts, so ranks do not all wait on one compile inside their start-up budget. A
        failure (even a build tool's ``SystemExit``) is kept and raised again for every later
        pool: the compile is not retried per check."""
        if self._prepare_error is not None:
            raise PoolStartError(self._prepare_error)
        if self._prepared or self.spec.prepare is None:
            return
        self._prepared = True
        try:
            self.spec.prepare()
        except (Exception, SystemExit) as exc:
            self._prepare_error = (f"backend {self.spec.name!r}: prepare() failed: "
                                   f"{type(exc).__name__}: {exc}")
            raise PoolStartError(self._prepare_error) from exc

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checks -----------------------------------------------------------------------------
    def _not_run(self, check: CheckDef) -> tuple[Outcome, str] | None:
        """Why ``check`` does not run (outcome and reason), or None when it runs."""
        if self.report.unavailable is not None:
            return Outcome.UNAVAILABLE, f"backend {self.spec.name!r} cannot run here: " \
                                        f"{self.report.unavailable}"
        exp = lookup(self.expectations, check.id, check.world_size)
        if exp is not None and exp.status == "skip":
            return Outcome.SKIP, f"expected skip: {exp.reason}"
        missing = self.spec.capabilities.missing(check.requires, self.spec.device_type)
        if missing:
            return Outcome.SKIP, missing
        too_big = self._world_size_problem(check.world_size)
        if too_big:
            fits = [n for n in check.also_at
                    if n < check.world_size and not self._world_size_problem(n)]
            if fits:  # a machine with fewer devices: say how to run it anyway
                too_big += f"; --world-size {max(fits)} runs it on {max(fits)} ranks"
            return Outcome.SKIP, too_big
        if check.world_size in self._start_errors:
            return Outcome.ERROR, (f"worker pool of {check.world_size} ranks failed to start: "
                                   f"{self._start_errors[check.world_size]}")
        return None

    def _world_size_problem(self, world_size: int) -> str | None:
        """Why this host cannot run ``world_size`` ranks of the backend, or None."""
        most = self.spec.capabilities.max_world_size
        if most is not None and world_size > most:
            return f"{world_size} devices needed, {most} present"
        ok, reason = self._probe(world_size)
        return None if ok else reason

    def run_check(self, check: CheckDef) -> CheckResult:
        """Run one check (or decide it cannot run) and record the result."""
        started = time.perf_counter()
        starts = len(self.report.pool_starts)
        decided = self._decide(check)
        if decided is not None:
            result = CheckResult(check.id, check.world_size, decided[0], decided[1])
        else:
            result = self._execute(check)
        result.pool_start_s = round(sum(s["seconds"] for s in self.report.pool_starts[starts:]), 3)
        result.duration_s = round(time.perf_counter() - started - result.pool_start_s, 4)
        self._apply_expectation(result)
        self.report.results.append(result)
        if self.progress is not None:
            self.progress(result)
        return result

    def budget(self, check: CheckDef) -> float:
        """Seconds ``check`` may take: its own ``timeout=`` if set, else ``--timeout``."""
        return check.timeout if check.timeout is not None else self.options.timeout_s

    def _decide(self, check: CheckDef) -> tuple[Outcome, str] | None:
        return self._not_run(check)

    def _execute(self, check: CheckDef) -> CheckResult:
        """Run ``check`` on the pool of its world size and merge the ranks' results."""
        try:
            pool = self._pool_for(check.world_size)
        except PoolStartError as exc:
            return CheckResult(check.id, check.world_size, Outcome.ERROR,
                               f"worker pool of {check.world_size} ranks failed to start: {exc}")
        ranks, torn_down = pool.run(check.id, self.budget(check))
        outcome, reason = merge(ranks)
        if torn_down:
            self._pending_rebuild = f"after {torn_down} in {check.id}"
        elif len({r.status for r in ranks}) > 1 and not pool.sync():
            self._pending_rebuild = f"ranks out of step after {check.id}"
        return CheckResult(check.id, check.world_size, outcome, reason, ranks=ranks)

    def _apply_expectation(self, result: CheckResult) -> None:
        exp = lookup(self.expectations, result.id, result.world_size)
        if exp is None:
            return
        result.expectation = exp.to_dict()
        if exp.status != "xfail":
            return
        if result.outcome in FAILING:
            result.actual = result.outcome
            result.outcome = Outcome.XFAIL
            result.reason = f"expected failure: {exp.reason}\n" \
                            f"actual {result.actual.label}: {result.reason}"
        elif result.outcome is Outcome.PASS:
            result.actual = result.outcome
            result.outcome = Outcome.XPASS
            result.reason = f"passed, but expected to fail: {exp.reason} " \
                            "(remove the expectation)"

    def run(self, checks: list[CheckDef]) -> RunReport:
        """Run ``checks`` in order; the pool of the last world size is closed at the end."""
        started = time.perf_counter()
        try:
            for check in checks:
                self.run_check(check)
        except BaseException:  # Ctrl-C: no polite goodbye to ranks that may be mid-check
            if self._pool is not None:
                self._pool.close(graceful=False)
            raise
        finally:
            self.close()
            self.report.duration_s = round(time.perf_counter() - started, 3)
        return self.report

