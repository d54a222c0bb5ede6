"""Teardown and concurrency of accelkit's c10d glue on mockccl: a group aborted with
collectives in flight returns within moments (not at the collectives' 1800 s timeout) and its
pending Work completes with an error; a group shut down finishes them instead (a collective
whose peer never comes ends at its own timeout); many threads issuing collectives while another aborts
neither crash nor hang; a recv(src) and a recv from any source on different threads never take
the same message.

One pool of 3 rank processes runs the scenario (``python tests/mockccl/test_mockccl_teardown.py`` is the
rank program; rank 2 is the one that never joins) and reports what each rank saw as JSON; once
with the ranks on one host, once across two (:data:`LAYOUTS`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
from support.python import TIME_SCALE
from support.ranks import build_extensions, spawn_ranks

WORLD = 3
#: The pending collectives' timeout under abort(): a teardown that waited for it would blow the
#: test's budget.
LONG = timedelta(seconds=1800)
#: Their timeout under shutdown(), which waits for it.
SHORT = timedelta(seconds=3)
RECV_ROUNDS = 60


def _pending_then(rank, dev, close, timeout):
    """Ranks 0 and 1 start an all_reduce rank 2 never joins on a group with `timeout`, then
    `close` the group; what the close cost and how the pending Work ended."""
    import torch
    import torch.distributed as dist

    group = dist.new_group(timeout=timeout)
    dist.all_reduce(torch.ones(1, device=dev), group=group)  # connected and working
    if rank == 2:
        dist.barrier()  # (default group) the others are done with it
        return None
    work = dist.all_reduce(torch.ones(1 << 10, device=dev), group=group, async_op=True)
    time.sleep(0.3)  # the collective is waiting for rank 2 inside the transport
    start = time.monotonic()
    close(group)
    closed_s = time.monotonic() - start
    try:
        work.wait()
        error = None
    except Exception as exc:  # noqa: BLE001  (reported to the test)
        error = f"{type(exc).__name__}: {exc}"
    seen = {"close_s": closed_s, "wait_s": time.monotonic() - start, "error": error,
            "completed": work.is_completed()}
    dist.barrier()
    return seen


def _stress(rank, dev, issuers=4, per_thread=40):
    """Every rank: threads issue async all_reduces on one group while the main thread aborts
    it after a moment. No crash, no hang; every Work completes (ok or error)."""
    import torch
    import torch.distributed as dist

    group = dist.new_group(timeout=timedelta(seconds=20))
    works, errors, lock = [], [], threading.Lock()

    def issue():
        for _ in range(per_thread):
            try:
                w = dist.all_reduce(torch.ones(64, device=dev), group=group, async_op=True)
                with lock:
                    works.append(w)
            except Exception as exc:  # noqa: BLE001  (raised after the abort: expected)
                with lock:
                    errors.append(type(exc).__name__)

    threads = [threading.Thread(target=issue) for _ in range(issuers)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    start = time.monotonic()
    group._get_backend(dev).abort()
    abort_s = time.monotonic() - start
    for t in threads:
        t.join(timeout=60)
    outcomes = {"ok": 0, "error": 0}
    for w in works:
        try:
            w.wait()
            outcomes["ok"] += 1
        except Exception:  # noqa: BLE001
            outcomes["error"] += 1
    return {"abort_s": abort_s, "threads_done": not any(t.is_alive() for t in threads),
            "works": outcomes, "raised_at_issue": len(errors)}


def _recv_claims(rank, dev, rounds=RECV_ROUNDS):
    """Rank 1 sends two messages to rank 0 per round; rank 0 receives them with a recv(src=1)
    and a recv from any source posted together, on different threads of the glue."""
    import torch
    import torch.distributed as dist

    bad = []
    for i in range(rounds):
        if rank == 1:
            dist.send(torch.full((300,), float(2 * i), device=dev), dst=0)
            dist.send(torch.full((300,), float(2 * i + 1), device=dev), dst=0)
        elif rank == 0:
            a, b = torch.empty(300, device=dev), torch.empty(300, device=dev)
            wa = dist.irecv(a, src=1)
            wb = dist.irecv(b)  # any source
            wa.wait()
            wb.wait()
            got = sorted({float(v) for v in a.cpu().tolist()} | {float(v) for v in b.cpu().tolist()})
            if got != [2.0 * i, 2.0 * i + 1] or wb._source_rank() != 1:
                bad.append({"round": i, "got": got[:4], "source": wb._source_rank()})
        dist.barrier()
    return {"bad": bad}


def rank_main(rank: int, world_size: int, out_path: str) -> None:
    import accelkit.backends.mock  # noqa: F401  (torch.mock and mockccl)
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    torch.set_num_threads(1)
    torch.mock.set_device(rank)
    dev = torch.device("mock", rank)
    dist.init_process_group("mock:mockccl,cpu:gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    seen = {
        "shutdown": _pending_then(rank, dev, lambda g: g.shutdown(), SHORT),
        "abort": _pending_then(rank, dev, c10d._abort_process_group, LONG),
        "recv": _recv_claims(rank, dev),
        "stress": _stress(rank, dev),
    }
    Path(out_path).write_text(json.dumps(seen))
    dist.destroy_process_group()


#: The scenario's layouts: the host of each rank (None: all on this one). Across hosts, rank 0
#: waits on rank 1's host over TCP, rank 1 on rank 2 through shared memory, and the receives
#: race over TCP connections.
LAYOUTS = {"one-host": None, "two-hosts": ("a", "b", "b")}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def scenario(request, tmp_path_factory):
    build_extensions()
    out = tmp_path_factory.mktemp("mockccl_teardown")
    return spawn_ranks(__file__, WORLD, out, timeout=240, hosts=LAYOUTS[request.param])


def test_ranks_finish(scenario):
    results, errs, codes = scenario
    assert codes == [0] * WORLD, "\n".join(e[-3000:] for e in errs)
    assert all(r is not None for r in results)


def test_abort_with_a_collective_in_flight_returns_at_once(scenario):
    results, _, _ = scenario
    for rank in (0, 1):
        seen = results[rank]["abort"]
        assert seen["close_s"] < 5.0 * TIME_SCALE, seen  # the pending all_reduce's timeout is 1800 s
        assert seen["completed"] is True, seen
        assert seen["error"] is not None and "DistBackendError" in seen["error"], seen
        assert "aborted" in seen["error"] and "in flight" in seen["error"], seen


def test_shutdown_finishes_a_collective_in_flight(scenario):
    """shutdown() does not abort: the all_reduce whose peer never comes ends at its own 3 s
    timeout (issued 0.3 s before the shutdown), with the timeout's error, and then the
    shutdown returns (ProcessGroupNCCL::shutdown flushes likewise)."""
    results, _, _ = scenario
    for rank in (0, 1):
        seen = results[rank]["shutdown"]
        assert 2.0 <= seen["close_s"] < SHORT.total_seconds() + 10.0 * TIME_SCALE, seen
        assert seen["completed"] is True, seen
        assert seen["error"] is not None and "DistBackendError" in seen["error"], seen
        assert "timed out" in seen["error"] and "in flight" not in seen["error"], seen


def test_recv_and_recv_any_never_take_the_same_message(scenario):
    results, _, _ = scenario
    assert results[0]["recv"]["bad"] == []


def test_abort_while_threads_issue_collectives(scenario):
    results, _, _ = scenario
    for rank, r in enumerate(results):
        stress = r["stress"]
        assert stress["threads_done"], (rank, stress)
        assert stress["abort_s"] < 5.0 * TIME_SCALE, (rank, stress)
        done = stress["works"]["ok"] + stress["works"]["error"] + stress["raised_at_issue"]
        assert done == 4 * 40, (rank, stress)


def test_abort_interrupts_a_collective_waiting_for_its_producers():
    """Asynchronous mock: an all_reduce issued behind 30 s of queued work on the caller's
    stream waits, on the glue's worker, for that work (its inputs' producers); abort() returns
    within seconds and the Work completes with an error naming that wait (an Event.synchronize()
    there kept abort() joining the worker until the stream got there)."""
    from support.python import json_result, run_python

    out = json_result(run_python("""
        import json, os, time
        import torch, torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        import accelkit.backends.mock
        from accelkit.backends.mock import _C

        dist.init_process_group("mock:mockccl", store=dist.HashStore(), rank=0, world_size=1)
        x = torch.ones(4, device="mock")
        dist.all_reduce(x)
        torch.mock.synchronize()
        _C._sleep(30000)
        work = dist.all_reduce(x, async_op=True)
        time.sleep(0.3)
        start = time.monotonic()
        c10d._abort_process_group()
        seen = {"abort_s": time.monotonic() - start, "completed": work.is_completed(),
                "error": str(work.exception())}
        print(json.dumps(seen), flush=True)
        os._exit(0)  # the stream still sleeps: do not wait for it at exit
    """, env={"ACCELKIT_MOCK_ASYNC": "1"}, timeout=300))
    assert out["abort_s"] < 5.0 * TIME_SCALE, out
    assert out["completed"] is True, out
    assert "waiting for the queued work that produces its inputs" in out["error"], out
    assert "aborted" in out["error"], out


def test_dropping_a_group_while_a_python_callback_runs_does_not_deadlock():
    """Python drops the last reference to a mockccl backend, holding the GIL, while a Work's
    Python callback (``get_future().then``) runs on the glue's worker and will need the GIL
    again: the destructor joins that worker without the GIL, so both finish (holding it
    through the join deadlocked). Asynchronous mock: the all_reduce waits behind 300 ms of
    queued work, so the callback is attached before the Work completes and runs on the
    worker, not inline."""
    from support.python import json_result, run_python

    out = json_result(run_python("""
        import json, threading, time
        from datetime import timedelta
        import torch, torch.distributed as dist
        import accelkit.backends.mock
        from accelkit.backends.mock import _C, mockccl

        backend = mockccl.connect(dist.HashStore(), 0, 1, timedelta(seconds=30))
        x = torch.ones(4, device="mock")
        torch.mock.synchronize()
        _C._sleep(300)
        ran = []
        work = backend.allreduce([x])
        future = work.get_future().then(lambda f: (
            time.sleep(0.3), ran.append(threading.current_thread() is threading.main_thread())))
        time.sleep(0.45)  # the callback sleeps on the worker
        start = time.monotonic()
        del work, future, backend
        print(json.dumps({"dropped_s": time.monotonic() - start, "ran": ran}))
    """, env={"ACCELKIT_MOCK_ASYNC": "1"}, timeout=60))
    assert out["ran"] == [False], out  # once, on the worker
    assert out["dropped_s"] < 5.0 * TIME_SCALE, out

if __name__ == "__main__":
    try:
        rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    except Exception:
        traceback.print_exc()
        raise
