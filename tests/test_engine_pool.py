"""The worker pool in this process: ranks are reaped on every kind of teardown, so no zombie
and no orphan is left (issue #3)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import engine_env  # noqa: E402
from accelkit.conformance.pool import Pool  # noqa: E402


def _pool():
    return Pool("cpu", 2, modules=[engine_env.CHECKS], builtin=False)


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
