"""mockccl failure behaviour on mock tensors: timeout, mismatch, dead peer, ranks on different
hosts, default backend with no backend string, and no shared memory left behind.

One pool of 3 rank processes runs the whole scenario (``python tests/mockccl/test_mockccl_failures.py`` is
the rank program; rank 2 is the one that misbehaves) and reports what each rank saw as JSON. It
runs twice: all ranks on one host, and across two hosts (ACCELKIT_MOCKCCL_HOSTID) with rank 2
beside rank 1, so rank 0 learns of rank 2's misdeeds only through rank 1's host — and must
still be told the same things, as fast.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
from support.python import TIME_SCALE
from support.ranks import build_extensions, spawn_ranks

WORLD = 3
GROUP_TIMEOUT_S = 2.0


def _outcome(fn):
    """Run fn(); return what happened as a JSON-able dict (type, message, seconds)."""
    start = time.monotonic()
    try:
        value = fn()
        return {"raised": None, "value": value, "seconds": time.monotonic() - start}
    except Exception as e:  # noqa: BLE001  (reported to the test process)
        return {"raised": type(e).__name__, "message": str(e), "seconds": time.monotonic() - start}


def rank_main(rank: int, world_size: int, out_path: str) -> None:
    import accelkit.backends.mock  # noqa: F401  (torch.mock and mockccl)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.mock.set_device(rank)
    seen: dict = {"pid": os.getpid()}

    def save():
        Path(out_path).write_text(json.dumps(seen))

    dev = torch.device("mock", rank)
    # No backend string on a mock machine: mock tensors through mockccl, CPU tensors through gloo.
    dist.init_process_group(rank=rank, world_size=world_size, timeout=timedelta(seconds=30))
    world = dist.group.WORLD
    seen["default_mock_backend"] = world._get_backend(dev).name()
    seen["default_cpu_backend"] = world._get_backend(torch.device("cpu")).name()
    t = torch.ones(3, device=dev)
    dist.all_reduce(t)
    c = torch.ones(3)
    dist.all_reduce(c)
    seen["default_sums"] = [t.cpu().tolist(), c.tolist()]

    # Coalescing groups do not nest and an end needs a start: clear errors, and the group's
    # coalescing still works afterwards (one Work for the group's two all_reduces).
    world._start_coalescing(dev)
    seen["nested_coalescing"] = _outcome(lambda: world._start_coalescing(dev))
    pair = [torch.ones(2, device=dev), torch.full((5,), 2.0, device=dev)]
    for x in pair:
        dist.all_reduce(x)
    group_work = world._end_coalescing(dev)
    group_work.wait()
    seen["coalesced_sums"] = [x.cpu().tolist() for x in pair]
    seen["end_without_start"] = _outcome(lambda: world._end_coalescing(dev))

    # A collective rank 2 never joins: the others time out, naming rank 2; rank 2 comes late
    # and finds the group aborted.
    timed = dist.new_group(timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    dist.all_reduce(torch.ones(1, device=dev), group=timed)  # seq 1 works
    if rank != 2:
        seen["timeout"] = _outcome(lambda: dist.all_reduce(torch.ones(4, device=dev), group=timed))
    else:
        time.sleep(GROUP_TIMEOUT_S + 1.5)
        seen["late"] = _outcome(lambda: dist.all_reduce(torch.ones(4, device=dev), group=timed))
    seen["after_timeout"] = _outcome(lambda: dist.all_reduce(torch.ones(1, device=dev),
                                                             group=timed))

    # Mismatches (rank 2 differs): raised on every rank, and the group stays usable.
    mixed = dist.new_group(timeout=timedelta(seconds=20))
    odd = rank == 2
    x16 = torch.ones(16, device=dev)
    cases = {
        "numel": lambda: dist.all_reduce(torch.ones(8 if odd else 16, device=dev), group=mixed),
        "dtype": lambda: dist.all_reduce(x16.double() if odd else x16, group=mixed),
        "op": lambda: dist.all_reduce(x16, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM,
                                      group=mixed),
        "root": lambda: dist.broadcast(x16, src=1 if odd else 0, group=mixed),
        "kind": lambda: (dist.all_gather_into_tensor(torch.empty(48, device=dev), x16, group=mixed)
                         if odd else dist.all_reduce(x16, group=mixed)),
        "alltoall_splits": lambda: dist.all_to_all_single(
            torch.empty(3, device=dev), torch.ones(3, device=dev),
            [1, 1, 1], [2, 0, 1] if odd else [1, 1, 1], group=mixed),
    }
    seen["mismatch"] = {name: _outcome(fn) for name, fn in cases.items()}
    ok = torch.full((5,), float(rank), device=dev)
    dist.all_reduce(ok, group=mixed)
    seen["after_mismatch"] = ok.cpu().tolist()
    # all_gather_coalesced's outputs as one list per input (torch's layout is one per rank):
    # refused on every rank alike, before anything is sent
    seen["coalesced_layout"] = _outcome(lambda: dist.all_gather_coalesced(
        [[torch.empty(2, device=dev) for _ in range(WORLD)]], [torch.ones(2, device=dev)],
        group=mixed))

    # A receive of the wrong size raises naming both sizes, and the message stays for the
    # receive of the right size: through shared memory and over TCP alike.
    pair = dist.new_group([0, 1], timeout=timedelta(seconds=20))
    if rank == 1:
        dist.send(torch.arange(8.0, device=dev), dst=0, group=pair, tag=5)
    if rank == 0:
        seen["recv_wrong_size"] = _outcome(
            lambda: dist.recv(torch.empty(4, device=dev), src=1, group=pair, tag=5))
        right = torch.empty(8, device=dev)
        seen["recv_right_size"] = _outcome(
            lambda: [dist.recv(right, src=1, group=pair, tag=5), right.cpu().tolist()])

    # A rank that leaves a group in order (destroys it): a receive from any source goes on with
    # the others; a receive from it and a collective that needs it raise at once, naming it.
    leaving = dist.new_group(timeout=timedelta(seconds=20))
    dist.all_reduce(torch.ones(1, device=dev), group=leaving)
    if rank == 2:
        dist.destroy_process_group(leaving)
    dist.barrier()
    if rank == 1:
        time.sleep(0.5)
        dist.send(torch.full((3,), 7.0, device=dev), dst=0, group=leaving)
    if rank == 0:
        got = torch.empty(3, device=dev)
        seen["recv_any_after_leave"] = _outcome(
            lambda: [dist.recv(got, group=leaving), got.cpu().tolist()])
        seen["recv_from_left"] = _outcome(
            lambda: dist.recv(torch.empty(3, device=dev), src=2, group=leaving))
    if rank != 2:
        seen["collective_after_leave"] = _outcome(
            lambda: dist.all_reduce(torch.ones(2, device=dev), group=leaving))

    # A peer that dies: the others fail fast (well within the 30 s timeout), naming it.
    doomed = dist.new_group(timeout=timedelta(seconds=30))
    dist.all_reduce(torch.ones(1, device=dev), group=doomed)
    if rank == 2:
        save()
        os._exit(3)
    seen["dead_peer"] = _outcome(lambda: dist.all_reduce(torch.ones(1 << 16, device=dev),
                                                         group=doomed))
    save()
    os._exit(0)  # the default group includes the dead rank: no orderly shutdown possible


def host_rank_main(rank: int, world_size: int, out_path: str) -> None:
    """Ranks whose hostnames differ (ranks 1 and 2 run in UTS namespaces of their own)."""
    import accelkit.backends.mock  # noqa: F401
    import torch
    import torch.distributed as dist

    torch.mock.set_device(rank)
    dist.init_process_group("mock:mockccl,cpu:gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=20))
    t = torch.full((2,), float(rank + 1), device=torch.device("mock", rank))
    dist.all_reduce(t)
    dist.destroy_process_group()
    Path(out_path).write_text(json.dumps({"host": os.uname().nodename, "sum": t.cpu().tolist()}))


def eager_rank_main(rank: int, world_size: int, out_path: str) -> None:
    """init_process_group(device_id=...): the binding survives mockccl's creator, DeviceMesh and
    split_group split the group (mock through mockccl, CPU through gloo), new_group still works."""
    import accelkit.backends.mock  # noqa: F401
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.mock.set_device(rank)
    dev = torch.device("mock", rank)
    dist.init_process_group("mock:mockccl,cpu:gloo", rank=rank, world_size=world_size, device_id=dev)
    seen = {"bound": str(dist.group.WORLD.bound_device_id)}
    mesh = init_device_mesh("mock", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    t = torch.ones(2, device=dev)
    dist.all_reduce(t, group=mesh.get_group("dp"))
    whole = dist.split_group(split_ranks=[list(range(world_size))])
    u, c = torch.ones(2, device=dev), torch.ones(2)
    dist.all_reduce(u, group=whole)
    dist.all_reduce(c, group=whole)
    pair = dist.new_group([0, 1])
    v = torch.ones(1, device=dev)
    if rank < 2:
        dist.all_reduce(v, group=pair)
    seen.update(dp=t.cpu().tolist(), split=u.cpu().tolist(), split_cpu=c.tolist(),
                pair=v.cpu().tolist())
    dist.destroy_process_group()
    Path(out_path).write_text(json.dumps(seen))


def test_eager_init_keeps_binding_and_splits(tmp_path):
    build_extensions()
    results, errs, codes = spawn_ranks(__file__, 4, tmp_path, extra_args=["eager"], timeout=90)
    assert codes == [0] * 4, "\n".join(e[-2000:] for e in errs)
    for rank, r in enumerate(results):
        assert r == {"bound": f"mock:{rank}", "dp": [2.0, 2.0], "split": [4.0, 4.0],
                     "split_cpu": [4.0, 4.0], "pair": [2.0] if rank < 2 else [1.0]}, r
    for err in errs:
        assert "No backend of type" not in err, err[-2000:]


def leftover_segments(pids) -> list[str]:
    """/dev/shm entries mockccl would have created for groups whose rank 0 had one of `pids`."""
    from accelkit.conformance.launchers.processes import SHM_PREFIX

    prefixes = tuple(f"{SHM_PREFIX}{pid}_" for pid in pids)
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefixes)]


#: The scenario's layouts: the host of each rank (None: all on this one).
LAYOUTS = {"one-host": None, "two-hosts": ("a", "b", "b")}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def scenario(request, tmp_path_factory):
    build_extensions()
    out = tmp_path_factory.mktemp("mockccl_failures")
    results, errs, codes = spawn_ranks(__file__, WORLD, out, timeout=90,
                                       hosts=LAYOUTS[request.param])
    return results, errs, codes


def test_ranks_exit_as_scripted(scenario):
    results, errs, codes = scenario
    assert codes == [0, 0, 3], "\n".join(e[-2000:] for e in errs)
    assert all(r is not None for r in results)


def test_no_backend_gives_mockccl_for_mock_and_gloo_for_cpu(scenario):
    results, _, _ = scenario
    for r in results:
        assert r["default_mock_backend"] == "mockccl"
        assert r["default_cpu_backend"] == "gloo"
        assert r["default_sums"] == [[3.0] * 3, [3.0] * 3]


def test_coalescing_misuse_is_refused_and_the_group_goes_on(scenario):
    results, _, _ = scenario
    for r in results:
        nested, unstarted = r["nested_coalescing"], r["end_without_start"]
        assert nested["raised"] is not None and "coalescing groups do not nest" in \
            nested["message"], nested
        assert unstarted["raised"] is not None and \
            "endCoalescing() without startCoalescing()" in unstarted["message"], unstarted
        assert r["coalesced_sums"] == [[3.0] * 2, [6.0] * 5]


def test_timeout_names_collective_seq_and_missing_rank(scenario):
    results, _, _ = scenario
    for rank in (0, 1):
        seen = results[rank]["timeout"]
        assert seen["raised"] == "DistBackendError", seen
        msg = seen["message"]
        assert "allreduce (seq 2) timed out after 2000 ms" in msg, msg
        assert "rank 2 did not join" in msg, msg
        assert GROUP_TIMEOUT_S - 0.1 * TIME_SCALE <= seen["seconds"] <= \
            GROUP_TIMEOUT_S + 2.0 * TIME_SCALE, seen


def test_group_is_unusable_after_a_timeout_on_every_rank(scenario):
    results, _, _ = scenario
    late = results[2]["late"]
    assert late["raised"] == "DistBackendError", late
    assert "aborted the group" in late["message"] and "timed out" in late["message"], late
    assert late["seconds"] < 1.0 * TIME_SCALE, late
    for rank in range(WORLD):
        after = results[rank]["after_timeout"]
        assert after["raised"] == "DistBackendError", after
        assert "failed earlier" in after["message"], after


MISMATCH_TEXT = {
    "numel": ("rank 0: allreduce seq 1, Float, 16 elements, op SUM",
              "rank 2: allreduce seq 1, Float, 8 elements, op SUM"),
    "dtype": ("rank 2: allreduce seq 2, Double, 16 elements",),
    "op": ("rank 1: allreduce seq 3, Float, 16 elements, op SUM",
           "rank 2: allreduce seq 3, Float, 16 elements, op MAX"),
    "root": ("rank 0: broadcast seq 4, Float, 16 elements, root 0",
             "rank 2: broadcast seq 4, Float, 16 elements, root 1"),
    "kind": ("rank 0: allreduce seq 5", "rank 2: allgather seq 5"),
}


@pytest.mark.parametrize("name", list(MISMATCH_TEXT))
def test_mismatch_raises_on_every_rank(scenario, name):
    results, _, _ = scenario
    for rank in range(WORLD):
        seen = results[rank]["mismatch"][name]
        assert seen["raised"] == "DistBackendError", (rank, seen)
        assert f"collective mismatch at seq {list(MISMATCH_TEXT).index(name) + 1}" in \
            seen["message"], seen
        for text in MISMATCH_TEXT[name]:
            assert text in seen["message"], (text, seen["message"])


def test_all_gather_coalesced_in_the_wrong_layout_is_refused_naming_it(scenario):
    results, _, _ = scenario
    for rank in range(WORLD):
        seen = results[rank]["coalesced_layout"]
        assert seen["raised"] is not None, (rank, seen)
        assert (f"allgather_coalesced takes one output list per rank ({WORLD}), each with one "
                "tensor per input, got 1 lists") in seen["message"], seen


def test_alltoall_split_mismatch_names_both_ranks(scenario):
    results, _, _ = scenario
    for rank in range(WORLD):
        seen = results[rank]["mismatch"]["alltoall_splits"]
        assert seen["raised"] == "DistBackendError", (rank, seen)
        assert "split sizes disagree: rank 2 sends 2 elements to rank 0, which expects 1" in \
            seen["message"], seen


def test_group_still_works_after_mismatches(scenario):
    results, _, _ = scenario
    for r in results:
        assert r["after_mismatch"] == [3.0] * 5


def test_dead_peer_fails_fast_naming_it(scenario):
    results, _, _ = scenario
    pid2 = results[2]["pid"]
    for rank in (0, 1):
        seen = results[rank]["dead_peer"]
        assert seen["raised"] == "DistBackendError", seen
        assert f"rank 2 (pid {pid2}) exited" in seen["message"], seen
        assert seen["seconds"] < 10 * TIME_SCALE, seen  # the group timeout is 30 s


def test_a_receive_of_the_wrong_size_leaves_the_message_for_the_right_one(scenario):
    results, _, _ = scenario
    wrong, right = results[0]["recv_wrong_size"], results[0]["recv_right_size"]
    assert wrong["raised"] == "DistBackendError", wrong
    assert "expected 16 bytes with tag 5 from rank 1, but rank 1 sent 32 bytes" in \
        wrong["message"], wrong
    assert right["raised"] is None and right["value"] == [1, list(map(float, range(8)))], right


def test_a_rank_that_left_in_order_is_skipped_by_receives_from_any_source(scenario):
    results, _, _ = scenario
    any_source = results[0]["recv_any_after_leave"]
    assert any_source["raised"] is None and any_source["value"] == [1, [7.0] * 3], any_source
    from_left = results[0]["recv_from_left"]
    assert from_left["raised"] == "DistBackendError", from_left
    assert "rank 2" in from_left["message"] and "left the group (shut it down) with no " \
        "message with tag 0 for this receive" in from_left["message"], from_left
    assert from_left["seconds"] < 2 * TIME_SCALE, from_left  # the group's timeout is 20 s
    for rank in (0, 1):
        collective = results[rank]["collective_after_leave"]
        assert collective["raised"] == "DistBackendError", (rank, collective)
        assert "rank 2" in collective["message"] and "has left the group (shut it down) and " \
            "cannot take part" in collective["message"], (rank, collective)
        assert collective["seconds"] < 5 * TIME_SCALE, (rank, collective)


def test_no_shared_memory_left_after_crash_and_timeouts(scenario):
    results, _, _ = scenario
    assert leftover_segments([r["pid"] for r in results]) == []


def test_no_default_backend_warning_at_shutdown(scenario):
    _, errs, _ = scenario
    for err in errs:
        assert "No backend of type" not in err, err[-2000:]


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(
    ["unshare", "--uts", "true"], capture_output=True).returncode != 0,
    reason="needs `unshare --uts` (root) to give one rank another hostname")
def test_ranks_on_different_hosts_connect(tmp_path):
    """Ranks whose hostnames differ (no ACCELKIT_MOCKCCL_HOSTID) form one group that reduces
    right: mockccl tells hosts apart by hostname and joins them over TCP."""
    build_extensions()

    def prefix(rank):
        if rank == 0:
            return []
        return ["unshare", "--uts", "sh", "-c", 'hostname mockccl-other-host && exec "$@"', "sh"]

    results, errs, codes = spawn_ranks(__file__, 3, tmp_path, extra_args=["hosts"], prefix=prefix,
                                       timeout=60)
    assert codes == [0, 0, 0], "\n".join(e[-2000:] for e in errs)
    here = os.uname().nodename
    assert [r["host"] for r in results] == [here, "mockccl-other-host", "mockccl-other-host"]
    for r in results:
        assert r["sum"] == [6.0, 6.0], r


def _hosts_unavailable() -> str | None:
    from accelkit.conformance.launchers.hosts import unavailable

    return unavailable()


def test_a_host_whose_name_is_on_loopback_publishes_an_address_the_others_reach(tmp_path):
    """As torchrun sets it, MASTER_ADDR is rank 0's hostname, which many installs map to
    127.0.1.1 on that host: mockccl never publishes a loopback address for a group that spans
    hosts (the other host would dial its own loopback), so the two ranks on two simulated hosts
    whose names are on loopback connect and reduce right."""
    if why := _hosts_unavailable():
        pytest.skip(why)
    from accelkit.conformance.launchers.hosts import Hosts, worker_env

    build_extensions()
    with Hosts(2, name_on_loopback=True) as hosts:
        env = {"MASTER_ADDR": hosts.hostname(0), "MASTER_PORT": str(hosts.port()),
               "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        resolved = hosts.run(0, ["getent", "hosts", hosts.hostname(0)]).stdout.split()[0]
        procs = [hosts.popen(rank, [sys.executable, __file__, str(rank), "2",
                                    str(tmp_path / f"rank{rank}.json"), "hosts"],
                             env=worker_env(env), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
                 for rank in range(2)]
        logs = [p.communicate(timeout=120)[0] for p in procs]
    assert resolved == "127.0.1.1"
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-2000:] for log in logs)
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"host": f"accelkit-host{rank}", "sum": [3.0, 3.0]}, seen


def bad_interface_rank_main(rank: int, world_size: int, out_path: str) -> None:
    """A group across two hosts whose ACCELKIT_MOCKCCL_SOCKET_IFNAME names no interface."""
    import accelkit.backends.mock  # noqa: F401
    import torch.distributed as dist

    # The store is the rank program's, not init_process_group's: a failed init would drop
    # its own, and with it rank 0's server, under another rank still joining through it.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          rank == 0, timeout=timedelta(seconds=20))
    outcome = _outcome(lambda: dist.init_process_group(
        "mock:mockccl,cpu:gloo", rank=rank, world_size=world_size, store=store,
        timeout=timedelta(seconds=20)))
    Path(out_path).write_text(json.dumps({"init": outcome}))
    # rank 0 hosts the store the others may still be joining: it stays until every rank wrote
    others = [Path(out_path).with_name(f"rank{r}.json") for r in range(world_size)]
    deadline = time.monotonic() + 30
    while rank == 0 and not all(o.exists() for o in others) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_bad_interface_is_refused_naming_the_setting(tmp_path):
    """Across hosts, ACCELKIT_MOCKCCL_SOCKET_IFNAME naming no interface fails the group's
    creation on every rank with the setting, the interfaces there are and what to set, at once
    (not at the connect timeout)."""
    build_extensions()
    results, errs, codes = spawn_ranks(
        __file__, 2, tmp_path, extra_args=["bad-interface"], timeout=60,
        env={"ACCELKIT_MOCKCCL_SOCKET_IFNAME": "accelkit-no-such-if"},
        prefix=lambda rank: ["env", f"ACCELKIT_MOCKCCL_HOSTID=host{rank}"])
    assert codes == [0, 0], "\n".join(e[-2000:] for e in errs)
    for r in results:
        init = r["init"]
        assert init["raised"] is not None, init
        assert ("mockccl: ACCELKIT_MOCKCCL_SOCKET_IFNAME=accelkit-no-such-if names no interface "
                "with an IPv4 address on this host (there are: lo 127.0.0.1") in init["message"], init
        assert "set it to the interface the hosts reach each other on" in init["message"], init
        assert init["seconds"] < 15 * TIME_SCALE, init


if __name__ == "__main__":
    main = {"hosts": host_rank_main, "eager": eager_rank_main,
            "bad-interface": bad_interface_rank_main}.get(sys.argv[4] if sys.argv[4:] else "",
                                                          rank_main)
    try:
        main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    except Exception:
        traceback.print_exc()
        raise


@pytest.mark.parametrize(("variable", "value"), [
    ("ACCELKIT_MOCKCCL_P2P_BYTES", "100"),
    ("ACCELKIT_MOCKCCL_P2P_BYTES", str(1 << 62)),
    ("ACCELKIT_MOCKCCL_CHUNK_BYTES", str(1 << 62)),
    ("ACCELKIT_MOCKCCL_CHUNK_BYTES", "-4096"),
    ("ACCELKIT_MOCKCCL_KEPT_BYTES", str(1 << 40)),
    ("ACCELKIT_MOCKCCL_KEPT_BYTES", "lots"),
])
def test_bad_transport_sizes_are_refused_naming_the_setting(variable, value):
    """A size setting outside its range (below a page, or so large that the segment's
    arithmetic would wrap and a small segment be mapped with slots past its end) is refused
    with the setting and its range where a group's segment is sized (mockccl's segment_bytes,
    as at connect), and a group of no ranks with what it needs."""
    script = ("from accelkit.backends.mock.mockccl import extension\n"
              "for n in (0, 4):\n"
              "    try:\n"
              "        print(extension().segment_bytes(n))\n"
              "    except RuntimeError as e:\n"
              "        print(str(e).splitlines()[0])\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, variable: value})
    assert proc.returncode == 0, proc.stderr[-2000:]
    high = {"ACCELKIT_MOCKCCL_KEPT_BYTES": 64 << 30}.get(variable, 1 << 30)
    assert proc.stdout.splitlines() == [
        "mockccl: a group has at least one rank, got 0",
        f"{variable}={value} must be a number of bytes from 4096 to {high}"], proc.stdout
