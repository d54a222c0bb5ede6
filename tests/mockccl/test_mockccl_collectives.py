"""mockccl collectives on mock tensors against locally computed references.

One pool of rank processes per world size (2 and 4) runs every case of :data:`CASES` in one go
(``python tests/mockccl/test_mockccl_collectives.py`` is the rank program) and reports a JSON object
``{case: "ok" | error}``; the tests are parametrized over those results. Every rank knows every
rank's input (a deterministic function of rank and case), so each checks its own output.

A third pool runs the 4-rank cases with the ranks on three hosts (:data:`HOSTS`, given by
``ACCELKIT_MOCKCCL_HOSTID``): mockccl's inter-host path (mockccl_hosts.h) with a host of two
ranks that are not neighbours and two hosts of one rank, so every collective's leaders, root
hand-overs and rank placement are exercised.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from pathlib import Path

import pytest
from support.ranks import build_extensions, spawn_ranks

WORLD_SIZES = (2, 4)
#: The host of each rank in the pool across hosts.
HOSTS = ("a", "b", "a", "c")


# ----------------------------------------------------------------------------------------------
# Rank side: the cases. Registered by name; `world` restricts a case to some world sizes.

CASES: dict[str, tuple] = {}


def case(name, world=WORLD_SIZES):
    def register(fn):
        CASES[name] = (fn, tuple(world))
        return fn

    return register


class Ctx:
    """What a case sees: its rank, the world size, its mock device, and input builders."""

    def __init__(self, rank, world_size, hosts=None):
        import torch

        self.rank, self.ws = rank, world_size
        #: The ranks of this rank's host (all of them on one host).
        self.host_size = world_size if hosts is None else hosts.count(hosts[rank])
        self.dev = torch.device("mock", rank)

    def inp(self, rank, shape, dtype, salt=0, low=-3, high=4):
        """The CPU tensor rank `rank` contributes: small integers, deterministic."""
        import torch

        g = torch.Generator().manual_seed(1000 * rank + salt)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=g).bool()
        if dtype.is_complex:
            re = torch.randint(low, high, shape, generator=g).double()
            im = torch.randint(low, high, shape, generator=g).double()
            return torch.complex(re, im).to(dtype)
        if not dtype.is_floating_point and not dtype.is_signed:
            low = 0
        return torch.randint(low, high, shape, generator=g).to(dtype)

    def all_inp(self, shape, dtype, salt=0, **kw):
        return [self.inp(r, shape, dtype, salt, **kw) for r in range(self.ws)]

    def on(self, t):
        return t.to(self.dev)


def check_equal(got, want):
    import torch

    got = got.cpu()
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    if want.dtype.is_floating_point or want.dtype.is_complex:
        torch.testing.assert_close(got, want, rtol=1e-2 if want.element_size() <= 2 else 1e-5,
                                   atol=1e-2 if want.element_size() <= 2 else 1e-5)
    else:
        assert torch.equal(got, want), f"got {got.flatten()[:8]} want {want.flatten()[:8]}"


def reference(op_name, inputs, world_size):
    """The reduction of `inputs` (one per rank) as mockccl defines it."""
    import torch

    dtype = inputs[0].dtype
    low = dtype in (torch.float16, torch.bfloat16)
    acc = [x.float() if low else x for x in inputs]
    if dtype == torch.bool:
        stacked = torch.stack(acc)
        if op_name in ("SUM", "MAX", "BOR"):
            return stacked.any(0)
        if op_name == "BXOR":
            return stacked.sum(0) % 2 == 1
        return stacked.all(0)
    if op_name == "PREMUL_SUM":
        return functools.reduce(lambda a, b: a + b, [(x * 2.0).to(dtype) for x in inputs])
    if op_name in ("SUM", "AVG"):
        out = functools.reduce(lambda a, b: a + b, acc).to(dtype)
        return out / world_size if op_name == "AVG" else out
    fn = {"PRODUCT": lambda a, b: a * b, "MIN": torch.minimum, "MAX": torch.maximum,
          "BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op_name]
    return functools.reduce(fn, acc).to(dtype)


def reduce_op(op_name):
    import torch.distributed as dist

    if op_name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(2.0)
    return getattr(dist.ReduceOp, op_name)


ALLREDUCE_MATRIX = {
    "float32": ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"),
    "float16": ("SUM", "AVG", "MAX", "PREMUL_SUM"),
    "bfloat16": ("SUM", "AVG", "MIN"),
    "float64": ("SUM", "PRODUCT", "MAX"),
    "complex64": ("SUM", "AVG"),
    "int8": ("SUM", "MAX", "BAND", "BOR", "BXOR"),
    "uint8": ("SUM", "MIN", "BXOR"),
    "int16": ("SUM", "PRODUCT"),
    "int32": ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"),
    "int64": ("SUM", "MAX", "BXOR"),
    "bool": ("SUM", "MIN", "MAX", "BXOR"),
}
#: Elements: one, a small message (each rank reduces all of it), large ones (several rounds of
#: the 512 KiB chunk, each rank reducing a part; 262_244 float32 ends with a small round), zero.
SIZES = (1, 1000, 700_000, 262_244, 0)
LARGE = (700_000, 262_244)


def _allreduce_case(dtype_name, op_name, n):
    def run(c):
        import torch
        import torch.distributed as dist

        dtype = getattr(torch, dtype_name)
        inputs = c.all_inp((n,), dtype, salt=n)
        t = c.on(inputs[c.rank])
        dist.all_reduce(t, op=reduce_op(op_name))
        check_equal(t, reference(op_name, inputs, c.ws))

    return run


for _dt, _ops in ALLREDUCE_MATRIX.items():
    for _op in _ops:
        for _n in SIZES:
            if _n in LARGE and _dt not in ("float32", "bfloat16", "int64"):
                continue
            case(f"allreduce-{_dt}-{_op}-{_n}")(_allreduce_case(_dt, _op, _n))


@case("allreduce-noncontiguous")
def _(c):
    import torch
    import torch.distributed as dist

    inputs = c.all_inp((6, 8), torch.float32)
    t = c.on(inputs[c.rank]).t()  # a transposed view
    assert not t.is_contiguous()
    dist.all_reduce(t)
    check_equal(t, reference("SUM", inputs, c.ws).t())


@case("allreduce-slice-of-larger-tensor")
def _(c):
    import torch
    import torch.distributed as dist

    inputs = c.all_inp((10,), torch.float32)
    base = c.on(torch.full((30,), 7.0))
    view = base[10:20]
    view.copy_(c.on(inputs[c.rank]))
    dist.all_reduce(view)
    check_equal(base[:10], torch.full((10,), 7.0))
    check_equal(base[10:20], reference("SUM", inputs, c.ws))
    check_equal(base[20:], torch.full((10,), 7.0))


@case("allreduce-errors-name-the-problem")
def _(c):
    import torch
    import torch.distributed as dist

    for tensor, op, text in [
        (c.on(torch.ones(2)), dist.ReduceOp.BAND, "bitwise reduce op needs an integer"),
        (c.on(torch.ones(2, dtype=torch.int32)), dist.ReduceOp.AVG, "AVG needs a floating-point"),
        (c.on(torch.ones(2, dtype=torch.complex64)), dist.ReduceOp.MAX, "complex tensors"),
    ]:
        try:
            dist.all_reduce(tensor, op=op)
        except Exception as e:  # noqa: BLE001
            assert text in str(e), str(e)
        else:
            raise AssertionError(f"no error for {op} on {tensor.dtype}")
    dist.barrier()


@case("allreduce-cpu-tensor-goes-through-gloo")
def _(c):
    import torch
    import torch.distributed as dist

    inputs = c.all_inp((5,), torch.float32)
    t = inputs[c.rank].clone()
    dist.all_reduce(t)
    check_equal(t, reference("SUM", inputs, c.ws))


@case("allreduce-async-overlap")
def _(c):
    import torch
    import torch.distributed as dist

    ins = [c.all_inp((1000 * (i + 1),), torch.float32, salt=i) for i in range(4)]
    ts = [c.on(x[c.rank]) for x in ins]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    fut = works[-1].get_future()
    for w in works:
        w.wait()
        assert w.is_completed()
    assert fut.done()
    result = fut.value()
    assert isinstance(result, list) and result[0] is not None
    check_equal(result[0], reference("SUM", ins[-1], c.ws))
    for t, x in zip(ts, ins, strict=True):
        check_equal(t, reference("SUM", x, c.ws))


@case("allreduce-future-then")
def _(c):
    import torch
    import torch.distributed as dist

    inputs = c.all_inp((16,), torch.float32)
    t = c.on(inputs[c.rank])
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check_equal(fut.wait(), reference("SUM", inputs, c.ws) * 2)


@case("allreduce-coalesced")
def _(c):
    import torch
    import torch.distributed as dist

    a = c.all_inp((7,), torch.float32, salt=1)
    b = c.all_inp((3, 3), torch.float32, salt=2)
    ts = [c.on(a[c.rank]), c.on(b[c.rank])]
    dist.all_reduce_coalesced(ts)
    check_equal(ts[0], reference("SUM", a, c.ws))
    check_equal(ts[1], reference("SUM", b, c.ws))


@case("broadcast")
def _(c):
    import torch
    import torch.distributed as dist

    for root in (0, c.ws - 1):
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex128):
            for n in (0, 1, 300_000):
                inputs = c.all_inp((n,), dtype, salt=root)
                t = c.on(inputs[c.rank])
                dist.broadcast(t, src=root)
                check_equal(t, inputs[root])


@case("broadcast-noncontiguous")
def _(c):
    import torch
    import torch.distributed as dist

    inputs = c.all_inp((4, 6), torch.float32)
    t = c.on(inputs[c.rank])[:, ::2]
    dist.broadcast(t, src=1)
    check_equal(t, inputs[1][:, ::2])


@case("reduce")
def _(c):
    import torch
    import torch.distributed as dist

    for root in (0, c.ws - 1):
        for dtype, op in ((torch.float32, "SUM"), (torch.int32, "MAX"), (torch.float16, "SUM"),
                          (torch.float32, "PRODUCT")):
            for n in (1, 100_000):
                inputs = c.all_inp((n,), dtype, salt=root)
                t = c.on(inputs[c.rank])
                dist.reduce(t, dst=root, op=reduce_op(op))
                if c.rank == root:
                    check_equal(t, reference(op, inputs, c.ws))


@case("all_gather-list")
def _(c):
    import torch
    import torch.distributed as dist

    for dtype in (torch.float32, torch.int8, torch.bool, torch.complex64):
        for shape in ((3, 2), (0,), (300_000,)):
            inputs = c.all_inp(shape, dtype)
            outs = [c.on(torch.zeros(shape, dtype=dtype)) for _ in range(c.ws)]
            dist.all_gather(outs, c.on(inputs[c.rank]))
            for o, x in zip(outs, inputs, strict=True):
                check_equal(o, x)


@case("all_gather_into_tensor")
def _(c):
    import torch
    import torch.distributed as dist

    for dtype in (torch.float32, torch.float16, torch.int64):
        for n in (1, 5, 400_000):
            inputs = c.all_inp((n,), dtype)
            out = c.on(torch.empty(c.ws * n, dtype=dtype))
            dist.all_gather_into_tensor(out, c.on(inputs[c.rank]))
            check_equal(out, torch.cat(inputs))
    inputs = c.all_inp((2, 3), torch.float32)
    out = c.on(torch.empty(c.ws * 2, 3))
    dist.all_gather_into_tensor(out, c.on(inputs[c.rank]))  # stacked along dim 0
    check_equal(out, torch.cat(inputs))


@case("all_gather_single")
def _(c):
    import torch
    import torch.distributed as dist

    inputs = c.all_inp((4,), torch.float32)
    out = c.on(torch.empty(c.ws * 4))
    dist.all_gather_single(out, c.on(inputs[c.rank]))
    check_equal(out, torch.cat(inputs))


@case("all_gather-noncontiguous-output")
def _(c):
    import torch
    import torch.distributed as dist

    inputs = c.all_inp((3,), torch.float32)
    big = c.on(torch.zeros(c.ws * 3, 2))
    out = big[:, 1]  # stride 2
    dist.all_gather_into_tensor(out, c.on(inputs[c.rank]))
    check_equal(big[:, 1], torch.cat(inputs))
    check_equal(big[:, 0], torch.zeros(c.ws * 3))


@case("reduce_scatter-list")
def _(c):
    import torch
    import torch.distributed as dist

    for dtype, op in ((torch.float32, "SUM"), (torch.int32, "MAX"), (torch.bfloat16, "SUM"),
                      (torch.float32, "AVG")):
        for n in (1, 6, 200_000):
            chunks = [c.all_inp((n,), dtype, salt=d) for d in range(c.ws)]  # [dst][rank]
            out = c.on(torch.zeros(n, dtype=dtype))
            dist.reduce_scatter(out, [c.on(chunks[d][c.rank]) for d in range(c.ws)],
                                op=reduce_op(op))
            check_equal(out, reference(op, chunks[c.rank], c.ws))


@case("reduce_scatter_tensor")
def _(c):
    import torch
    import torch.distributed as dist

    for dtype, op in ((torch.float32, "SUM"), (torch.float16, "SUM"), (torch.int64, "MIN"),
                      (torch.float32, "PREMUL_SUM")):
        for n in (1, 9, 200_000):
            inputs = c.all_inp((c.ws * n,), dtype)
            out = c.on(torch.zeros(n, dtype=dtype))
            dist.reduce_scatter_tensor(out, c.on(inputs[c.rank]), op=reduce_op(op))
            want = reference(op, inputs, c.ws)[c.rank * n:(c.rank + 1) * n]
            check_equal(out, want)


@case("reduce_scatter_single")
def _(c):
    import torch
    import torch.distributed as dist

    inputs = c.all_inp((c.ws * 3,), torch.float32)
    out = c.on(torch.zeros(3))
    dist.reduce_scatter_single(out, c.on(inputs[c.rank]))
    check_equal(out, reference("SUM", inputs, c.ws)[c.rank * 3:(c.rank + 1) * 3])


@case("all_to_all_single-equal")
def _(c):
    import torch
    import torch.distributed as dist

    for dtype in (torch.float32, torch.int16, torch.complex64):
        for rows in (1, 50_000):
            inputs = c.all_inp((c.ws * rows, 2), dtype)
            out = c.on(torch.empty(c.ws * rows, 2, dtype=dtype))
            dist.all_to_all_single(out, c.on(inputs[c.rank]))
            want = torch.cat([x[c.rank * rows:(c.rank + 1) * rows] for x in inputs])
            check_equal(out, want)


@case("all_to_all_single-uneven")
def _(c):
    import torch
    import torch.distributed as dist

    def split(src, dst):  # rows src sends to dst; some zero
        return (src + 2 * dst) % 3 * (1 + 40_000 * (src == dst == 0))

    inputs = [c.inp(r, (sum(split(r, d) for d in range(c.ws)), 3), torch.float32)
              for r in range(c.ws)]
    in_splits = [split(c.rank, d) for d in range(c.ws)]
    out_splits = [split(s, c.rank) for s in range(c.ws)]
    out = c.on(torch.empty(sum(out_splits), 3))
    dist.all_to_all_single(out, c.on(inputs[c.rank]), out_splits, in_splits)
    parts = []
    for s in range(c.ws):
        start = sum(split(s, d) for d in range(c.rank))
        parts.append(inputs[s][start:start + split(s, c.rank)])
    check_equal(out, torch.cat(parts))


@case("all_to_all-list")
def _(c):
    import torch
    import torch.distributed as dist

    def piece(src, dst):
        return c.inp(src, (dst + 1, 2), torch.int32, salt=dst)

    outs = [c.on(torch.empty(c.rank + 1, 2, dtype=torch.int32)) for _ in range(c.ws)]
    dist.all_to_all(outs, [c.on(piece(c.rank, d)) for d in range(c.ws)])
    for s in range(c.ws):
        check_equal(outs[s], piece(s, c.rank))


@case("gather")
def _(c):
    import torch
    import torch.distributed as dist

    for root in (0, c.ws - 1):
        inputs = c.all_inp((5,), torch.float64, salt=root)
        outs = [c.on(torch.zeros(5, dtype=torch.float64)) for _ in range(c.ws)]
        dist.gather(c.on(inputs[c.rank]), outs if c.rank == root else None, dst=root)
        if c.rank == root:
            for o, x in zip(outs, inputs, strict=True):
                check_equal(o, x)


@case("scatter")
def _(c):
    import torch
    import torch.distributed as dist

    for root in (0, c.ws - 1):
        for n in (3, 300_000):
            pieces = [c.inp(root, (n,), torch.int64, salt=d) for d in range(c.ws)]
            out = c.on(torch.zeros(n, dtype=torch.int64))
            dist.scatter(out, [c.on(p) for p in pieces] if c.rank == root else None, src=root)
            check_equal(out, pieces[c.rank])


@case("send-recv-ring")
def _(c):
    import torch
    import torch.distributed as dist

    for n in (0, 3, 700_000):  # 2.8 MB: several mailbox chunks (1 MiB a pair at 2 ranks)
        right, left = (c.rank + 1) % c.ws, (c.rank - 1) % c.ws
        mine = c.inp(c.rank, (n,), torch.float32, salt=n)
        got = c.on(torch.zeros(n))
        if c.rank % 2 == 0:
            dist.send(c.on(mine), right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(c.on(mine), right)
        check_equal(got, c.inp(left, (n,), torch.float32, salt=n))


@case("segment-grows-linearly-with-the-group")
def _(c):
    """A group's shared-memory segment is the size ``segment_bytes`` computes for the group's
    ranks on this host (read from this process's mapping of it), and that size grows linearly
    with the group: a fixed mailbox per pair of ranks made it quadratic (1 GiB at 64 ranks)."""
    from accelkit.backends.mock.mockccl import extension
    from accelkit.conformance.launchers.processes import SHM_PREFIX

    with open("/proc/self/maps") as maps:
        spans = [line.split()[0] for line in maps if SHM_PREFIX in line]
    assert spans, "no mockccl segment mapped in this rank"
    sizes = {int(hi, 16) - int(lo, 16) for lo, hi in (s.split("-") for s in spans)}
    page = os.sysconf("SC_PAGE_SIZE")
    expected = -(-extension().segment_bytes(c.host_size) // page) * page
    assert expected in sizes, f"mapped segments {sorted(sizes)}, expected one of {expected} bytes"
    at = {n: extension().segment_bytes(n) for n in (16, 64, 256)}
    assert at[64] < 4.5 * at[16] and at[256] < 4.5 * at[64], f"segment bytes by size: {at}"
    assert at[64] < 256 << 20, f"a 64-rank group maps {at[64] >> 20} MiB"


@case("isend-irecv-batch-both-directions")
def _(c):
    import torch
    import torch.distributed as dist

    peer = c.rank ^ 1
    if peer >= c.ws:
        return
    n = 500_000  # larger than a mailbox: both ranks send before receiving
    got = c.on(torch.zeros(n))
    ops = [dist.P2POp(dist.isend, c.on(c.inp(c.rank, (n,), torch.float32)), peer),
           dist.P2POp(dist.irecv, got, peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check_equal(got, c.inp(peer, (n,), torch.float32))


@case("recv-any-source")
def _(c):
    import torch
    import torch.distributed as dist

    if c.rank == 0:
        seen = set()
        for _ in range(c.ws - 1):
            t = c.on(torch.zeros(2))
            src = dist.recv(t)
            check_equal(t, torch.full((2,), float(src)))
            seen.add(src)
        assert seen == set(range(1, c.ws)), seen
    else:
        dist.send(c.on(torch.full((2,), float(c.rank))), 0)


@case("barrier-on-mock")
def _(c):
    import torch.distributed as dist

    dist.barrier(device_ids=[c.rank])
    dist.barrier()


@case("coalescing-manager")
def _(c):
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    ins = [c.all_inp((4,), torch.float32, salt=i) for i in range(2)]
    outs = [c.on(torch.empty(c.ws * 4)) for _ in range(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, x in zip(outs, ins, strict=True):
            dist.all_gather_into_tensor(o, c.on(x[c.rank]))
    cm.wait()
    for o, x in zip(outs, ins, strict=True):
        check_equal(o, torch.cat(x))
    rs_in = [c.all_inp((c.ws * 2,), torch.float32, salt=5 + i) for i in range(2)]
    rs_out = [c.on(torch.empty(2)) for _ in range(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, x in zip(rs_out, rs_in, strict=True):
            dist.reduce_scatter_tensor(o, c.on(x[c.rank]))
    cm.wait()
    for o, x in zip(rs_out, rs_in, strict=True):
        check_equal(o, reference("SUM", x, c.ws)[c.rank * 2:(c.rank + 1) * 2])


@case("functional-collectives")
def _(c):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    x = c.all_inp((4, 2), torch.float32)
    check_equal(funcol.all_reduce(c.on(x[c.rank]), "sum", group), reference("SUM", x, c.ws))
    check_equal(funcol.all_gather_tensor(c.on(x[c.rank]), 0, group), torch.cat(x))
    y = c.all_inp((c.ws * 2, 3), torch.float32, salt=3)
    check_equal(funcol.reduce_scatter_tensor(c.on(y[c.rank]), "sum", 0, group),
                reference("SUM", y, c.ws)[c.rank * 2:(c.rank + 1) * 2])
    z = c.all_inp((c.ws,), torch.float32, salt=4)
    check_equal(funcol.all_to_all_single(c.on(z[c.rank]), None, None, group),
                torch.stack([t[c.rank] for t in z]))
    outs = funcol.all_gather_into_tensor_coalesced([c.on(x[c.rank]), c.on(z[c.rank])], group)
    check_equal(outs[0], torch.cat(x))
    check_equal(outs[1], torch.cat(z))
    outs = funcol.reduce_scatter_tensor_coalesced([c.on(y[c.rank]), c.on(z[c.rank])],
                                                  "sum", [0, 0], group)
    check_equal(outs[0], reference("SUM", y, c.ws)[c.rank * 2:(c.rank + 1) * 2])
    check_equal(outs[1], reference("SUM", z, c.ws)[c.rank:c.rank + 1])
    w = funcol.all_reduce_coalesced([c.on(x[c.rank]), c.on(z[c.rank])], "max", group)
    check_equal(w[0], reference("MAX", x, c.ws))
    check_equal(w[1], reference("MAX", z, c.ws))


@case("new_group-subgroups-concurrently", world=(4,))
def _(c):
    import torch
    import torch.distributed as dist

    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    mine = evens if c.rank % 2 == 0 else odds
    members = [0, 2] if c.rank % 2 == 0 else [1, 3]
    inputs = {r: c.inp(r, (1000,), torch.float32, salt=9) for r in range(c.ws)}
    big = {r: c.inp(r, (400_000,), torch.float32, salt=8) for r in range(c.ws)}
    t = c.on(inputs[c.rank])
    u = c.on(big[c.rank])
    w1 = dist.all_reduce(t, group=mine, async_op=True)
    w2 = dist.all_reduce(u, async_op=True)  # the world group at the same time
    w1.wait()
    w2.wait()
    check_equal(t, reference("SUM", [inputs[r] for r in members], 2))
    check_equal(u, reference("SUM", [big[r] for r in range(c.ws)], c.ws))
    out = c.on(torch.empty(2 * 1000))
    dist.all_gather_into_tensor(out, c.on(inputs[c.rank]), group=mine)
    check_equal(out, torch.cat([inputs[r] for r in members]))
    b = c.on(inputs[c.rank])
    dist.broadcast(b, group_src=1, group=mine)
    check_equal(b, inputs[members[1]])


@case("device_mesh-2d", world=(4,))
def _(c):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("mock", (2, 2), mesh_dim_names=("dp", "tp"))
    layout = torch.arange(4).view(2, 2)
    for dim, name in enumerate(("dp", "tp")):
        group = mesh.get_group(name)
        assert dist.get_backend(group) is not None
        coord = mesh.get_coordinate()
        members = (layout[:, coord[1]] if dim == 0 else layout[coord[0], :]).tolist()
        inputs = {r: c.inp(r, (8,), torch.float32, salt=dim) for r in members}
        t = c.on(inputs[c.rank])
        dist.all_reduce(t, group=group)
        check_equal(t, reference("SUM", [inputs[r] for r in members], 2))


@case("dtensor-redistribute", world=(4,))
def _(c):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("mock", (c.ws,))
    full = torch.arange(c.ws * 6, dtype=torch.float32).view(c.ws * 2, 3)
    d = distribute_tensor(full.to(c.dev), mesh, [Shard(0)])
    check_equal(d.redistribute(mesh, [Replicate()]).to_local(), full)
    check_equal(d.full_tensor(), full)
    s1 = d.redistribute(mesh, [Shard(1)]) if full.shape[1] % c.ws == 0 else d
    check_equal(s1.full_tensor(), full)


@case("seq-number-and-backend-name")
def _(c):
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD
    backend = pg._get_backend(c.dev)
    assert backend.name() == "mockccl", backend.name()
    before = backend._get_sequence_number_for_group()
    dist.all_reduce(c.on(torch.ones(1)))
    assert backend._get_sequence_number_for_group() == before + 1


def rank_main(rank: int, world_size: int, out_path: str, hosts: str | None = None) -> None:
    """Run every case for this world size; write {case: "ok" | error} as JSON. `hosts`: the
    comma-separated host of every rank, when they are set with ACCELKIT_MOCKCCL_HOSTID."""
    import accelkit.backends.mock  # noqa: F401  (torch.mock and mockccl)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.mock.set_device(rank)
    dist.init_process_group("mock:mockccl,cpu:gloo", rank=rank, world_size=world_size,
                            timeout=__import__("datetime").timedelta(seconds=20))
    c = Ctx(rank, world_size, hosts.split(",") if hosts else None)
    results = {}
    for name, (fn, worlds) in CASES.items():
        if world_size not in worlds:
            continue
        try:
            fn(c)
            results[name] = "ok"
        except Exception:  # noqa: BLE001  (reported to the test process)
            results[name] = traceback.format_exc(limit=4)[-1500:]
    dist.destroy_process_group()
    Path(out_path).write_text(json.dumps(results))


# ----------------------------------------------------------------------------------------------
# Test side: one pool of rank processes per world size.

def run_pool(world_size: int, tmp_path_factory, hosts=None):
    """The results of one pool of `world_size` rank processes that ran every case; `hosts`: the
    host each rank connects as (ACCELKIT_MOCKCCL_HOSTID), else all on this one."""
    build_extensions()
    out = tmp_path_factory.mktemp(f"mockccl_ws{world_size}")
    results, errs, codes = spawn_ranks(__file__, world_size, out, hosts=hosts,
                                       extra_args=[",".join(hosts)] if hosts else [])
    return world_size, results, errs, codes


@pytest.fixture(scope="module")
def pool2(tmp_path_factory):
    return run_pool(2, tmp_path_factory)


@pytest.fixture(scope="module")
def pool4(tmp_path_factory):
    return run_pool(4, tmp_path_factory)


@pytest.fixture(scope="module")
def pool_hosts(tmp_path_factory):
    return run_pool(len(HOSTS), tmp_path_factory, HOSTS)


def check_pool_finished(pool):
    ws, results, errs, codes = pool
    assert codes == [0] * ws, "\n".join(e[-2000:] for e in errs)
    assert all(r is not None for r in results)
    for err in errs:
        assert "No backend of type" not in err, err[-2000:]


def check_case(pool, name):
    ws, results, errs, codes = pool
    assert all(r is not None for r in results), "\n".join(e[-2000:] for e in errs)
    failures = {rank: r[name] for rank, r in enumerate(results) if r[name] != "ok"}
    assert not failures, "\n".join(f"rank {k}: {v}" for k, v in failures.items())


def cases_for(world_size):
    return [name for name, (_, worlds) in CASES.items() if world_size in worlds]


def test_ws2_ranks_finished_cleanly(pool2):
    check_pool_finished(pool2)


@pytest.mark.parametrize("name", cases_for(2))
def test_ws2(pool2, name):
    check_case(pool2, name)


def test_ws4_ranks_finished_cleanly(pool4):
    check_pool_finished(pool4)


@pytest.mark.parametrize("name", cases_for(4))
def test_ws4(pool4, name):
    check_case(pool4, name)


def test_across_hosts_ranks_finished_cleanly(pool_hosts):
    check_pool_finished(pool_hosts)


@pytest.mark.parametrize("name", cases_for(len(HOSTS)))
def test_across_hosts(pool_hosts, name):
    check_case(pool_hosts, name)


if __name__ == "__main__":
    rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], *sys.argv[4:5])
