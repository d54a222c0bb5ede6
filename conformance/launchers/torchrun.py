"""torchrun mode: ``torchrun --nnodes N --nproc-per-node M -m accelkit.conformance --backend B``
runs the conformance checks on an existing (possibly multi-node) launch.

Every rank is a worker: it calls ``spec.setup()``, selects its device (``LOCAL_RANK``) and
``init_process_group`` through ``env://``. Its options are ``accelkit conformance``'s
(:mod:`~accelkit.conformance.engine.options`), but for the world size: the launch's. Checks written
for the launch's world size run at it; the others are SKIPped with the reason. Rank 0 plans the
run (:func:`~accelkit.conformance.engine.plan.make_plan`), publishes each step's decision through the
launch's store (so every rank agrees), collects the per-rank results through the store (as
JSON), merges them with the same logic as the pool engine and, at the end, prints the
summary and writes the reports. At startup every rank publishes its hostname through the store,
so the report names each host of the launch with its ranks.

What cannot be recovered here: a hung rank or a dead one. Rank 0 arms a watchdog for each
check's budget: when it fires (and some rank has not answered), the check is reported TIMEOUT
(ranks that did not answer are named), the reports are written and rank 0 exits 1, which makes
torchrun stop the launch. When a rank dies, torchrun sends SIGTERM to the others; rank 0 then
reports the running check as CRASH ("launch stopped") and exits 1. The remaining checks are
listed as not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import signal
import sys
import threading
import time

from accelkit.conformance.api import CheckContext, CheckDef
from accelkit.conformance.engine import options as options_mod
from accelkit.conformance.engine.plan import Step, make_plan, probe_host, with_launch
from accelkit.conformance.engine.runner import Runner
from accelkit.conformance.engine.session import LoadError, UsageError, resolve
from accelkit.conformance.outcomes import CheckResult, Outcome, RankResult, RankStatus

_PREFIX = "accelkit_conformance"
PROG = "python -m accelkit.conformance"


def _encode(result: RankResult) -> bytes:
    """A rank's result as it travels through the launch's store: JSON. Every process of the
    job can write to the store, so what rank 0 reads from it must not be able to run code
    (unpickling can)."""
    return json.dumps(dataclasses.asdict(result)).encode()


def _decode(data: bytes) -> RankResult:
    return RankResult(**json.loads(data))


def _publish_host(store, rank: int) -> None:
    """Every rank, at startup: the host it runs on, for rank 0's report (JSON)."""
    store.set(f"host/rank{rank}", json.dumps({"host": platform.node()}))


def _launch_hosts(store, world_size: int) -> dict[str, list[int]]:
    """Rank 0: every rank's host (:func:`_publish_host`), hostname -> ranks."""
    keys = [f"host/rank{r}" for r in range(world_size)]
    store.wait(keys, datetime.timedelta(seconds=120))
    hosts: dict[str, list[int]] = {}
    for rank, key in enumerate(keys):
        hosts.setdefault(str(json.loads(store.get(key))["host"]), []).append(rank)
    return hosts


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise UsageError(
            f"${name} is not set: {PROG} runs under torchrun "
            "(torchrun --nproc-per-node M -m accelkit.conformance --backend NAME); "
            "on one machine use `accelkit conformance` instead") from None


