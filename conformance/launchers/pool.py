"""The engine's worker pool: ``world_size`` long-lived rank processes for one backend.

Spawning and initialising a process group costs seconds (5-7 s for 4 ranks on gloo here), so a
pool does it once and then runs checks on command: one pickled message per rank over a
socketpair, one :class:`~accelkit.conformance.outcomes.RankResult` back. Workers are fresh
interpreters (``python -m accelkit.conformance.launchers.worker``) in their own process group, so
teardown kills the whole group (and anything a check started) and reaps every rank: no zombie
is left. A hung check (TIMEOUT) or a dead rank (CRASH) tears the pool down; the caller builds a
new one for the next check. So does a check that failed on some ranks while the others, still
waiting for them in a collective, do not answer within seconds (the check is FAIL or ERROR at
once, not a TIMEOUT after its whole budget). Worker output goes to per-rank log files; their tail since the
check started is attached to the ranks that hung or died.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path

from accelkit.conformance.launchers.processes import exit_text, kill_group, spawn
from accelkit.conformance.outcomes import RankResult, RankStatus


class PoolStartError(Exception):
    """The pool could not start (a rank failed setup or init); the message has each rank's error."""


class Pool:
    """``world_size`` ranks of backend ``backend`` with an initialised default process group."""

    def __init__(self, backend: str, world_size: int, *, modules: list[str], builtin: bool,
                 start_timeout_s: float = 180.0, memory_limit_mb: int | None = None,
                 pg_timeout_s: float = 1800.0, simulate: int | None = None) -> None:
        self.backend = backend
        self.world_size = world_size
        #: Simulated ranks: one worker without a process group that runs simulated checks on a
        #: fake group of this many ranks (:mod:`accelkit.conformance.launchers.simulate`), or None.
        self.simulate = simulate
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []
        self.logs: list[Path] = []
        self.device: dict = {}
        self.group_count = 0
        self.alive = False
        self._closed = False
        #: The ranks' process group (rank 0's pid), known as soon as rank 0 is spawned; None
        #: before that. Never 0: ``os.killpg(0, ...)`` would signal the caller's own group.
        self.pgid: int | None = None
        self._logdir = tempfile.TemporaryDirectory(prefix="accelkit-pool-")
        started = time.perf_counter()
        try:
            self._spawn(modules, builtin, memory_limit_mb, pg_timeout_s)
            self._handshake(start_timeout_s)
        except BaseException:
            self.close(graceful=False)
            raise
        self.startup_s = time.perf_counter() - started
        self.alive = True

    # -- start-up ---------------------------------------------------------------------------
    def _spawn(self, modules, builtin, memory_limit_mb, pg_timeout_s) -> None:
        for rank in range(self.world_size):
            parent_sock, child_sock = socket.socketpair()
            config = {"rank": rank, "world_size": self.world_size, "backend": self.backend,
                      "modules": modules, "builtin": builtin, "pg_timeout_s": pg_timeout_s,
                      "memory_limit_mb": memory_limit_mb, "simulate": self.simulate}
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                       RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(self.world_size), LOCAL_WORLD_SIZE=str(self.world_size),
                       MASTER_ADDR="127.0.0.1")
            log = Path(self._logdir.name) / f"rank{rank}.log"
            self.logs.append(log)
            with open(log, "wb") as out:
                proc = spawn(
                    [sys.executable, "-m", "accelkit.conformance.launchers.worker",
                     str(child_sock.fileno()), json.dumps(config)],
                    group=self.pgid or 0, pass_fds=(child_sock.fileno(),), env=env,
                    stdout=out, stderr=subprocess.STDOUT)
            self.procs.append(proc)
            if self.pgid is None:  # rank 0 leads the group (process_group=0: its own pid)
                self.pgid = proc.pid
            child_sock.close()
            self.conns.append(Connection(parent_sock.detach()))

    def _recv(self, rank: int, deadline: float) -> dict:
        conn = self.conns[rank]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolStartError(
                    f"rank {rank} did not finish start-up in time; its output:\n"
                    f"{self._log_tail(rank).strip() or '(none)'}")
            if conn.poll(min(left, 0.5)):
                try:
                    return conn.recv()
                except EOFError:
                    self.procs[rank].wait(timeout=5)
                    raise PoolStartError(
                        f"rank {rank} died during start-up "
                        f"({exit_text(self.procs[rank].returncode)}); its output:\n"
                        f"{self._log_tail(rank).strip() or '(none)'}") from None

    def _handshake(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        first = self._recv(0, deadline)
        if first["type"] == "failed":
            raise PoolStartError(self._failed(0, first))
        for conn in self.conns[1:]:
            conn.send({"type": "store", "port": first["port"]})
        errors = []
        for rank in range(self.world_size):
            msg = self._recv(rank, deadline)
            if msg["type"] == "failed":
                errors.append(self._failed(rank, msg))
            elif rank == 0:
                self.device = msg["device"]
        if errors:
            raise PoolStartError("\n".join(errors))

    def _failed(self, rank: int, msg: dict) -> str:
        """A rank's start-up failure: its error, traceback and its log (what the backend's
        native code printed), once the rank has exited."""
        try:
            self.procs[rank].wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        log = self._log_tail(rank).strip()
        shown = f"\nits output:\n{log}" if log else "\n(it printed nothing)"
        return f"rank {rank}: {msg['error']}\n{msg['traceback'].rstrip()}{shown}"

    # -- running ----------------------------------------------------------------------------
    def _log_size(self, rank: int) -> int:
        try:
            return self.logs[rank].stat().st_size
        except OSError:
            return 0

    def _log_tail(self, rank: int, since: int = 0, limit: int = 4000) -> str:
        try:
            with open(self.logs[rank], "rb") as f:
                f.seek(max(since, self._log_size(rank) - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    #: Seconds the other ranks get to answer once one rank FAILed or ERRORed: past that they
    #: are taken to wait for it in a collective, marked aborted, and the pool is rebuilt.
    out_of_step_s = 10.0

    def run(self, check_id: str, timeout_s: float) -> tuple[list[RankResult], str | None]:
        """Run ``check_id`` on every rank. Returns the per-rank results and, when the pool had
        to be torn down, why (``"timeout"``, ``"crash"`` or ``"out of step"``: a rank failed
        and the others did not answer within :attr:`out_of_step_s`)."""
        if not self.alive:
            raise RuntimeError("the pool is closed")
        offsets = [self._log_size(r) for r in range(self.world_size)]
        results: dict[int, RankResult] = {}
        dead: dict[int, str] = {}
        pending = {}
        for rank, conn in enumerate(self.conns):
            try:
                conn.send({"type": "run", "id": check_id, "group_count": self.group_count})
                pending[conn] = rank
            except OSError:  # the rank died since the last check (BrokenPipeError)
                dead[rank] = self._ended(rank)
        deadline = time.monotonic() + timeout_s
        failed_at = None  # when a rank first reported FAIL or ERROR
        while pending:
            left = deadline - time.monotonic()
            if failed_at is not None:
                left = min(left, failed_at + self.out_of_step_s - time.monotonic())
            if left <= 0:
                break
            # after a death, give the other ranks a moment to report (or die) too
            ready = wait(list(pending), timeout=min(left, 0.5) if dead else left)
            if dead and not ready:
                break
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    results[rank] = conn.recv()
                except (EOFError, OSError):
                    dead[rank] = self._ended(rank)
                    continue
                if failed_at is None and results[rank].status in (RankStatus.FAIL, RankStatus.ERROR):
                    failed_at = time.monotonic()
        if dead:
            for rank, how in dead.items():
                results[rank] = RankResult(rank=rank, status=RankStatus.CRASH, message=f"died: {how}",
                                           exit=how, log_tail=self._log_tail(rank, offsets[rank]))
            for rank in pending.values():
                results[rank] = RankResult(rank=rank, status=RankStatus.ABORTED,
                                           message="aborted: pool torn down after a rank died")
            self.close(graceful=False)
            return [results[r] for r in range(self.world_size)], "crash"
        if pending and failed_at is not None and time.monotonic() < deadline:
            # the ranks that failed left; the others wait for them in a collective
            for rank in pending.values():
                results[rank] = RankResult(
                    rank=rank, status=RankStatus.ABORTED,
                    message=f"aborted: no answer {self.out_of_step_s:g} s after another rank "
                            "failed (waiting for it in a collective?)")
            self.close(graceful=False)
            return [results[r] for r in range(self.world_size)], "out of step"
        if pending:
            self._dump_stacks(list(pending.values()))
            for rank in pending.values():
                results[rank] = RankResult(
                    rank=rank, status=RankStatus.TIMEOUT, message=f"no answer within {timeout_s:g} s",
                    log_tail=self._log_tail(rank, offsets[rank]))
            self.close(graceful=False)
            return [results[r] for r in range(self.world_size)], "timeout"
        ordered = [results[r] for r in range(self.world_size)]
        self.group_count = max(r.group_count for r in ordered)
        return ordered, None

    def _ended(self, rank: int, grace_s: float = 2.0) -> str:
        """How a rank whose connection closed ended: its exit status, or, when it is still
        alive after ``grace_s`` (it closed the socket and went on), that fact; the teardown
        that follows kills it."""
        try:
            self.procs[rank].wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return "closed its connection to the engine but did not exit (killed)"
        return exit_text(self.procs[rank].returncode)

    def _dump_stacks(self, ranks: list[int]) -> None:
        """Ask hung ranks for every thread's stack (faulthandler on SIGUSR1) before the kill."""
        for rank in ranks:
            try:
                self.procs[rank].send_signal(signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(0.3)

    def sync(self, timeout_s: float = 10.0) -> bool:
        """A barrier on the default group; False (and the pool closed) if it does not complete,
        which means the ranks' collectives went out of step."""
        deadline = time.monotonic() + timeout_s
        try:
            for conn in self.conns:
                conn.send({"type": "sync"})
        except OSError:  # a rank is gone (BrokenPipeError)
            self.close(graceful=False)
            return False
        for conn in self.conns:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not conn.poll(left):
                    raise TimeoutError
                conn.recv()
            except (EOFError, OSError, TimeoutError):
                self.close(graceful=False)
                return False
        return True

    # -- teardown ---------------------------------------------------------------------------
    def close(self, graceful: bool = True) -> None:
        """Stop every rank (politely when ``graceful``, then SIGKILL to the whole process
        group), reap them, remove shared-memory segments they left, and delete the logs."""
        self.alive = False
        if self._closed:
            return
        self._closed = True
        if graceful:
            for conn in self.conns:
                try:
                    conn.send({"type": "exit"})
                except OSError:
                    pass
            deadline = time.monotonic() + 5.0
            for proc in self.procs:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    break
        kill_group(self.pgid, self.procs)
        for conn in self.conns:
            conn.close()
        self.conns = []
        self._logdir.cleanup()

