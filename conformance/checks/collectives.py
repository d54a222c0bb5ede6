"""Collectives through the dispatchable default process group, on this rank's device tensors.

The default group is initialised with ``spec.process_group_backend`` (``"<dev>:<lib>,cpu:gloo"``),
so every call here reaches the backend's own collective library (PR 102336: DeviceMesh and
DTensor only ever see a dispatchable ``ProcessGroup``). Inputs are small integers stored as the
dtype under test, so every reduction is exact in any order and results are compared bitwise
against a reference each rank computes from all ranks' (rebuildable) inputs.
"""

from __future__ import annotations

import time
import uuid
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from accelkit.conformance.api import Defaults, Skip, check
from accelkit.conformance.checks import _sweep as sweep
from accelkit.conformance.checks._util import (
    ALSO_AT,
    assert_equal,
    assert_on_device,
    assert_value,
    rank_input,
)

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT)

DTYPES = (torch.float32, torch.bfloat16, torch.int64)
SHAPE = (3, 5)


def _inputs(ctx, dtype, seed, low=-8, high=9):
    """(this rank's input on the device, every rank's input on the host)."""
    every = [rank_input(SHAPE, r, seed, dtype, low, high) for r in range(ctx.world_size)]
    return every[ctx.rank].to(ctx.device, copy=True), every


def _all_reduce_matches(ctx, op, dtypes, reference, seed, low=-8, high=9):
    for dtype in dtypes:
        mine, every = _inputs(ctx, dtype, seed, low, high)
        dist.all_reduce(mine, op=op)
        assert_on_device(ctx, mine, f"all_reduce({op}) result")
        expected = reference(torch.stack(every)).to(dtype)
        assert_equal(mine, expected, f"all_reduce({op}, {dtype})")


@check(covers=("all_reduce(op=SUM)",
       "Transport::allreduce <- all_reduce"))
def all_reduce_sum(ctx):
    """all_reduce with ReduceOp.SUM for float32, bfloat16 and int64 equals the sum of every
    rank's input (torch.distributed.all_reduce)."""
    _all_reduce_matches(ctx, dist.ReduceOp.SUM, DTYPES, lambda s: s.sum(0), seed=1)


@check(covers=("all_reduce(op=PRODUCT)",))
def all_reduce_product(ctx):
    """all_reduce with ReduceOp.PRODUCT for float32, bfloat16 and int64 equals the product of
    every rank's input; inputs are in [-2, 2] so the product is exact (torch.distributed.all_reduce)."""
    _all_reduce_matches(ctx, dist.ReduceOp.PRODUCT, DTYPES, lambda s: s.prod(0), seed=2,
                        low=-2, high=3)


@check(covers=("all_reduce(op=MIN)",))
def all_reduce_min(ctx):
    """all_reduce with ReduceOp.MIN for float32, bfloat16 and int64 equals the element-wise
    minimum over ranks (torch.distributed.all_reduce)."""
    _all_reduce_matches(ctx, dist.ReduceOp.MIN, DTYPES, lambda s: s.amin(0), seed=3)


@check(covers=("all_reduce(op=MAX)",))
def all_reduce_max(ctx):
    """all_reduce with ReduceOp.MAX for float32, bfloat16 and int64 equals the element-wise
    maximum over ranks (torch.distributed.all_reduce)."""
    _all_reduce_matches(ctx, dist.ReduceOp.MAX, DTYPES, lambda s: s.amax(0), seed=4)


@check(covers=("all_reduce(op=AVG)",))
def all_reduce_avg(ctx):
    """all_reduce with ReduceOp.AVG for float32 and bfloat16 equals the mean over ranks (exact:
    integer inputs, a power-of-two world). DTensor's Partial("avg") relies on it
    (torch.distributed.all_reduce)."""
    _all_reduce_matches(ctx, dist.ReduceOp.AVG, DTYPES[:2],
                        lambda s: s.to(torch.float64).sum(0) / s.shape[0], seed=5)


@check(covers=("all_reduce(op=BAND/BOR/BXOR)",))
def all_reduce_bitwise(ctx):
    """all_reduce with ReduceOp.BAND, BOR and BXOR on int64 equals the bitwise reduction over
    ranks (torch.distributed.all_reduce)."""
    def fold(fn):
        def reduce(stack):
            out = stack[0].clone()
            for row in stack[1:]:
                out = fn(out, row)
            return out
        return reduce

    _all_reduce_matches(ctx, dist.ReduceOp.BAND, (torch.int64,), fold(torch.bitwise_and), 6, 0, 256)
    _all_reduce_matches(ctx, dist.ReduceOp.BOR, (torch.int64,), fold(torch.bitwise_or), 7, 0, 256)
    _all_reduce_matches(ctx, dist.ReduceOp.BXOR, (torch.int64,), fold(torch.bitwise_xor), 8, 0, 256)


@check(covers=("broadcast(src)",
       "Transport::broadcast <- broadcast"))
def broadcast_every_root(ctx):
    """broadcast from each rank in turn leaves the root's tensor on every rank, for float32,
    bfloat16 and int64 (torch.distributed.broadcast)."""
    for dtype in DTYPES:
        for root in range(ctx.world_size):
            mine, every = _inputs(ctx, dtype, seed=10 + root)
            dist.broadcast(mine, src=root)
            assert_equal(mine, every[root], f"broadcast(src={root}, {dtype})")


@check(covers=("reduce(dst)",
       "Transport::reduce <- reduce"))
def reduce(ctx):
    """reduce(SUM) to each destination rank in turn leaves the sum on the destination
    (torch.distributed.reduce)."""
    for dst in range(ctx.world_size):
        mine, every = _inputs(ctx, torch.float32, seed=20 + dst)
        dist.reduce(mine, dst=dst)
        if ctx.rank == dst:
            assert_equal(mine, torch.stack(every).sum(0), f"reduce(dst={dst})")


@check(covers=("Transport::allgather <- all_gather",))
def all_gather(ctx):
    """all_gather into a list of tensors: entry i is rank i's input, for float32, bfloat16 and
    int64 (torch.distributed.all_gather)."""
    for dtype in DTYPES:
        mine, every = _inputs(ctx, dtype, seed=30)
        out = [torch.empty(SHAPE, dtype=dtype, device=ctx.device) for _ in range(ctx.world_size)]
        dist.all_gather(out, mine)
        for i, got in enumerate(out):
            assert_on_device(ctx, got, f"all_gather output[{i}]")
            assert_equal(got, every[i], f"all_gather output[{i}] ({dtype})")


@check(covers=("Transport::allgather <- all_gather_single",))
def all_gather_single(ctx):
    """all_gather_single concatenates every rank's input along dim 0, for float32, bfloat16
    and int64 (torch.distributed.all_gather_single, the 2.13 name of all_gather_into_tensor)."""
    for dtype in DTYPES:
        mine, every = _inputs(ctx, dtype, seed=31)
        flat = torch.empty((ctx.world_size * SHAPE[0], SHAPE[1]), dtype=dtype, device=ctx.device)
        dist.all_gather_single(flat, mine)
        assert_equal(flat, torch.cat(every), f"all_gather_single ({dtype})")


