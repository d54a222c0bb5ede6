"""torchrun mode: ``torchrun --nnodes N --nproc-per-node M -m accelkit.conformance --backend B``
runs the conformance checks on an existing (possibly multi-node) launch (issue #3).

Every rank is a worker: it calls ``spec.setup()``, selects its device (``LOCAL_RANK``) and
``init_process_group`` through ``env://``. Checks written for the launch's world size run; the
others are SKIPped with the reason. Rank 0 decides, per check, whether it runs (and publishes
that through the launch's store, so every rank agrees), collects the per-rank results through
the store, merges them with the same logic as the pool engine and, at the end, prints the
summary and writes the reports.

What cannot be recovered here: a hung rank or a dead one. Rank 0 arms a watchdog for each
check's budget: when it fires, the check is reported TIMEOUT (ranks that did not answer are
named), the reports are written and rank 0 exits 1, which makes torchrun stop the launch. When
a rank dies, torchrun sends SIGTERM to the others; rank 0 then reports the running check as
CRASH ("launch stopped") and exits 1. The remaining checks are listed as not run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import signal
import sys
import threading
import time

from accelkit.conformance import cli
from accelkit.conformance.api import CheckContext, CheckDef
from accelkit.conformance.outcomes import CheckResult, Outcome, RankResult, merge
from accelkit.conformance.runner import Runner

_PREFIX = "accelkit_conformance"


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise cli.UsageError(
            f"${name} is not set: python -m accelkit.conformance runs under torchrun "
            "(torchrun --nproc-per-node M -m accelkit.conformance --backend NAME); "
            "on one machine use `accelkit conformance` instead") from None


class LaunchRunner(Runner):
    """A :class:`Runner` whose ranks are the launch's processes, this one included."""

    def __init__(self, spec, options, expectations, progress, *, ranks: dict,
                 store, watch_store, finish) -> None:
        self.rank, self.world_size = ranks["rank"], ranks["world_size"]
        self.local_rank, self.local_world_size = ranks["local_rank"], ranks["local_world_size"]
        super().__init__(spec, options, expectations, progress)
        self.store, self.watch_store = store, watch_store
        self.finish = finish  # rank 0: report -> summary and report files
        self.index = 0
        self.started = time.perf_counter()
        self.group_count = 0
        self.remaining: list[CheckDef] = []
        self._current: tuple[CheckDef, float] | None = None
        self._watch_lock = threading.Lock()  # the running check, between main and watchdog
        self._abort_lock = threading.Lock()

    # -- what runs ---------------------------------------------------------------------------
    def _world_size_problem(self, world_size: int) -> str | None:
        if world_size != self.world_size:
            return (f"written for {world_size} ranks; this launch has {self.world_size} "
                    "(set torchrun's --nnodes x --nproc-per-node to match)")
        most = self.spec.capabilities.max_world_size
        if most is not None and self.local_world_size > most:
            return f"{self.local_world_size} devices per node needed, {most} present"
        ok, reason = self._probe(self.local_world_size)
        return None if ok else reason

    def _decide(self, check: CheckDef) -> tuple[Outcome, str] | None:
        key = f"{self.index}/plan"
        if self.rank == 0:
            decided = self._not_run(check)
            plan = {"group_count": self.group_count,
                    "decided": [decided[0].value, decided[1]] if decided else None}
            self.store.set(key, json.dumps(plan))
            return decided
        plan = json.loads(self.store.get(key))
        self.group_count = plan["group_count"]
        decided = plan["decided"]
        return None if decided is None else (Outcome(decided[0]), decided[1])

    def run_check(self, check: CheckDef) -> CheckResult:
        self.index += 1
        self.remaining = self.remaining[1:] if self.remaining[:1] == [check] else self.remaining
        return super().run_check(check)

    # -- running -----------------------------------------------------------------------------
    def _execute(self, check: CheckDef) -> CheckResult:
        ctx = CheckContext(rank=self.rank, world_size=self.world_size,
                           local_rank=self.local_rank, spec=self.spec)
        from accelkit.conformance.execute import run_on_rank

        timer = None
        if self.rank == 0:
            self._current = (check, time.perf_counter())
            timer = threading.Timer(self.budget(check), self._on_timeout, args=(check,))
            timer.daemon = True
            timer.start()
        mine = run_on_rank(check, ctx, self.group_count)
        self.store.set(f"{self.index}/rank{self.rank}", pickle.dumps(mine))
        if self.rank != 0:  # rank 0's next plan (or the end) tells when everyone is done
            return CheckResult(check.id, check.world_size, *merge([mine]), ranks=[mine])
        keys = [f"{self.index}/rank{r}" for r in range(self.world_size)]
        self.store.wait(keys, datetime.timedelta(seconds=self.budget(check) + 60))
        with self._watch_lock:  # a timer firing from now on finds no running check
            self._current = None
        timer.cancel()
        ranks = [pickle.loads(self.store.get(k)) for k in keys]
        self.group_count = max(r.group_count for r in ranks)
        outcome, reason = merge(ranks)
        return CheckResult(check.id, check.world_size, outcome, reason, ranks=ranks)

    def _answers(self, store) -> list[RankResult | None]:
        answers = []
        for r in range(self.world_size):
            key = f"{self.index}/rank{r}"
            answers.append(pickle.loads(store.get(key)) if store.check([key]) else None)
        return answers

    def _on_timeout(self, check: CheckDef) -> None:
        """Rank 0's watchdog: ``check`` ran past its budget. It may fire after the last rank
        answered and before the main thread cancelled it: then the check is not a TIMEOUT."""
        with self._watch_lock:
            if self._current is None or self._current[0] is not check:
                return
            answers = self._answers(self.watch_store)
            if all(a is not None for a in answers):
                return
            budget = self.budget(check)
            ranks = [a or RankResult(rank=r, status="timeout",
                                     message=f"no answer within {budget:g} s")
                     for r, a in enumerate(answers)]
            self.abort(check, ranks, f"TIMEOUT in {check.id}")

    def watch_sigterm(self) -> None:
        """Rank 0: wait for torchrun's SIGTERM (blocked in every thread, so it is taken here even
        while the main thread is stuck in C++) and report the running check as CRASH."""
        signal.sigwait({signal.SIGTERM})
        current = self._current
        if current is None:
            self.abort(None, [], "launch stopped (SIGTERM from torchrun) between checks")
            return
        ranks = [a or RankResult(rank=r, status="crash",
                                 message="launch stopped (SIGTERM from torchrun): a rank died or "
                                         "was killed; see torchrun's output for which")
                 for r, a in enumerate(self._answers(self.watch_store))]
        self.abort(current[0], ranks, f"launch stopped during {current[0].id}")

    def abort(self, check: CheckDef | None, ranks: list[RankResult], why: str) -> None:
        """Rank 0: record ``check`` from ``ranks``, write the reports, exit 1 (never returns)."""
        if not self._abort_lock.acquire(blocking=False):
            return
        if check is not None:
            started = self._current[1] if self._current else time.perf_counter()
            outcome, reason = merge(ranks)
            result = CheckResult(check.id, check.world_size, outcome, reason, ranks=ranks,
                                 duration_s=round(time.perf_counter() - started, 3))
            self._apply_expectation(result)
            self.report.results.append(result)
            if self.progress is not None:
                self.progress(result)
        self.report.duration_s = round(time.perf_counter() - self.started, 3)
        not_run = [c.id for c in self.remaining]
        self.report.aborted = f"{why}; {len(not_run)} check(s) not run: {', '.join(not_run) or '-'}"
        self.finish(self.report)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m accelkit.conformance",
        description="Run the accelkit conformance checks on a torchrun launch (every rank "
                    "is a worker; rank 0 prints the summary and writes the reports).")
    cli.add_selection_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from accelkit.conformance import reports, terminal

    args = _parse(argv)
    if os.environ.get("RANK") == "0":  # taken by LaunchRunner.watch_sigterm, in every thread
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        ranks = {"rank": _env_int("RANK"), "world_size": _env_int("WORLD_SIZE"),
                 "local_rank": _env_int("LOCAL_RANK"),
                 "local_world_size": _env_int("LOCAL_WORLD_SIZE")}
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        spec, options, selected, expectations = cli.resolve(args)
        # Checks written for this launch's size run at it; the others SKIP, naming their size.
        selected = [c.at(ranks["world_size"]) if ranks["world_size"] in c.world_sizes else c
                    for c in selected]
    except cli.UsageError as exc:
        print(f"python -m accelkit.conformance: error: {exc}", file=sys.stderr)
        return 2
    rank = ranks["rank"]

    def finish(report) -> None:
        report.mode = "torchrun"
        print()
        print(terminal.summary(report))
        if args.report_dir:
            for path in reports.write(report, args.report_dir):
                print(f"wrote {path}")

    progress = terminal.Progress(len(selected)) if rank == 0 else None
    ok, reason = spec.probe(ranks["local_world_size"])
    if not ok and not spec.probe(1)[0]:  # unavailable: report without touching the device
        if rank != 0:
            return 3 if args.require_available else 0
        runner = Runner(spec, options, expectations, progress)
        report = runner.run(selected)
        finish(report)
        return 3 if args.require_available else 0

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    spec.setup()
    from accelkit.conformance.execute import device_handle

    handle = device_handle(spec.device_type)
    if handle is not None and hasattr(handle, "set_device"):
        handle.set_device(ranks["local_rank"])
    dist.init_process_group(backend=spec.process_group_backend)
    from accelkit.core import torch_internals

    default_store = torch_internals.default_store()
    store = dist.PrefixStore(_PREFIX, default_store.clone())
    watch_store = dist.PrefixStore(_PREFIX, default_store.clone()) if rank == 0 else None
    runner = LaunchRunner(spec, options, expectations, progress, ranks=ranks, store=store,
                          watch_store=watch_store, finish=finish)
    runner.remaining = list(selected)
    if rank == 0:
        threading.Thread(target=runner.watch_sigterm, daemon=True, name="sigterm").start()
    from accelkit.conformance.worker import device_info

    runner.report.device = device_info(spec)
    runner.started = time.perf_counter()
    for check in selected:
        runner.run_check(check)
    if rank == 0:
        runner.report.duration_s = round(time.perf_counter() - runner.started, 3)
        finish(runner.report)
        code = 0 if runner.report.ok() else 1
        store.set("end", str(code))
    else:
        code = int(store.get("end"))
    dist.destroy_process_group()
    return code