class LaunchRunner(Runner):
    """A :class:`Runner` whose ranks are the launch's processes, this one included."""

    def __init__(self, spec, options, progress, *, ranks: dict, store, watch_store, finish,
                 report=None, ops=None) -> None:
        self.rank, self.world_size = ranks["rank"], ranks["world_size"]
        self.local_rank, self.local_world_size = ranks["local_rank"], ranks["local_world_size"]
        super().__init__(spec, options, progress, report, ops)
        self.report.mode = "torchrun"
        self.store, self.watch_store = store, watch_store
        self.finish = finish  # rank 0: report -> summary and report files
        self.index = 0
        self.started = time.perf_counter()
        self.group_count = 0
        self.remaining: list[Step] = []
        self._current: tuple[Step, float] | None = None
        self._watch_lock = threading.Lock()  # the running check, between main and watchdog
        self._abort_lock = threading.Lock()

    # -- what runs ---------------------------------------------------------------------------
    def _decide(self, step: Step) -> tuple[Outcome, str] | None:
        """Rank 0's plan decides; it publishes the decision, which the other ranks follow."""
        key = f"{self.index}/plan"
        if self.rank == 0:
            decided = step.decided
            plan = {"group_count": self.group_count,
                    "decided": [decided[0].value, decided[1]] if decided else None}
            self.store.set(key, json.dumps(plan))
            return decided
        plan = json.loads(self.store.get(key))
        self.group_count = plan["group_count"]
        decided = plan["decided"]
        return None if decided is None else (Outcome(decided[0]), decided[1])

    def run_step(self, step: Step) -> CheckResult:
        self.index += 1
        self.remaining = self.remaining[1:] if self.remaining[:1] == [step] else self.remaining
        self._step = step
        return super().run_step(step)

    # -- running -----------------------------------------------------------------------------
    def _execute(self, check: CheckDef) -> tuple[list[RankResult], None]:
        ctx = CheckContext(rank=self.rank, world_size=self.world_size,
                           local_rank=self.local_rank, spec=self.spec)
        from accelkit.conformance.engine.execute import run_on_rank

        timer = None
        if self.rank == 0:
            self._current = (self._step, time.perf_counter())
            timer = threading.Timer(self.budget(check), self._on_timeout, args=(self._step,))
            timer.daemon = True
            timer.start()
        mine = run_on_rank(check, ctx, self.group_count)
        self.store.set(f"{self.index}/rank{self.rank}", _encode(mine))
        if self.rank != 0:  # rank 0's next plan (or the end) tells when everyone is done
            return [mine], None
        keys = [f"{self.index}/rank{r}" for r in range(self.world_size)]
        self.store.wait(keys, datetime.timedelta(seconds=self.budget(check) + 60))
        with self._watch_lock:  # a timer firing from now on finds no running check
            self._current = None
        timer.cancel()
        ranks = [_decode(self.store.get(k)) for k in keys]
        self.group_count = max(r.group_count for r in ranks)
        return ranks, None

    def _answers(self, store) -> list[RankResult | None]:
        answers = []
        for r in range(self.world_size):
            key = f"{self.index}/rank{r}"
            answers.append(_decode(store.get(key)) if store.check([key]) else None)
        return answers

    def _on_timeout(self, step: Step) -> None:
        """Rank 0's watchdog: ``step`` ran past its budget. It may fire after the last rank
        answered and before the main thread cancelled it: then the check is not a TIMEOUT."""
        with self._watch_lock:
            if self._current is None or self._current[0] is not step:
                return
            answers = self._answers(self.watch_store)
            if all(a is not None for a in answers):
                return
            budget = self.budget(step.check)
            ranks = [a or RankResult(rank=r, status=RankStatus.TIMEOUT,
                                     message=f"no answer within {budget:g} s")
                     for r, a in enumerate(answers)]
            self.abort(step, ranks, f"TIMEOUT in {step.check.id}")

    def watch_sigterm(self) -> None:
        """Rank 0: wait for torchrun's SIGTERM (blocked in every thread, so it is taken here even
        while the main thread is stuck in C++) and report the running check as CRASH."""
        signal.sigwait({signal.SIGTERM})
        current = self._current
        if current is None:
            self.abort(None, [], "launch stopped (SIGTERM from torchrun) between checks")
            return
        ranks = [a or RankResult(rank=r, status=RankStatus.CRASH,
                                 message="launch stopped (SIGTERM from torchrun): a rank died or "
                                         "was killed; see torchrun's output for which")
                 for r, a in enumerate(self._answers(self.watch_store))]
        self.abort(current[0], ranks, f"launch stopped during {current[0].check.id}")

    def abort(self, step: Step | None, ranks: list[RankResult], why: str) -> None:
        """Rank 0: record ``step`` from ``ranks``, write the reports, exit 1 (never returns)."""
        if not self._abort_lock.acquire(blocking=False):
            return
        if step is not None:
            started = self._current[1] if self._current else time.perf_counter()
            result = self.judge(step, ranks)
            result.duration_s = round(time.perf_counter() - started, 3)
            self.record(result)
        self.report.duration_s = round(time.perf_counter() - self.started, 3)
        not_run = [s.key for s in self.remaining]
        self.report.aborted = f"{why}; {len(not_run)} check(s) not run: {', '.join(not_run) or '-'}"
        self.finish(self.report)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the accelkit conformance checks on a torchrun launch (every rank "
                    "is a worker; rank 0 prints the summary and writes the reports).")
    options_mod.add_to_parser(parser, options_mod.TORCHRUN)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from accelkit.conformance.reports import terminal

    from accelkit.commands import conformance as cli

    options = options_mod.from_namespace(_parse(argv), options_mod.TORCHRUN)
    if os.environ.get("RANK") == "0":  # taken by LaunchRunner.watch_sigterm, in every thread
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        ranks = {"rank": _env_int("RANK"), "world_size": _env_int("WORLD_SIZE"),
                 "local_rank": _env_int("LOCAL_RANK"),
                 "local_world_size": _env_int("LOCAL_WORLD_SIZE")}
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        session = resolve(options)
    except LoadError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        if os.environ.get("RANK") == "0":
            cli.finish(cli.load_failure(exc, options, "torchrun"), options)
        return cli.EXIT_LOAD_ERROR
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    rank, spec = ranks["rank"], session.spec
    # the launch's size decides which checks run; each node must hold its local ranks
    host = probe_host(spec, session.selected, [ranks["local_world_size"]])
    plan = make_plan(session.selected, session.expectations,
                     with_launch(host, ranks["world_size"],
                                 host.problems[ranks["local_world_size"]]))

    def finish(report) -> None:
        cli.finish(report, options)

    progress = terminal.Progress(len(plan.steps)) if rank == 0 else None
    if host.unavailable is not None:  # report without touching the device
        if rank != 0:
            return 3 if options.require_available else 0
        runner = Runner(spec, session.options, progress, ops=session.ops)
        runner.report.unavailable = host.unavailable
        runner.report.mode = "torchrun"
        finish(runner.run(plan))
        return 3 if options.require_available else 0

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    spec.setup()
    from accelkit.conformance.engine.execute import device_handle

    handle = device_handle(spec.device_type)
    if handle is not None and hasattr(handle, "set_device"):
        handle.set_device(ranks["local_rank"])
    dist.init_process_group(backend=spec.process_group_backend)
    from accelkit.core import torch_internals

    default_store = torch_internals.default_store()
    store = dist.PrefixStore(_PREFIX, default_store.clone())
    watch_store = dist.PrefixStore(_PREFIX, default_store.clone()) if rank == 0 else None
    runner = LaunchRunner(spec, session.options, progress, ranks=ranks, store=store,
                          watch_store=watch_store, finish=finish, ops=session.ops)
    runner.remaining = list(plan.steps)
    if rank == 0:
        threading.Thread(target=runner.watch_sigterm, daemon=True, name="sigterm").start()
    _publish_host(store, rank)
    if rank == 0:
        runner.report.hosts = _launch_hosts(store, ranks["world_size"])
    from accelkit.conformance.launchers.worker import device_info

    runner.report.device = device_info(spec)
    runner.started = time.perf_counter()
    for step in plan.steps:
        runner.run_step(step)
    if rank == 0:
        runner.report.duration_s = round(time.perf_counter() - runner.started, 3)
        finish(runner.report)
        code = 0 if runner.report.ok() else 1
        store.set("end", str(code))
    else:
        code = int(store.get("end"))
    dist.destroy_process_group()
    return code