@check
def all_gather_into_tensor(ctx):
    """The deprecated all_gather_into_tensor still concatenates every rank's input (it routes
    through all_gather_single; torch.distributed.all_gather_into_tensor)."""
    mine, every = _inputs(ctx, torch.bfloat16, seed=32)
    out = torch.empty((ctx.world_size * SHAPE[0], SHAPE[1]), dtype=torch.bfloat16, device=ctx.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_into_tensor(out, mine)
    assert_equal(out, torch.cat(every), "all_gather_into_tensor")


@check
def all_gather_in_place(ctx):
    """all_gather_into_tensor whose input is this rank's own slice of the output (rank r's
    input starts r slices into it, rank 0's where the output starts), as FSDP2 all-gathers
    parameters (torch.distributed.fsdp._fully_shard._fsdp_collectives.foreach_all_gather;
    NCCL documents the in-place form): every slice holds its rank's data, for a small tensor
    and one of 1 MiB (several transport rounds). A library that sizes or aliases buffers by
    the input's address alone overruns or mixes them here."""
    ws = ctx.world_size
    for numel in (17, 1 << 18):
        every = [rank_input((numel,), r, 33, torch.float32) for r in range(ws)]
        out = torch.zeros(ws * numel, device=ctx.device)
        mine = out.narrow(0, ctx.rank * numel, numel)
        mine.copy_(every[ctx.rank])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_into_tensor(out, mine)
        assert_equal(out, torch.cat(every), f"in-place all_gather_into_tensor of {numel} elements")


@check(covers=("Transport::reduce_scatter <- reduce_scatter",))
def reduce_scatter(ctx):
    """reduce_scatter from a list: rank r receives the sum over ranks of their r-th list entry
    (torch.distributed.reduce_scatter)."""
    ws = ctx.world_size
    every = [[rank_input(SHAPE, src * ws + dst, 40) for dst in range(ws)] for src in range(ws)]
    out = torch.empty(SHAPE, device=ctx.device)
    dist.reduce_scatter(out, [t.to(ctx.device, copy=True) for t in every[ctx.rank]])
    expected = torch.stack([every[src][ctx.rank] for src in range(ws)]).sum(0)
    assert_equal(out, expected, "reduce_scatter")


@check(covers=("Transport::reduce_scatter <- reduce_scatter_single",))
def reduce_scatter_single(ctx):
    """reduce_scatter_single: rank r receives chunk r of the sum of every rank's flat input
    (torch.distributed.reduce_scatter_single, the 2.13 name of reduce_scatter_tensor)."""
    mine, every = _inputs(ctx, torch.float32, seed=41)
    mine = mine.repeat(ctx.world_size, 1)
    out = torch.empty(SHAPE, device=ctx.device)
    dist.reduce_scatter_single(out, mine)
    total = torch.stack(every).repeat(1, ctx.world_size, 1).sum(0)
    assert_equal(out, total.chunk(ctx.world_size)[ctx.rank], "reduce_scatter_single")


@check
def reduce_scatter_tensor(ctx):
    """The deprecated reduce_scatter_tensor still gives rank r chunk r of the summed input
    (torch.distributed.reduce_scatter_tensor)."""
    ws = ctx.world_size
    every = [rank_input((ws * 2, 3), r, 42) for r in range(ws)]
    out = torch.empty((2, 3), device=ctx.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_tensor(out, every[ctx.rank].to(ctx.device, copy=True))
    assert_equal(out, torch.stack(every).sum(0).chunk(ws)[ctx.rank], "reduce_scatter_tensor")


def _a2a_value(src: int, dst: int, n: int) -> torch.Tensor:
    """What rank ``src`` sends to rank ``dst``: ``n`` values naming both ends."""
    return torch.arange(n, dtype=torch.float32) + 100 * src + 10 * dst


@check(covers=("Transport::alltoall <- all_to_all_single (equal splits)",))
def all_to_all_single_equal(ctx):
    """all_to_all_single with equal splits: rank r's output chunk j is rank j's input chunk r
    (torch.distributed.all_to_all_single)."""
    ws, n = ctx.world_size, 3
    mine = torch.cat([_a2a_value(ctx.rank, dst, n) for dst in range(ws)]).to(ctx.device, copy=True)
    out = torch.empty(ws * n, device=ctx.device)
    dist.all_to_all_single(out, mine)
    assert_equal(out, torch.cat([_a2a_value(src, ctx.rank, n) for src in range(ws)]),
                 "all_to_all_single (equal splits)")


@check(covers=("Transport::alltoall <- all_to_all_single (uneven splits)",))
def all_to_all_single_uneven(ctx):
    """all_to_all_single with uneven split sizes (rank s sends (s + 2d) % 3 + 1 elements to
    rank d, and nothing from rank 0 to itself: a zero-size split) delivers every chunk intact and
    in rank order (torch.distributed.all_to_all_single)."""
    ws = ctx.world_size

    def size(src, dst):
        return (src + 2 * dst) % 3 + (0 if src == dst == 0 else 1)

    send = [size(ctx.rank, dst) for dst in range(ws)]
    recv = [size(src, ctx.rank) for src in range(ws)]
    mine = torch.cat([_a2a_value(ctx.rank, dst, send[dst]) for dst in range(ws)]).to(ctx.device, copy=True)
    out = torch.full((sum(recv),), -1.0, device=ctx.device)
    dist.all_to_all_single(out, mine, output_split_sizes=recv, input_split_sizes=send)
    expected = torch.cat([_a2a_value(src, ctx.rank, recv[src]) for src in range(ws)])
    assert_equal(out, expected, f"all_to_all_single (send splits {send}, recv splits {recv})")


@check(covers=("Transport::alltoall <- all_to_all_single (uneven splits)",))
def all_to_all_single_split_patterns(ctx):
    """all_to_all_single with split sizes in several patterns and sizes: one rank sending
    everything to one peer, every rank sending nothing to itself, sizes growing with the
    destination, one rank receiving nothing, and splits of 64 KiB + 3 elements (past a
    transport's chunk): every chunk arrives intact, at its offset, in rank order; what a rank
    expects from nobody stays untouched (torch.distributed.all_to_all_single)."""
    ws = ctx.world_size
    patterns = {
        "one rank sends everything to one peer": lambda s, d: 5 if (s, d) == (0, ws - 1) else 0,
        "nothing to oneself": lambda s, d: 0 if s == d else s + d + 1,
        "growing with the destination": lambda s, d: 2 * d + 1,
        "rank 1 receives nothing": lambda s, d: 0 if d == 1 else (s + d) % 4 + 1,
        "large splits": lambda s, d: (16 << 10) + 3 * ((s + d) % 2),
    }
    for name, size in patterns.items():
        send = [size(ctx.rank, dst) for dst in range(ws)]
        recv = [size(src, ctx.rank) for src in range(ws)]
        mine = torch.cat([_a2a_value(ctx.rank, dst, send[dst]) for dst in range(ws)])
        out = torch.full((sum(recv) + 2,), -1.0, device=ctx.device)
        dist.all_to_all_single(out[:sum(recv)], mine.to(ctx.device, copy=True),
                               output_split_sizes=recv, input_split_sizes=send)
        expected = torch.cat([_a2a_value(src, ctx.rank, recv[src]) for src in range(ws)])
        assert_equal(out[:sum(recv)], expected, f"all_to_all_single, {name} (send {send}, "
                     f"recv {recv})")
        assert_equal(out[sum(recv):], torch.full((2,), -1.0), f"past the output, {name}")


@check(covers=("Transport::alltoall <- all_to_all",))
def all_to_all(ctx):
    """all_to_all with lists of tensors: output[j] on rank r is rank j's input[r]
    (torch.distributed.all_to_all; equal sizes, as gloo requires them)."""
    ws, n = ctx.world_size, 4
    inputs = [_a2a_value(ctx.rank, dst, n).to(ctx.device, copy=True) for dst in range(ws)]
    outputs = [torch.empty(n, device=ctx.device) for _ in range(ws)]
    dist.all_to_all(outputs, inputs)
    for src, got in enumerate(outputs):
        assert_equal(got, _a2a_value(src, ctx.rank, n), f"all_to_all output[{src}]")


@check(covers=("gather(dst)",
       "Transport::gather <- gather"))
def gather(ctx):
    """gather to the first and the last rank: the destination's list holds every rank's input
    (torch.distributed.gather)."""
    for dst in (0, ctx.world_size - 1):
        mine, every = _inputs(ctx, torch.float32, seed=50 + dst)
        out = ([torch.empty(SHAPE, device=ctx.device) for _ in range(ctx.world_size)]
               if ctx.rank == dst else None)
        dist.gather(mine, out, dst=dst)
        if ctx.rank == dst:
            for i, got in enumerate(out):
                assert_equal(got, every[i], f"gather(dst={dst}) entry {i}")


@check(covers=("scatter(src)",
       "Transport::scatter <- scatter"))
def scatter(ctx):
    """scatter from the first and the last rank: rank r receives the source's r-th tensor
    (torch.distributed.scatter)."""
    for src in (0, ctx.world_size - 1):
        pieces = [rank_input(SHAPE, 100 * src + r, 51) for r in range(ctx.world_size)]
        out = torch.empty(SHAPE, device=ctx.device)
        dist.scatter(out, [p.to(ctx.device, copy=True) for p in pieces] if ctx.rank == src else None, src=src)
        assert_equal(out, pieces[ctx.rank], f"scatter(src={src})")


@check(covers=("send(dst)/recv(src)",
       "Transport::send / recv <- send, recv, isend, irecv, batch_isend_irecv"))
def send_recv_ring(ctx):
    """Point-to-point around a ring: blocking send/recv (even ranks send first) and then
    isend/irecv both deliver the left neighbour's tensor (torch.distributed.send/recv/isend/irecv)."""
    ws = ctx.world_size
    right, left = (ctx.rank + 1) % ws, (ctx.rank - 1) % ws
    mine, every = _inputs(ctx, torch.float32, seed=60)
    got = torch.empty(SHAPE, device=ctx.device)
    if ctx.rank % 2 == 0:
        dist.send(mine, dst=right)
        dist.recv(got, src=left)
    else:
        dist.recv(got, src=left)
        dist.send(mine, dst=right)
    assert_equal(got, every[left], "blocking send/recv ring")
    got2 = torch.empty(SHAPE, device=ctx.device)
    works = [dist.isend(mine * 2, dst=right), dist.irecv(got2, src=left)]
    for work in works:
        work.wait()
    assert_equal(got2, every[left] * 2, "isend/irecv ring")


@check(covers=("send(dst)/recv(src)",
       "Transport::send / recv <- send, recv, isend, irecv, batch_isend_irecv"))
def batch_isend_irecv(ctx):
    """batch_isend_irecv with sends to both neighbours and receives from both (what pipeline
    parallelism issues) delivers each neighbour's tensor (torch.distributed.batch_isend_irecv)."""
    ws = ctx.world_size
    right, left = (ctx.rank + 1) % ws, (ctx.rank - 1) % ws
    mine, every = _inputs(ctx, torch.float32, seed=61)
    from_left = torch.empty(SHAPE, device=ctx.device)
    from_right = torch.empty(SHAPE, device=ctx.device)
    ops = [dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.isend, mine * 3, left),
           dist.P2POp(dist.irecv, from_left, left), dist.P2POp(dist.irecv, from_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert_equal(from_left, every[left], "tensor from the left neighbour")
    assert_equal(from_right, every[right] * 3, "tensor from the right neighbour")


TAGS = ("p2p-tags",)


def _partner(ctx) -> int | None:
    """This rank's partner in the pairs (0, 1), (2, 3), ... (None for a last rank left over)."""
    peer = ctx.rank ^ 1
    return peer if peer < ctx.world_size else None


def _tagged(n: int, rank: int, tag: int) -> torch.Tensor:
    """The message rank ``rank`` sends with ``tag`` (n values no other message has)."""
    return torch.arange(n, dtype=torch.float32) + 1000 * rank + 100 * tag


@check(requires=TAGS, covers=("send/recv(tag)", "isend/irecv(tag)"))
def p2p_tags_out_of_order(ctx):
    """Tagged messages match by tag, not by posting order: the even rank of each pair sends
    tag 1 then tag 2, the odd one receives tag 2 first, then tag 1, and each buffer gets the
    message with its tag; non-blocking (irecv) and blocking (recv) receives alike
    (torch.distributed.send/recv/isend/irecv: "tag to match send with remote recv")."""
    peer = _partner(ctx)
    if peer is None:
        return
    received = {}  # every message is taken before anything is compared: no rank is left waiting
    for blocking in (False, True):
        if ctx.rank % 2 == 0:
            works = [dist.isend(_tagged(6, ctx.rank, t).to(ctx.device), dst=peer, tag=t)
                     for t in (1, 2)]
            for work in works:
                work.wait()
            continue
        got2, got1 = (torch.empty(6, device=ctx.device) for _ in range(2))
        if blocking:
            dist.recv(got2, src=peer, tag=2)
            dist.recv(got1, src=peer, tag=1)
        else:
            for work in [dist.irecv(got2, src=peer, tag=2), dist.irecv(got1, src=peer, tag=1)]:
                work.wait()
        received["recv" if blocking else "irecv"] = (got2, got1)
    for what, (got2, got1) in received.items():
        assert_equal(got2, _tagged(6, peer, 2), f"{what}(tag=2) posted before {what}(tag=1) "
                     "(got the tag-1 message: tags ignored?)")
        assert_equal(got1, _tagged(6, peer, 1), f"{what}(tag=1) posted after {what}(tag=2)")


@check(requires=TAGS, covers=("send/recv(tag) order",))
def p2p_same_tag_fifo(ctx):
    """Messages with the same tag between the same two ranks arrive in the order they were
    sent, also when another tag's message is sent between them: tag 5, tag 9, tag 5, tag 5
    received as tag 5, 5, 5, then 9 (torch.distributed.isend/irecv; gloo's ordering)."""
    peer = _partner(ctx)
    if peer is None:
        return
    order = (5, 9, 5, 5)
    if ctx.rank % 2 == 0:
        works = [dist.isend((_tagged(4, ctx.rank, t) + 10 * i).to(ctx.device), dst=peer, tag=t)
                 for i, t in enumerate(order)]
        for work in works:
            work.wait()
        return
    fives = [torch.empty(4, device=ctx.device) for _ in range(3)]
    nine = torch.empty(4, device=ctx.device)
    for work in [*(dist.irecv(b, src=peer, tag=5) for b in fives), dist.irecv(nine, src=peer, tag=9)]:
        work.wait()
    sent_fives = [i for i, t in enumerate(order) if t == 5]
    for k, (buf, i) in enumerate(zip(fives, sent_fives, strict=True)):
        assert_equal(buf, _tagged(4, peer, 5) + 10 * i,
                     f"irecv {k + 1} of tag 5 (expected tag-5 message {k + 1} in sending order)")
    assert_equal(nine, _tagged(4, peer, 9) + 10 * order.index(9), "receive of tag 9")


@check(requires=TAGS, covers=("batch_isend_irecv(P2POp.tag)",))
def p2p_tags_in_batch(ctx):
    """batch_isend_irecv with mixed tags in one batch matches by tag: each rank of a pair sends
    tags 3 and 4 and receives them listed as 4 then 3 (torch.distributed.batch_isend_irecv,
    P2POp's tag)."""
    peer = _partner(ctx)
    if peer is None:
        return
    got3, got4 = (torch.empty(5, device=ctx.device) for _ in range(2))
    ops = [dist.P2POp(dist.isend, _tagged(5, ctx.rank, 3).to(ctx.device), peer, tag=3),
           dist.P2POp(dist.isend, _tagged(5, ctx.rank, 4).to(ctx.device), peer, tag=4),
           dist.P2POp(dist.irecv, got4, peer, tag=4),
           dist.P2POp(dist.irecv, got3, peer, tag=3)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert_equal(got4, _tagged(5, peer, 4), "batch irecv(tag=4) listed before irecv(tag=3)")
    assert_equal(got3, _tagged(5, peer, 3), "batch irecv(tag=3)")


@check(requires=TAGS, covers=("recv(src=None, tag)",
       "Transport::recv_any <- recv(src=None)"))
def p2p_any_source_tag(ctx):
    """A receive from any source with a tag takes only messages with that tag: every rank but
    0 sends tag 6 then tag 7 to rank 0, which receives tag 7 from any source once per peer
    (each from a distinct sender, with that sender's tag-7 message), then tag 6 from each
    (torch.distributed.recv with src=None returns the sender's rank)."""
    n = 3
    if ctx.rank != 0:
        works = [dist.isend(_tagged(n, ctx.rank, t).to(ctx.device), dst=0, tag=t) for t in (6, 7)]
        for work in works:
            work.wait()
        return
    # Every message is taken before anything is compared, however they were matched: the
    # any-source phase, then what each sender has left (one, unless tags were ignored).
    taken = []
    for _ in range(1, ctx.world_size):
        buf = torch.empty(n, device=ctx.device)
        taken.append((dist.recv(buf, tag=7), buf))
    senders = [src for src, _ in taken]
    rest = {src: [torch.empty(n, device=ctx.device) for _ in range(2 - senders.count(src))]
            for src in range(1, ctx.world_size)}
    for src, bufs in rest.items():
        for buf in bufs:
            dist.recv(buf, src=src, tag=6)
    assert sorted(senders) == list(range(1, ctx.world_size)), (
        f"recv(src=None, tag=7) returned senders {senders}; expected each of ranks "
        f"1..{ctx.world_size - 1} once")
    for src, buf in taken:
        assert_equal(buf, _tagged(n, src, 7), f"recv(src=None, tag=7) from rank {src} "
                     "(a tag-6 message delivered: tag ignored?)")
    for src, (buf,) in rest.items():
        assert_equal(buf, _tagged(n, src, 6), f"recv(src={src}, tag=6) after the tag-7 messages")


def _root_group(ctx) -> tuple[list[int], object]:
    """(its ranks, the group) of a group whose group ranks differ from the global ones where
    the world allows: the upper half of the ranks (every rank creates it), or all of them at a
    world size below 4."""
    ranks = list(range(ctx.world_size))
    if ctx.world_size >= 4:
        ranks = ranks[ctx.world_size // 2:]
    return ranks, dist.new_group(ranks)


@check(covers=("broadcast(group_src)", "reduce(group_dst)", "gather(group_dst)",
               "scatter(group_src)", "send(group_dst)/recv(group_src)"))
def group_roots(ctx):
    """Roots and peers given as ranks of a group reach the backend as that group's ranks: on a
    group of the upper half of the ranks, broadcast(group_src=1), reduce(group_dst=1),
    gather(group_dst=1) and scatter(group_src=1) use the group's second rank as the root, and
    send(group_dst)/recv(group_src) reach the group's next rank (the group_src / group_dst
    arguments of torch.distributed.broadcast, reduce, gather, scatter, isend and irecv)."""
    ranks, group = _root_group(ctx)
    if ctx.rank not in ranks:
        return
    me, n, root = ranks.index(ctx.rank), len(ranks), ranks[1]
    mine, every = _inputs(ctx, torch.float32, seed=95)
    t = mine.clone()
    dist.broadcast(t, group_src=1, group=group)
    assert_equal(t, every[root], f"broadcast(group_src=1) (global rank {root})")
    t = mine.clone()
    dist.reduce(t, group_dst=1, group=group)
    if ctx.rank == root:
        assert_equal(t, torch.stack([every[r] for r in ranks]).sum(0),
                     f"reduce(group_dst=1) on global rank {root}")
    out = [torch.empty(SHAPE, device=ctx.device) for _ in ranks] if ctx.rank == root else None
    dist.gather(mine, out, group_dst=1, group=group)
    if ctx.rank == root:
        for i, got in enumerate(out):
            assert_equal(got, every[ranks[i]], f"gather(group_dst=1) entry {i}")
    pieces = [rank_input(SHAPE, 200 + i, 96) for i in range(n)]
    got = torch.empty(SHAPE, device=ctx.device)
    dist.scatter(got, [p.to(ctx.device) for p in pieces] if ctx.rank == root else None,
                 group_src=1, group=group)
    assert_equal(got, pieces[me], f"scatter(group_src=1) to group rank {me}")
    if n > 1:
        right, left = (me + 1) % n, (me - 1) % n
        got = torch.empty(SHAPE, device=ctx.device)
        works = [dist.isend(mine, group=group, group_dst=right),
                 dist.irecv(got, group=group, group_src=left)]
        for work in works:
            work.wait()
        assert_equal(got, every[ranks[left]], f"irecv(group_src={left}) on the group")


@check(timeout=90, covers=("new_group(timeout)",
       "Transport::abort <- a collective past its timeout"))
def group_timeout(ctx):
    """A collective on a group created with a 2 s timeout that rank 0 never joins raises on
    the ranks waiting for it, well before the check's own limit, instead of waiting for ever;
    then the group is destroyed and the default group still works
    (torch.distributed.new_group(timeout=...), the backend's per-group timeout)."""
    group = dist.new_group(list(range(ctx.world_size)), timeout=timedelta(seconds=2))
    if ctx.rank != 0:
        started = time.monotonic()
        raised = None
        try:
            t = torch.ones(4, device=ctx.device)
            dist.all_reduce(t, group=group)
            t.cpu()  # an asynchronous device raises when the result is used
        except Exception as exc:  # the backend's error type (DistBackendError, RuntimeError)
            raised = exc
        waited = time.monotonic() - started
        assert raised is not None, (
            "all_reduce on a group with a 2 s timeout returned although rank 0 never joined it")
        assert waited < 30, (
            f"all_reduce raised only after {waited:.1f} s on a group created with a 2 s timeout "
            f"(the group's timeout ignored?): {raised}")
    dist.barrier()
    dist.destroy_process_group(group)
    mine, every = _inputs(ctx, torch.float32, seed=97)
    dist.all_reduce(mine)
    assert_equal(mine, torch.stack(every).sum(0), "all_reduce on the default group afterwards")


@check(covers=("Transport::shutdown <- destroy_process_group right after a collective",))
def destroy_after_collective(ctx):
    """A group destroyed right after its last collective, without a barrier between (the usual
    teardown), leaves that collective's results right on every rank: 8 rounds of new_group,
    all_reduce of 1 MiB, destroy_process_group(group), then the result read. The fastest rank
    destroys the group while its peers are still finishing the collective, and on an
    asynchronous device the collective may still be queued on the rank that destroys it:
    shutdown() finishes what was issued (torch.distributed.destroy_process_group calls the
    backend's shutdown(); ProcessGroupNCCL::shutdown in
    torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp flushes its collectives before destroying
    its communicators; only abort() ends them)."""
    n = 1 << 18
    for round_ in range(8):
        group = dist.new_group(list(range(ctx.world_size)))
        mine = torch.full((n,), float(ctx.rank + round_), device=ctx.device)
        dist.all_reduce(mine, group=group)
        dist.destroy_process_group(group)
        expected = float(sum(range(ctx.world_size)) + round_ * ctx.world_size)
        assert_equal(mine[-8:], torch.full((8,), expected),
                     f"round {round_}: all_reduce on a group destroyed right after it")


@check
def object_collectives(ctx):
    """The object collectives DCP and DTensor's run_check use (all_gather_object,
    broadcast_object_list, gather_object, scatter_object_list) carry picklable objects,
    including device tensors, over the default group (torch.distributed *_object APIs)."""
    ws = ctx.world_size
    mine = {"rank": ctx.rank, "name": f"r{ctx.rank}", "t": torch.full((2,), float(ctx.rank), device=ctx.device)}
    gathered = [None] * ws
    dist.all_gather_object(gathered, mine)
    assert [g["rank"] for g in gathered] == list(range(ws)), (
        f"all_gather_object ranks {[g['rank'] for g in gathered]}, expected {list(range(ws))}")
    for r, g in enumerate(gathered):
        assert_equal(g["t"], torch.full((2,), float(r)), f"all_gather_object tensor from rank {r}")
    box = [{"root": ws - 1}] if ctx.rank == ws - 1 else [None]
    dist.broadcast_object_list(box, src=ws - 1)
    assert box == [{"root": ws - 1}], (
        f"broadcast_object_list gave {box}, expected {[{'root': ws - 1}]}")
    out = [None] * ws if ctx.rank == 0 else None
    dist.gather_object(("g", ctx.rank), out, dst=0)
    if ctx.rank == 0:
        assert out == [("g", r) for r in range(ws)], (
            f"gather_object gave {out}, expected {[('g', r) for r in range(ws)]}")
    got = [None]
    dist.scatter_object_list(got, [("s", r) for r in range(ws)] if ctx.rank == 1 else None, src=1)
    assert got == [("s", ctx.rank)], (
        f"scatter_object_list gave {got}, expected {[('s', ctx.rank)]}")


@check
def barrier(ctx):
    """barrier returns on a rank only after every rank has entered it: each rank, rank r after
    r * 20 ms, increments a store counter (a synchronous add) just before the barrier, and
    after it the counter holds the world size on every rank (torch.distributed.barrier)."""
    token = [uuid.uuid4().hex if ctx.rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    store = dist.distributed_c10d._get_default_store()
    key = f"accelkit/barrier/{token[0]}"
    time.sleep(0.02 * ctx.rank)
    store.add(key, 1)
    dist.barrier()
    entered = store.add(key, 0)
    assert entered == ctx.world_size, (
        f"after barrier() {entered} of {ctx.world_size} ranks had entered it, expected all "
        f"{ctx.world_size}")


@check(requires=("accelerator",), covers=("Transport::barrier <- barrier(device_ids)",
                                           "Transport::barrier <- barrier of a bound group"))
def device_barrier(ctx):
    """barrier through the device's own library returns on a rank only after every rank entered
    it: dist.barrier(device_ids=[index]), the common idiom (torch runs it on the device, not
    through the CPU library as barrier() does here), and barrier() of a group bound to the device
    (new_group(device_id=...), as init_process_group(device_id=...) binds the default group).
    Each rank, rank r after r * 50 ms, increments a store counter just before; after the barrier
    the counter holds the world size on every rank (torch.distributed.barrier: opts.device)."""
    bound = dist.new_group(device_id=ctx.device)
    assert_value(bound.bound_device_id, ctx.device, "new_group(device_id=...).bound_device_id")
    token = [uuid.uuid4().hex if ctx.rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    store = dist.distributed_c10d._get_default_store()
    for way, enter in (("barrier(device_ids=[index])",
                        lambda: dist.barrier(device_ids=[ctx.device.index])),
                       ("barrier() of a group bound to the device",
                        lambda: dist.barrier(group=bound))):
        key = f"accelkit/device_barrier/{token[0]}/{way}"
        time.sleep(0.05 * ctx.rank)
        store.add(key, 1)
        enter()
        entered = store.add(key, 0)
        assert entered == ctx.world_size, (
            f"after {way} {entered} of {ctx.world_size} ranks had entered it, expected all "
            f"{ctx.world_size}")
    dist.destroy_process_group(bound)


@check(covers=("Transport::allreduce <- allreduce_coalesced",
               "Transport::allgather <- allgather_into_tensor_coalesced",
               "Transport::allgather <- all_gather_coalesced",
               "Transport::reduce_scatter <- reduce_scatter_tensor_coalesced"))
def coalesced(ctx):
    """Coalesced collectives, as FSDP1 and DDP's gradient buckets issue them: all_reduce,
    all_gather_single and reduce_scatter_single inside torch.distributed._coalescing_manager
    (the backend's allreduce_coalesced, allgather_into_tensor_coalesced and
    reduce_scatter_tensor_coalesced), on three tensors of different shapes (one empty),
    synchronous and async_ops=True, and the legacy torch.distributed.all_gather_coalesced
    (the backend's allgather_coalesced; outputs[r][i] is rank r's input i, as its docstring
    and ProcessGroupGloo have it): each result is what the separate call gives."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    ws, sizes = ctx.world_size, ((3, 5), (0,), (257,))
    for async_ops in (False, True):
        every = [[rank_input(shape, r, 50 + i) for r in range(ws)] for i, shape in enumerate(sizes)]
        reduced = [e[ctx.rank].to(ctx.device, copy=True) for e in every]
        with _coalescing_manager(async_ops=async_ops) as cm:
            for t in reduced:
                dist.all_reduce(t)
        if async_ops:
            cm.wait()
        for i, t in enumerate(reduced):
            assert_equal(t, torch.stack(every[i]).sum(0), f"coalesced all_reduce {i} "
                         f"(shape {sizes[i]}, async_ops={async_ops})")
        gathered = [torch.empty((ws * e[0].shape[0], *e[0].shape[1:]), device=ctx.device)
                    for e in every]
        with _coalescing_manager(async_ops=async_ops) as cm:
            for out, e in zip(gathered, every, strict=True):
                dist.all_gather_single(out, e[ctx.rank].to(ctx.device, copy=True))
        if async_ops:
            cm.wait()
        for i, out in enumerate(gathered):
            assert_equal(out, torch.cat(every[i]), f"coalesced all_gather_single {i} "
                         f"(async_ops={async_ops})")
        scattered = [torch.empty(e[0].shape, device=ctx.device) for e in every]
        with _coalescing_manager(async_ops=async_ops) as cm:
            for out, e in zip(scattered, every, strict=True):
                dist.reduce_scatter_single(out, e[ctx.rank].repeat(ws, *[1] * (e[0].dim() - 1))
                                           .to(ctx.device, copy=True))
        if async_ops:
            cm.wait()
        for i, out in enumerate(scattered):
            total = torch.stack([x.repeat(ws, *[1] * (x.dim() - 1)) for x in every[i]]).sum(0)
            assert_equal(out, total.chunk(ws)[ctx.rank] if total.numel() else total[:0],
                         f"coalesced reduce_scatter_single {i} (async_ops={async_ops})")
        # one output list per rank, one tensor per input in each (the call's documented layout)
        lists = [[torch.empty(e[0].shape, device=ctx.device) for e in every] for _ in range(ws)]
        with warnings.catch_warnings():  # torch marks the call deprecated, not removed
            warnings.simplefilter("ignore", FutureWarning)
            work = dist.all_gather_coalesced(lists, [e[ctx.rank].to(ctx.device, copy=True)
                                                     for e in every], async_op=async_ops)
        if async_ops:
            work.wait()
        for r, outs in enumerate(lists):
            for i, out in enumerate(outs):
                assert_equal(out, every[i][r], f"all_gather_coalesced: rank {r}'s input {i} "
                             f"(async_op={async_ops})")


@check(covers=("async_op=True",))
def async_work(ctx):
    """async_op=True returns a Work whose wait() completes the collective for the caller (on an
    asynchronous device, as NCCL: the current stream waits for it, not the host), is_completed()
    is True once the device is synchronized, and get_future() resolves to the output tensors
    (torch.distributed Work API)."""
    mine, every = _inputs(ctx, torch.float32, seed=70)
    work = dist.all_reduce(mine, async_op=True)
    fut = work.get_future()
    waited = work.wait()
    assert waited is True, f"Work.wait() returned {waited!r}, expected True"
    handle = getattr(torch, ctx.device_type, None)
    if ctx.device_type != "cpu" and hasattr(handle, "synchronize"):
        handle.synchronize()
    assert work.is_completed(), "Work.is_completed() is False after wait() and synchronize()"
    assert_equal(mine, torch.stack(every).sum(0), "async all_reduce")
    result = fut.wait()
    assert isinstance(result, list) and len(result) == 1, f"future value {result!r}: expected [tensor]"
    assert_equal(result[0], torch.stack(every).sum(0), "all_reduce future value")
    out = torch.empty((ctx.world_size * SHAPE[0], SHAPE[1]), device=ctx.device)
    work = dist.all_gather_single(out, mine, async_op=True)
    work.wait()
    assert_equal(out, torch.stack(every).sum(0).repeat(ctx.world_size, 1), "async all_gather_single")


@check
def functional(ctx):
    """Functional collectives (what DTensor calls) return AsyncCollectiveTensor in eager mode;
    wait() / wait_tensor give the right values, and using a result without wait() waits
    implicitly; for a ProcessGroup and for a DeviceMesh as the group
    (torch.distributed._functional_collectives: all_reduce, all_gather_single,
    reduce_scatter_single, all_to_all_single)."""
    mine, every = _inputs(ctx, torch.float32, seed=80)
    total = torch.stack(every).sum(0)
    mesh = ctx.mesh((ctx.world_size,))
    for group in (dist.group.WORLD, mesh):
        what = type(group).__name__
        reduced = funcol.all_reduce(mine, "sum", group)
        assert isinstance(reduced, funcol.AsyncCollectiveTensor), (
            f"all_reduce over {what} returned {type(reduced).__name__}, not AsyncCollectiveTensor")
        assert_equal(reduced.wait(), total, f"funcol.all_reduce over {what}")
        gathered = funcol.all_gather_single(mine, 0, group)
        assert_equal(funcol.wait_tensor(gathered), torch.cat(every), f"funcol.all_gather_single ({what})")
        scattered = funcol.reduce_scatter_single(mine.repeat(ctx.world_size, 1), "sum", 0, group)
        assert_equal(scattered.wait(), total, f"funcol.reduce_scatter_single ({what})")
        exchanged = funcol.all_to_all_single(mine.repeat(ctx.world_size, 1), None, None, group)
        assert_equal(exchanged.wait(), torch.cat(every), f"funcol.all_to_all_single ({what})")
        assert_equal(funcol.all_reduce(mine, "max", group) + 0, torch.stack(every).amax(0),
                     f"funcol.all_reduce(max) used without wait ({what})")


@check(also_at=(8,), covers=("broadcast(group_src)",))
def subgroup_half(ctx):
    """A group of half the ranks (new_group, created by every rank) reduces, broadcasts and
    gathers among its members only; the other half's group is NON_GROUP_MEMBER here
    (torch.distributed.new_group)."""
    ws, half = ctx.world_size, ctx.world_size // 2
    lower, upper = list(range(half)), list(range(half, ws))
    groups = [dist.new_group(lower), dist.new_group(upper)]
    members = lower if ctx.rank < half else upper
    mine_group = groups[0] if ctx.rank < half else groups[1]
    other = groups[1] if ctx.rank < half else groups[0]
    assert other == dist.GroupMember.NON_GROUP_MEMBER, (
        f"the other half's group is {other!r} here, expected GroupMember.NON_GROUP_MEMBER")
    assert_value(dist.get_process_group_ranks(mine_group), members,
                 "dist.get_process_group_ranks(mine_group)")
    mine, every = _inputs(ctx, torch.float32, seed=90)
    dist.all_reduce(mine, group=mine_group)
    assert_equal(mine, torch.stack([every[r] for r in members]).sum(0), "all_reduce on half group")
    t = torch.full((4,), float(ctx.rank), device=ctx.device)
    dist.broadcast(t, group_src=1, group=mine_group)
    assert_equal(t, torch.full((4,), float(members[1])), "broadcast(group_src=1) on half group")
    out = torch.empty(len(members), device=ctx.device)
    dist.all_gather_single(out, torch.tensor([float(ctx.rank)], device=ctx.device), group=mine_group)
    assert_equal(out, torch.tensor([float(r) for r in members]), "all_gather_single on half group")


@check
def non_contiguous(ctx):
    """Views are honoured: an all_reduce on a row of a larger buffer (storage offset) changes
    that row only; all_gather into views of one buffer fills it; a transposed (non-contiguous)
    input either reduces correctly or is refused with an error naming contiguity — never a
    silently wrong result (torch.distributed.all_reduce / all_gather)."""
    ws = ctx.world_size
    every = [rank_input((4, 6), r, 100) for r in range(ws)]
    buf = every[ctx.rank].to(ctx.device, copy=True)
    row = buf[2]
    dist.all_reduce(row)
    expected = every[ctx.rank].clone()
    expected[2] = torch.stack(every)[:, 2].sum(0)
    assert_equal(buf, expected, "all_reduce on buf[2] (rows other than 2 must be untouched)")

    gathered = torch.full((ws, 6), -1.0, device=ctx.device)
    dist.all_gather(list(gathered.unbind(0)), buf[1])
    assert_equal(gathered, torch.stack([every[r][1] for r in range(ws)]), "all_gather into row views")

    transposed = every[ctx.rank].to(ctx.device, copy=True).t()
    assert not transposed.is_contiguous()
    try:
        dist.all_reduce(transposed)
    except (RuntimeError, ValueError) as exc:
        assert "contiguous" in str(exc).lower(), (
            f"all_reduce of a transposed tensor raised an error not naming contiguity: {exc}")
        return
    assert_equal(transposed, torch.stack(every).sum(0).t(), "all_reduce of a transposed tensor")


@check(timeout=120)
def all_reduce_64mib(ctx):
    """A 64 MiB float32 all_reduce (16 Mi elements) is exact: rank r contributes
    (r + 1) * (i % 7), the sum is world*(world+1)/2 * (i % 7) (torch.distributed.all_reduce)."""
    n = 64 * 1024 * 1024 // 4
    pattern = (torch.arange(n, dtype=torch.int32) % 7).to(torch.float32)
    mine = (pattern * (ctx.rank + 1)).to(ctx.device, copy=True)
    dist.all_reduce(mine)
    factor = ctx.world_size * (ctx.world_size + 1) // 2
    assert_equal(mine, pattern * factor, "64 MiB all_reduce")


# -- sweeps: every collective over sizes that straddle algorithm thresholds, every dtype -----
# (conformance/checks/_sweep.py: the sizes, the dtypes, the inputs and the expected results)


def _sweep_all_reduce(ctx, ops: tuple[str, ...]) -> None:
    results = sweep.Comparisons()
    for dtype in sweep.DTYPES:
        for op in (op for op in ops if op in sweep.ops_for(dtype)):
            for n in sweep.counts(dtype):
                mine = sweep.reduction_input(op, ctx.rank, n, dtype).to(ctx.device, copy=True)
                dist.all_reduce(mine, op=sweep.REDUCE_OPS[op])
                results.equal(mine, sweep.reduction_expected(op, ctx.world_size, n, dtype),
                               f"all_reduce({op.upper()}) of {sweep.label(dtype, n)}")
    results.done()


@check(covers=("all_reduce(op=SUM)",
       "Transport::allreduce <- all_reduce"))
def sweep_all_reduce_sum(ctx):
    """all_reduce(SUM) is exact for every dtype c10d reduces (bool, uint8, int8, int32, int64,
    float16, bfloat16, float32, float64, complex64) at every size of the sweep (0, 1, 7,
    4 KiB - 1 element / 4 KiB / + 1, 64 KiB, 512 KiB +- 1 element, 2 MiB + 3 elements)
    (torch.distributed.all_reduce)."""
    _sweep_all_reduce(ctx, ("sum",))


@check
def sweep_all_reduce_views(ctx):
    """all_reduce(SUM) of views, for every dtype at 4 KiB + 1 element: a slice with a storage
    offset is reduced and the rest of its buffer left untouched; a strided (non-contiguous)
    view is reduced correctly or refused with an error naming contiguity, never silently
    wrong (torch.distributed.all_reduce)."""
    results = sweep.Comparisons()
    for dtype in sweep.DTYPES:
        n = sweep.counts(dtype)[4] + 1  # 4 KiB + 1 element: odd, past a small-message switch
        mine = sweep.reduction_input("sum", ctx.rank, n, dtype).to(ctx.device, copy=True)
        expected = sweep.reduction_expected("sum", ctx.world_size, n, dtype)
        view, buffer = sweep.in_view(mine, "offset", 1)
        dist.all_reduce(view)
        results.equal(view, expected, f"all_reduce of an offset view, {sweep.label(dtype, n)}")
        results.equal(torch.cat([buffer[:3], buffer[3 + n:]]), torch.ones(5, dtype=dtype),
                      f"the buffer around an offset view, {sweep.label(dtype, n)}")
        strided, _ = sweep.in_view(mine, "strided", 1)
        what = f"all_reduce of a strided view, {sweep.label(dtype, n)}"
        if sweep.either_correct_or_refused(dist.all_reduce, strided, what=what):
            results.equal(strided, expected, what)
    results.done()


@check(covers=("all_reduce(op=PRODUCT)",))
def sweep_all_reduce_product(ctx):
    """all_reduce(PRODUCT) is exact for every non-complex dtype at every size of the sweep
    (inputs of 1, -1, 2 and 3 keep the product exact) (torch.distributed.all_reduce)."""
    _sweep_all_reduce(ctx, ("product",))


@check(covers=("all_reduce(op=MIN)", "all_reduce(op=MAX)"))
def sweep_all_reduce_min_max(ctx):
    """all_reduce(MIN) and all_reduce(MAX) are exact for every non-complex dtype at every size
    of the sweep (bool: MIN is "all", MAX "any") (torch.distributed.all_reduce)."""
    _sweep_all_reduce(ctx, ("min", "max"))


@check(covers=("all_reduce(op=AVG)",))
def sweep_all_reduce_avg(ctx):
    """all_reduce(AVG) is exact for float16, bfloat16, float32, float64 and complex64 at every
    size of the sweep (integer inputs, a power-of-two world) (torch.distributed.all_reduce)."""
    _sweep_all_reduce(ctx, ("avg",))


@check(covers=("all_reduce(op=BAND/BOR/BXOR)",))
def sweep_all_reduce_bitwise(ctx):
    """all_reduce(BAND / BOR / BXOR) is exact for bool, uint8, int8, int32 and int64 at every
    size of the sweep (torch.distributed.all_reduce)."""
    _sweep_all_reduce(ctx, ("band", "bor", "bxor"))


@check(covers=("broadcast(src)",
       "Transport::broadcast <- broadcast"))
def sweep_broadcast(ctx):
    """broadcast leaves the root's tensor on every rank for every dtype at every size of the
    sweep, the root moving from rank to rank, and into an offset view
    (torch.distributed.broadcast)."""
    results = sweep.Comparisons()
    for dtype in sweep.DTYPES:
        for k, n in enumerate(sweep.counts(dtype)):
            root = k % ctx.world_size
            mine = sweep.rank_values(ctx.rank, n, dtype).to(ctx.device, copy=True)
            dist.broadcast(mine, src=root)
            results.equal(mine, sweep.rank_values(root, n, dtype),
                          f"broadcast(src={root}) of {sweep.label(dtype, n)}")
        n = sweep.counts(dtype)[5]
        view, _ = sweep.in_view(sweep.rank_values(ctx.rank, n, dtype).to(ctx.device, copy=True), "offset", 0)
        dist.broadcast(view, src=ctx.world_size - 1)
        results.equal(view, sweep.rank_values(ctx.world_size - 1, n, dtype),
                      f"broadcast into an offset view, {sweep.label(dtype, n)}")
    results.done()


@check(covers=("reduce(dst)",
       "Transport::reduce <- reduce"))
def sweep_reduce(ctx):
    """reduce(SUM) leaves the exact sum on the destination for every non-complex dtype at every
    size of the sweep, the destination moving from rank to rank (torch.distributed.reduce)."""
    results = sweep.Comparisons()
    for dtype in sweep.ARITHMETIC:
        for k, n in enumerate(sweep.counts(dtype)):
            dst = k % ctx.world_size
            mine = sweep.reduction_input("sum", ctx.rank, n, dtype).to(ctx.device, copy=True)
            dist.reduce(mine, dst=dst)
            if ctx.rank == dst:
                results.equal(mine, sweep.reduction_expected("sum", ctx.world_size, n, dtype),
                              f"reduce(dst={dst}) of {sweep.label(dtype, n)}")
    results.done()


@check(covers=("Transport::allgather <- all_gather",))
def sweep_all_gather(ctx):
    """all_gather into a list: entry j is rank j's input, for every dtype at every size of the
    sweep (torch.distributed.all_gather)."""
    results = sweep.Comparisons()
    for dtype in sweep.DTYPES:
        for n in sweep.counts(dtype, largest=False):
            out = [torch.empty(n, dtype=dtype, device=ctx.device) for _ in range(ctx.world_size)]
            dist.all_gather(out, sweep.rank_values(ctx.rank, n, dtype).to(ctx.device, copy=True))
            for j, got in enumerate(out):
                results.equal(got, sweep.rank_values(j, n, dtype),
                              f"all_gather entry {j}, {sweep.label(dtype, n)}")
    results.done()


@check(covers=("Transport::allgather <- all_gather_single",))
def sweep_all_gather_single(ctx):
    """all_gather_single concatenates every rank's input for every dtype at every size of the
    sweep, also from an offset view (torch.distributed.all_gather_single)."""
    results = sweep.Comparisons()
    for dtype in sweep.DTYPES:
        for n in sweep.counts(dtype):
            out = torch.empty(ctx.world_size * n, dtype=dtype, device=ctx.device)
            dist.all_gather_single(out, sweep.rank_values(ctx.rank, n, dtype).to(ctx.device, copy=True))
            results.equal(out, torch.cat([sweep.rank_values(r, n, dtype)
                                          for r in range(ctx.world_size)]),
                          f"all_gather_single of {sweep.label(dtype, n)}")
        n = sweep.counts(dtype)[5]
        view, _ = sweep.in_view(sweep.rank_values(ctx.rank, n, dtype).to(ctx.device, copy=True), "offset", 0)
        out = torch.empty(ctx.world_size * n, dtype=dtype, device=ctx.device)
        dist.all_gather_single(out, view)
        results.equal(out, torch.cat([sweep.rank_values(r, n, dtype) for r in range(ctx.world_size)]),
                      f"all_gather_single from an offset view, {sweep.label(dtype, n)}")
    results.done()


def _reduce_scatter_chunks(ctx, n, dtype):
    """This rank's reduce_scatter input (chunk j for rank j) and its expected output."""
    chunks = [sweep.reduction_input("sum", ctx.rank, n, dtype, seed=j)
              for j in range(ctx.world_size)]
    return chunks, sweep.reduction_expected("sum", ctx.world_size, n, dtype, seed=ctx.rank)


@check(covers=("Transport::reduce_scatter <- reduce_scatter",))
def sweep_reduce_scatter(ctx):
    """reduce_scatter(SUM) from a list: rank r gets the exact sum of every rank's r-th entry,
    for every dtype at every size of the sweep (torch.distributed.reduce_scatter)."""
    results = sweep.Comparisons()
    for dtype in sweep.DTYPES:
        for n in sweep.counts(dtype, largest=False):
            chunks, expected = _reduce_scatter_chunks(ctx, n, dtype)
            out = torch.empty(n, dtype=dtype, device=ctx.device)
            dist.reduce_scatter(out, [c.to(ctx.device, copy=True) for c in chunks])
            results.equal(out, expected, f"reduce_scatter of {sweep.label(dtype, n)} per rank")
    results.done()


@check(covers=("Transport::reduce_scatter <- reduce_scatter_single",))
def sweep_reduce_scatter_single(ctx):
    """reduce_scatter_single(SUM): rank r gets the exact sum of chunk r of every rank's input,
    for every dtype at every size of the sweep (per rank), also into an offset view
    (torch.distributed.reduce_scatter_single)."""
    results = sweep.Comparisons()
    for dtype in sweep.DTYPES:
        for n in sweep.counts(dtype):
            chunks, expected = _reduce_scatter_chunks(ctx, n, dtype)
            out = torch.empty(n, dtype=dtype, device=ctx.device)
            dist.reduce_scatter_single(out, torch.cat(chunks).to(ctx.device, copy=True))
            results.equal(out, expected, f"reduce_scatter_single of {sweep.label(dtype, n)} per rank")
        n = sweep.counts(dtype)[5]
        chunks, expected = _reduce_scatter_chunks(ctx, n, dtype)
        view, _ = sweep.in_view(torch.empty(n, dtype=dtype, device=ctx.device), "offset", 0)
        dist.reduce_scatter_single(view, torch.cat(chunks).to(ctx.device, copy=True))
        results.equal(view, expected, f"reduce_scatter_single into an offset view, "
                                      f"{sweep.label(dtype, n)} per rank")
    results.done()


def _exchanged(src: int, dst: int, n: int, dtype) -> torch.Tensor:
    """What rank ``src`` sends rank ``dst`` in the all-to-all sweeps."""
    return sweep.rank_values(src, n, dtype, seed=13 * dst)


@check(covers=("Transport::alltoall <- all_to_all_single (equal splits)",))
def sweep_all_to_all_single(ctx):
    """all_to_all_single with equal splits: rank r's chunk j is rank j's chunk r, for every
    dtype at every size of the sweep (per peer) (torch.distributed.all_to_all_single)."""
    results = sweep.Comparisons()
    ws = ctx.world_size
    for dtype in sweep.DTYPES:
        for n in sweep.counts(dtype, largest=False):
            mine = torch.cat([_exchanged(ctx.rank, d, n, dtype) for d in range(ws)])
            out = torch.empty(ws * n, dtype=dtype, device=ctx.device)
            dist.all_to_all_single(out, mine.to(ctx.device, copy=True))
            results.equal(out, torch.cat([_exchanged(s, ctx.rank, n, dtype) for s in range(ws)]),
                          f"all_to_all_single of {sweep.label(dtype, n)} per peer")
    results.done()


@check(covers=("Transport::alltoall <- all_to_all",))
def sweep_all_to_all(ctx):
    """all_to_all with lists: output entry j on rank r is rank j's entry r, for every dtype at
    every size of the sweep (per peer) (torch.distributed.all_to_all)."""
    results = sweep.Comparisons()
    ws = ctx.world_size
    for dtype in sweep.DTYPES:
        for n in sweep.counts(dtype, largest=False):
            outputs = [torch.empty(n, dtype=dtype, device=ctx.device) for _ in range(ws)]
            dist.all_to_all(outputs, [_exchanged(ctx.rank, d, n, dtype).to(ctx.device, copy=True)
                                      for d in range(ws)])
            for s, got in enumerate(outputs):
                results.equal(got, _exchanged(s, ctx.rank, n, dtype),
                              f"all_to_all entry {s}, {sweep.label(dtype, n)}")
    results.done()


@check(covers=("gather(dst)",
       "Transport::gather <- gather"))
def sweep_gather(ctx):
    """gather: the destination's list holds every rank's input, for every non-complex dtype at
    every size of the sweep, the destination moving from rank to rank (torch does not view
    complex tensors as real for gather) (torch.distributed.gather)."""
    results = sweep.Comparisons()
    for dtype in sweep.ARITHMETIC:
        for k, n in enumerate(sweep.counts(dtype, largest=False)):
            dst = k % ctx.world_size
            out = ([torch.empty(n, dtype=dtype, device=ctx.device) for _ in range(ctx.world_size)]
                   if ctx.rank == dst else None)
            dist.gather(sweep.rank_values(ctx.rank, n, dtype).to(ctx.device, copy=True), out, dst=dst)
            for j, got in enumerate(out or []):
                results.equal(got, sweep.rank_values(j, n, dtype),
                              f"gather(dst={dst}) entry {j}, {sweep.label(dtype, n)}")
    results.done()


@check(covers=("scatter(src)",
       "Transport::scatter <- scatter"))
def sweep_scatter(ctx):
    """scatter: rank r receives the source's r-th tensor, for every dtype at every size of the
    sweep, the source moving from rank to rank (torch.distributed.scatter)."""
    results = sweep.Comparisons()
    for dtype in sweep.DTYPES:
        for k, n in enumerate(sweep.counts(dtype, largest=False)):
            src = k % ctx.world_size
            pieces = ([_exchanged(src, r, n, dtype).to(ctx.device, copy=True) for r in range(ctx.world_size)]
                      if ctx.rank == src else None)
            out = torch.empty(n, dtype=dtype, device=ctx.device)
            dist.scatter(out, pieces, src=src)
            results.equal(out, _exchanged(src, ctx.rank, n, dtype),
                          f"scatter(src={src}) of {sweep.label(dtype, n)}")
    results.done()


@check(covers=("send(dst)/recv(src)",
       "Transport::send / recv <- send, recv, isend, irecv, batch_isend_irecv"))
def sweep_send_recv(ctx):
    """isend/irecv around a ring deliver the left neighbour's tensor for every dtype at every
    size of the sweep (past the mock's 256 KiB point-to-point chunks)
    (torch.distributed.isend/irecv)."""
    results = sweep.Comparisons()
    right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    for dtype in sweep.DTYPES:
        for n in sweep.counts(dtype):
            got = torch.empty(n, dtype=dtype, device=ctx.device)
            works = [dist.isend(sweep.rank_values(ctx.rank, n, dtype).to(ctx.device, copy=True), dst=right),
                     dist.irecv(got, src=left)]
            for work in works:
                work.wait()
            results.equal(got, sweep.rank_values(left, n, dtype),
                          f"irecv from rank {left} of {sweep.label(dtype, n)}")
    results.done()


#: The collective ops of PyTorch's guide for out-of-tree backends
#: (docs/source/accelerator/distributed.md in pytorch/pytorch), as c10d::Backend methods: the
#: minimal set every backend implements, then the extended set.
MINIMAL_OPS = ("broadcast", "allreduce", "allgather", "reduce_scatter", "barrier")
EXTENDED_OPS = ("allreduce_coalesced", "reduce", "_allgather_base", "allgather_coalesced",
                "allgather_into_tensor_coalesced", "gather", "scatter", "_reduce_scatter_base",
                "reduce_scatter_tensor_coalesced", "alltoall_base", "send", "recv", "recvAnysource")
#: The guide's capability bits that the installed torch's c10d::Backend reports through a
#: supportsX() virtual (Python: the backend object's property); the guide's others
#: (Reconfigure, Window, AbortHooks, CompletionHooks) have none in 2.13-2.15.
CAPABILITY_BITS = (("Splitting", "supports_splitting"), ("Coalescing", "supports_coalescing"),
                   ("TimeEstimation", "supports_time_estimate"), ("Shrinking", "supports_shrinking"))


def _guide_op(ctx, pg, backend, name: str) -> None:
    """Run the guide's op ``name`` once on this rank's device through the backend's own method
    (the two *_tensor_coalesced ops, which the Backend's Python binding lacks, through the
    dispatchable group, which hands device tensors to the same backend) and check its result."""
    from torch._C import _distributed_c10d as c10d

    ws, r, dev = ctx.world_size, ctx.rank, ctx.device

    def full(value, n=4):
        return torch.full((n,), float(value), device=dev)

    def every(n=4):  # rank p's input: p + 1
        return [torch.full((n,), float(p + 1)) for p in range(ws)]

    total = float(ws * (ws + 1) // 2)
    if name == "broadcast":
        t = full(r + 1)
        backend.broadcast([t], c10d.BroadcastOptions()).wait()  # root 0
        assert_equal(t, torch.full((4,), 1.0), "broadcast from rank 0")
    elif name in ("allreduce", "allreduce_coalesced"):
        ts = [full(r + 1), full(r + 1, 7)]
        if name == "allreduce":
            backend.allreduce(ts[:1], c10d.AllreduceOptions()).wait()
            ts = ts[:1]
        else:
            backend.allreduce_coalesced(ts, c10d.AllreduceCoalescedOptions()).wait()
        for t in ts:
            assert_equal(t, torch.full(t.shape, total), f"{name}: SUM of every rank's input")
    elif name == "reduce":
        t = full(r + 1)
        backend.reduce([t], c10d.ReduceOptions()).wait()  # root 0
        if r == 0:
            assert_equal(t, torch.full((4,), total), "reduce to rank 0")
    elif name == "allgather":
        outs = [[full(-1) for _ in range(ws)]]
        backend.allgather(outs, [full(r + 1)], c10d.AllgatherOptions()).wait()
        assert_equal(torch.stack(outs[0]), torch.stack(every()), "allgather")
    elif name == "_allgather_base":
        out = full(-1, 4 * ws)
        backend._allgather_base(out, full(r + 1), c10d.AllgatherOptions()).wait()
        assert_equal(out, torch.cat(every()), "_allgather_base")
    elif name == "allgather_coalesced":
        outs = [[full(-1) for _ in range(2)] for _ in range(ws)]
        backend.allgather_coalesced(outs, [full(r + 1), full(10 * (r + 1))],
                                    c10d.AllgatherOptions()).wait()
        for p in range(ws):
            assert_equal(torch.stack(outs[p]), torch.stack([torch.full((4,), float(p + 1)),
                                                            torch.full((4,), 10.0 * (p + 1))]),
                         f"allgather_coalesced: rank {p}'s inputs")
    elif name == "allgather_into_tensor_coalesced":
        outs = [full(-1, 4 * ws), full(-1, 2 * ws)]
        pg.allgather_into_tensor_coalesced(outs, [full(r + 1), full(r + 1, 2)]).wait()
        assert_equal(outs[0], torch.cat(every()), f"{name} 0")
        assert_equal(outs[1], torch.cat(every(2)), f"{name} 1")
    elif name in ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"):
        # rank p contributes p + 1 + q to rank q's block: rank r gets total + ws * r
        expected = torch.full((4,), total + ws * r)
        blocks = [full(r + 1 + q) for q in range(ws)]
        if name == "reduce_scatter":
            out = full(-1)
            backend.reduce_scatter([out], [blocks], c10d.ReduceScatterOptions()).wait()
            outs = [out]
        elif name == "_reduce_scatter_base":
            outs = [full(-1)]
            backend._reduce_scatter_base(outs[0], torch.cat(blocks), c10d.ReduceScatterOptions()).wait()
        else:
            outs = [full(-1), full(-1)]
            pg.reduce_scatter_tensor_coalesced(outs, [torch.cat(blocks), torch.cat(blocks)],
                                               c10d.ReduceScatterOptions()).wait()
        for out in outs:
            assert_equal(out, expected, f"{name}: rank {r}'s block")
    elif name == "gather":
        outs = [[full(-1) for _ in range(ws)]] if r == 0 else []
        opts = c10d.GatherOptions()
        opts.rootRank = 0
        backend.gather(outs, [full(r + 1)], opts).wait()
        if r == 0:
            assert_equal(torch.stack(outs[0]), torch.stack(every()), "gather to rank 0")
    elif name == "scatter":
        out = full(-1)
        opts = c10d.ScatterOptions()
        opts.rootRank = 0
        backend.scatter([out], [[full(p + 1) for p in range(ws)]] if r == 0 else [], opts).wait()
        assert_equal(out, torch.full((4,), float(r + 1)), "scatter from rank 0")
    elif name == "alltoall_base":
        out = full(-1, ws)
        backend.alltoall_base(out, torch.arange(ws, dtype=torch.float32, device=dev) + 10 * r,
                              [], [], c10d.AllToAllOptions()).wait()
        assert_equal(out, torch.arange(ws, dtype=torch.float32) * 10 + r, "alltoall_base")
    elif name == "barrier":
        backend.barrier(c10d.BarrierOptions()).wait()
    elif name in ("send", "recv", "recvAnysource"):
        if ws < 2:
            ctx.skip("point to point needs 2 ranks")
        nxt, prev = (r + 1) % ws, (r - 1) % ws
        got = full(-1)
        receive = (backend.recv([got], prev, 7) if name != "recvAnysource"
                   else backend.recv_anysource([got], 7))
        sent = full(r + 1)
        backend.send([sent], nxt, 7).wait()
        receive.wait()
        assert_equal(got, torch.full((4,), float(prev + 1)), f"{name}: from rank {prev}")
        if name == "recvAnysource":
            assert_value(receive._source_rank(), prev, "recvAnysource's source rank")
    else:
        raise ValueError(f"no exercise for the guide's op {name!r}")


def _exercise_capability(ctx, pg, bit: str) -> str:
    """Use an advertised capability the way torch does and check that it works; the detail."""
    ws = ctx.world_size
    if bit == "Splitting":
        # split_group needs the default group bound to a device (init_process_group(device_id=)),
        # which the suite's shared group is not: rank 0 runs devicemesh's eager-init probe, a
        # fresh 2-rank world that splits it into DeviceMesh's sub-groups and split_groups
        from accelkit.conformance.checks.devicemesh import split_probe

        if ctx.rank != 0:
            return "exercised on rank 0"
        split_probe(ctx)
        return ("split_group into the whole world and into groups of one rank, and DeviceMesh's "
                "sub-groups, in a 2-rank world bound to the device, each reducing over its ranks")
    if bit == "Coalescing":
        from torch.distributed.distributed_c10d import _coalescing_manager

        ts = [torch.full((n,), float(ctx.rank + 1), device=ctx.device) for n in (3, 0, 9)]
        with _coalescing_manager(group=pg, device=ctx.device, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        for t in ts:
            assert_equal(t, torch.full(t.shape, float(ws * (ws + 1) // 2)), "a coalesced all_reduce")
        return "three all_reduce in one _coalescing_manager (start/end coalescing)"
    if bit == "TimeEstimation":
        from torch.distributed.distributed_c10d import _time_estimator

        with _time_estimator(group=pg, device=ctx.device) as cm:
            dist.all_reduce(torch.ones(1 << 16, device=ctx.device))
        assert cm.estimated_time is not None and cm.estimated_time > 0, (
            f"_time_estimator gave {cm.estimated_time!r} for an all_reduce of 256 KiB, expected a "
            "positive time")
        return f"_time_estimator: {cm.estimated_time} for an all_reduce of 256 KiB"
    # Shrinking removes ranks from a group for good; the suite's ranks share theirs
    ctx.skip("advertised; shrink_group would remove ranks from the group the suite's checks share")


@check(requires=("accelerator",), timeout=120)
def capability_levels(ctx):
    """The levels of PyTorch's guide for out-of-tree c10d backends
    (docs/source/accelerator/distributed.md in pytorch/pytorch) this backend reaches: each op of
    the minimal set (broadcast, allreduce, allgather, reduce_scatter, barrier) and of the extended
    set (the coalesced, base, rooted, all-to-all and point-to-point methods) called once through
    the c10d::Backend itself with its result checked; and each capability bit the backend
    advertises through the installed torch's supportsX() virtuals (supports_splitting, ...)
    used as torch uses it (torch.distributed.split_group, _coalescing_manager,
    _time_estimator) and checked. One
    row per op and bit; the report shows the level reached. An op that raises or computes a
    wrong result, or an advertised capability that does not work, fails the check."""
    pg = dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(ctx.device)
    failed = []

    def row(capability, kind, run):
        try:
            detail, status = run() or "", "pass"
        except Skip as skip:  # ctx.skip inside a row skips the row, not the check
            detail, status = str(skip), "skip"
        except AssertionError as e:
            detail, status = str(e), "fail"
        except Exception as e:  # noqa: BLE001  (the row records what the backend raised)
            detail, status = f"{type(e).__name__}: {e}", "error"
        if status in ("fail", "error"):
            failed.append(f"{capability}: {detail}")
        if ctx.rank == 0:  # one table for the report; every rank checks its own results
            ctx.rows.append({"capability": capability, "kind": kind, "status": status,
                             "detail": detail})

    def capability(bit, attribute):
        advertised = getattr(backend, attribute, None)
        if advertised is None:
            ctx.skip(f"this torch's c10d::Backend has no {attribute}")
        if not advertised:
            ctx.skip(f"not advertised ({attribute} is False)")
        return f"advertised; {_exercise_capability(ctx, pg, bit)}"

    for kind, ops in (("minimal", MINIMAL_OPS), ("extended", EXTENDED_OPS)):
        for name in ops:
            row(name, kind, lambda n=name: _guide_op(ctx, pg, backend, n))
    for bit, attribute in CAPABILITY_BITS:
        row(bit, "capability", lambda b=bit, a=attribute: capability(b, a))
    assert not failed, (f"{len(failed)} of the guide's ops and advertised capabilities do not work "
                        "on this backend:\n" + "\n".join(failed))
