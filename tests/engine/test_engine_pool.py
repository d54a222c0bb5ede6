"""The worker pool in this process: ranks are reaped on every kind of teardown, so no zombie
and no orphan is left."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import engine_env  # tests/fixtures (tests/conftest.py)
from accelkit.conformance.launchers.pool import Pool

POOL_CHECKS = str(Path(engine_env.FIXTURES) / "engine_pool_checks.py")


def _pool():
    return Pool("cpu", 2, modules=[engine_env.CHECKS, POOL_CHECKS], builtin=False)


def test_graceful_close_reaps_every_rank():
    pool = _pool()
    assert len(engine_env.children(os.getpid())) == 2
    ranks, torn_down = pool.run("fixture.broadcast", timeout_s=30)
    assert torn_down is None and [r.status for r in ranks] == ["pass", "pass"]
    pool.close()
    assert engine_env.children(os.getpid()) == []
    pool.close()  # idempotent


def test_crash_tears_down_and_reaps_the_pool():
    pool = _pool()
    ranks, torn_down = pool.run("fixture.exits_rank1", timeout_s=30)
    assert torn_down == "crash"
    assert (ranks[1].status, ranks[1].exit) == ("crash", "exit code 3")
    assert not pool.alive
    assert engine_env.children(os.getpid()) == []  # no zombie, no survivor


def test_a_rank_that_died_between_checks_is_a_crash_not_an_engine_error():
    """Sending the next check to a rank that is already dead (BrokenPipeError) is that rank's
    CRASH; the barrier after a check does not raise either."""
    pool = _pool()
    try:
        os.kill(pool.procs[1].pid, signal.SIGKILL)
        pool.procs[1].wait(timeout=30)
        ranks, torn_down = pool.run("fixture.broadcast", timeout_s=30)
        assert torn_down == "crash"
        assert (ranks[1].status, ranks[1].exit) == ("crash", "SIGKILL")
        assert not pool.alive
        other = _pool()
        os.kill(other.procs[0].pid, signal.SIGKILL)
        other.procs[0].wait(timeout=30)
        assert other.sync() is False
    finally:
        pool.close(graceful=False)
        if "other" in locals():
            other.close(graceful=False)
    assert engine_env.children(os.getpid()) == []


def test_a_rank_that_closes_its_connection_but_lives_is_killed_and_reported():
    """A rank closing its socket without exiting is a CRASH within seconds; the engine does
    not wait on it forever."""
    pool = _pool()
    box = {}
    runner = threading.Thread(target=lambda: box.update(
        out=pool.run("pool.closes_connection", timeout_s=60)), daemon=True)
    try:
        runner.start()
        runner.join(30)
        assert not runner.is_alive(), "the engine waits forever on a rank that closed its socket"
        ranks, torn_down = box["out"]
        assert torn_down == "crash"
        assert ranks[1].status == "crash"
        assert "closed its connection" in ranks[1].message
    finally:
        pool.close(graceful=False)
    assert engine_env.children(os.getpid()) == []


def test_a_check_failing_on_one_rank_while_another_waits_ends_in_seconds():
    import time

    from accelkit.conformance.engine.verdict import merge
    from accelkit.conformance.outcomes import Outcome

    pool = _pool()
    try:
        started = time.monotonic()
        ranks, torn_down = pool.run("pool.fails_then_waits", timeout_s=120)
        assert time.monotonic() - started < pool.out_of_step_s + 10
        assert torn_down == "out of step"
        assert [r.status for r in ranks] == ["aborted", "fail"]
        assert merge(ranks) == (Outcome.FAIL, "rank 1: AssertionError: rank 1 fails first")
    finally:
        pool.close(graceful=False)
    assert engine_env.children(os.getpid()) == []


def test_a_spawn_failing_mid_loop_kills_only_the_pools_own_group(monkeypatch):
    """A rank that cannot be spawned after rank 0 was: the pool kills and reaps rank 0 through
    rank 0's process group, never ``os.killpg(0, ...)`` (the caller's own group: the CLI,
    pytest, tox)."""
    import subprocess

    from accelkit.conformance.launchers import pool as pool_module

    real_popen, real_killpg = subprocess.Popen, os.killpg
    spawned, killed = [], []

    def popen(*args, **kwargs):
        if spawned:
            raise OSError("no second rank today")
        spawned.append(real_popen(*args, **kwargs))
        return spawned[-1]

    def killpg(pgid, sig):
        killed.append(pgid)
        if pgid in (0, os.getpgrp()):
            raise AssertionError(f"os.killpg({pgid}) would signal the caller's own group")
        real_killpg(pgid, sig)

    monkeypatch.setattr(pool_module.subprocess, "Popen", popen)
    monkeypatch.setattr(pool_module.os, "killpg", killpg)
    try:
        _pool()
    except OSError as exc:
        assert "no second rank" in str(exc)
    else:
        raise AssertionError("the pool started without its second rank")
    assert killed == [spawned[0].pid]
    assert spawned[0].returncode is not None
    assert engine_env.children(os.getpid()) == []


def test_a_reset_that_raises_is_the_checks_error_not_a_dead_rank():
    """The per-check reset runs inside the check's ``try``: when an earlier check left the rank
    unable to reset, the next check is ERROR naming the reset, and the rank lives on."""
    pool = _pool()
    try:
        ranks, torn_down = pool.run("pool.breaks_the_reset", timeout_s=30)
        assert torn_down is None and [r.status for r in ranks] == ["pass", "pass"]
        ranks, torn_down = pool.run("fixture.broadcast", timeout_s=30)
        assert torn_down is None, [r.message for r in ranks]
        assert [r.status for r in ranks] == ["error", "error"]
        assert "manual_seed broken" in ranks[0].message
        assert "resetting the rank's state before the check" in ranks[0].message
    finally:
        pool.close(graceful=False)
    assert engine_env.children(os.getpid()) == []


def test_an_asynchronous_error_is_charged_to_the_check_that_queued_it(monkeypatch):
    """On an asynchronous device the engine synchronizes it after every check: a kernel that
    fails after its check returned is that check's ERROR, and the next check passes."""
    monkeypatch.setenv("ACCELKIT_MOCK_ASYNC", "1")
    pool = Pool("mock", 2, modules=[engine_env.CHECKS, POOL_CHECKS], builtin=False)
    try:
        ranks, torn_down = pool.run("pool.leaves_a_failing_kernel", timeout_s=60)
        assert torn_down is None
        assert [r.status for r in ranks] == ["error", "error"], [r.message for r in ranks]
        assert "queued by pool.leaves_a_failing_kernel" in ranks[0].message
        assert "synchronizing the device after the check" in ranks[0].message
        ranks, torn_down = pool.run("fixture.broadcast", timeout_s=60)
        assert torn_down is None and [r.status for r in ranks] == ["pass", "pass"], (
            [r.message for r in ranks])
    finally:
        pool.close(graceful=False)
    assert engine_env.children(os.getpid()) == []
