"""Benchmark of the conformance engine, on the ``cpu`` backend (gloo):

1. pool start-up at world size 4 (spawn 4 interpreters, import torch, init the process group);
2. per-check overhead: wall time of ``Runner.run_step`` for a check that does nothing
   (dispatch, clean-state reset, result collection, merge), median over ``--checks`` runs
   (target: <= 30 ms);
3. the starter checks (the catalogue's 4-rank checks for cpu, ``--area`` to narrow) in one
   ``accelkit conformance`` run, wall time, versus spawning a fresh 4-rank process group per
   check for the same checks (same run; ratio).

    python bench/engine.py [--checks 200] [--area collectives] [--timeout 30] [--limit N]

Numbers are recorded in bench/README.md ("Conformance engine"). This file is also the check
module that defines ``bench.noop`` (loaded by the workers by path).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from accelkit.conformance.api import Defaults, check

HERE = str(Path(__file__).resolve())

CHECK_DEFAULTS = Defaults(area="bench")


@check
def noop(ctx):
    """Does nothing: what is left of a check's wall time is the engine's overhead."""


def _pool_startup(repeat: int) -> list[float]:
    from accelkit.conformance.launchers.pool import Pool

    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        pool = Pool("cpu", 4, modules=[HERE], builtin=False)
        times.append(time.perf_counter() - started)
        pool.close()
    return times


def _overhead(count: int) -> list[float]:
    from accelkit.conformance.api import CHECKS
    from accelkit.conformance.engine.options import Options
    from accelkit.conformance.engine.plan import Step
    from accelkit.conformance.engine.runner import Runner
    from accelkit.core import registry

    step = Step(CHECKS["bench.noop"])
    with Runner(registry.get("cpu"), Options(modules=[HERE], builtin=False)) as runner:
        runner.run_step(step)  # starts the pool
        times = []
        for _ in range(count):
            started = time.perf_counter()
            result = runner.run_step(step)
            times.append(time.perf_counter() - started)
            assert result.outcome.value == "pass", result.reason
    return times


def _starter_checks(areas: list[str], limit: int | None):
    from accelkit.conformance.engine import loader

    checks = loader.load([], builtin=True)
    selected = [c.at(4) for c in loader.select(checks, areas=areas or None)
                if 4 in c.world_sizes and not c.requires]
    return selected[:limit] if limit else selected


def _one_cli_run(ids: list[str], timeout: float) -> tuple[float, str]:
    args = [sys.executable, "-m", "accelkit", "conformance", "--backend", "cpu",
            "--world-size", "4", "--timeout", str(timeout)]
    for cid in ids:
        args += ["-k", cid]
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - started
    tail = [line for line in proc.stdout.splitlines() if line.startswith("TOTAL")]
    return wall, (tail[0] if tail else proc.stderr.strip()[-300:])


def _fresh_group_per_check(selected, timeout: float) -> float:
    from accelkit.conformance.launchers.pool import Pool

    started = time.perf_counter()
    for c in selected:
        pool = Pool("cpu", 4, modules=[], builtin=True)
        pool.run(c.id, c.timeout or timeout)
        pool.close()
    return time.perf_counter() - started


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=200, help="trivial checks to time")
    parser.add_argument("--startups", type=int, default=2, help="pool start-ups to time")
    parser.add_argument("--area", action="append", default=[], help="starter-check areas")
    parser.add_argument("--timeout", type=float, default=30.0, help="per-check budget, both modes")
    parser.add_argument("--limit", type=int, help="use only the first N starter checks")
    args = parser.parse_args()

    startups = _pool_startup(args.startups)
    print(f"pool start-up, 4 ranks (cpu/gloo): {', '.join(f'{t:.2f}s' for t in startups)}; "
          f"median {statistics.median(startups):.2f}s")

    times = _overhead(args.checks)
    q = statistics.quantiles(times, n=20)
    print(f"per-check overhead, trivial check, {len(times)} runs: median {_ms(times)}, "
          f"p95 {q[-1] * 1e3:.1f} ms, min {min(times) * 1e3:.1f} ms (target <= 30 ms)")

    selected = _starter_checks(args.area, args.limit)
    if not selected:
        print("no catalogue checks at world size 4: comparison skipped")
        return
    ids = [c.id for c in selected]
    cli_wall, summary = _one_cli_run(ids, args.timeout)
    print(f"{len(ids)} starter checks in one `accelkit conformance` run: {cli_wall:.1f}s wall "
          f"({summary})")
    fresh = _fresh_group_per_check(selected, args.timeout)
    print(f"same checks, fresh 4-rank process group per check: {fresh:.1f}s "
          f"({fresh / len(ids):.1f}s per check)")
    print(f"ratio fresh-per-check / one engine run: {fresh / cli_wall:.1f}x")


if __name__ == "__main__":
    main()
