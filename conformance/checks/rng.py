"""DTensor's RNG state tracker on the backend's device (PR 103235: ``CudaRNGStateTracker`` /
``OffsetBasedRNGTracker``, whose policy keeps random DTensor ops consistent across ranks;
PR 102468: the tracker works on any cuda-like device handle).

The tracker reads ``torch.<device>.get_rng_state()`` as 16 bytes (uint64 seed, int64 offset,
Philox layout), gives each shard a distinct starting offset and moves every rank's offset to
``old + ceil4(numel of the whole DTensor)`` afterwards. Every check except ``rng.cpu_mesh_refused``
needs the ``rng-tracker`` capability; torch refuses cpu meshes, so on the cpu backend they SKIP
with torch's reason.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import ALSO_AT, all_ranks_object, assert_equal, expect_raises
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, _random, distribute_tensor

TRACKER = ("rng-tracker",)
CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, requires=TRACKER)


def _handle(ctx):
    return getattr(torch, ctx.device_type)


def _seed_offset(state: torch.Tensor) -> tuple[int, int]:
    """(seed, offset) from a 16-byte Philox state."""
    state = state.detach().cpu().contiguous()
    assert state.dtype == torch.uint8 and state.numel() == 16, (
        f"get_rng_state() is {state.numel()} {state.dtype} values; the tracker needs 16 uint8 bytes "
        "(uint64 seed + int64 offset)")
    return int(state[:8].view(torch.uint64).item()), int(state[8:].view(torch.int64).item())


def _device_seed_offset(ctx) -> tuple[int, int]:
    return _seed_offset(_handle(ctx).get_rng_state(ctx.device))


def _fresh(ctx, mesh, seed: int = 1234):
    """Every rank seeded alike and a new tracker on ``mesh`` (no state sync needed)."""
    torch.manual_seed(seed)
    _random._rng_tracker = _random.OffsetBasedRNGTracker(mesh, run_state_sync=False)
    return _random._rng_tracker


def _skip_where_torch_picks_another_device(ctx) -> None:
    """SKIP on every rank, naming torch's limitation and the setting that avoids it, where
    torch's DTensor RNG tracker takes another device than some rank's as that rank's own: it
    takes device ``rank % device_count()`` (torch.distributed.tensor._random._resolve_device),
    while a launch gives rank ``node * L + i`` of hosts running L ranks each the device i
    (LOCAL_RANK). Those agree on every host only when the hosts show as many devices as they
    run ranks (or when there is one host). Every rank reaches the same verdict without a
    collective."""
    count = _handle(ctx).device_count()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
    wrong = [rank for rank in range(ctx.world_size) if rank % count != rank % local]
    if wrong:
        rank = wrong[0]
        ctx.skip(f"torch's DTensor RNG tracker takes device rank % device_count() as a rank's "
                 f"own (torch.distributed.tensor._random._resolve_device): {rank % count} for "
                 f"rank {rank}, which computes on device {rank % local} (its LOCAL_RANK), as "
                 f"{len(wrong)} rank(s) do where a host shows more devices ({count}) than it "
                 f"runs ranks ({local}). Give each host as many devices as ranks (torchrun "
                 f"--nproc-per-node = devices per host; the mock does under torchrun unless "
                 f"ACCELKIT_MOCK_DEVICES is set)")


def _ceil4(n: int) -> int:
    return (n + 3) // 4 * 4


def _rand(mesh, shape, placements, device):
    """A random DTensor: uniform_ on a distributed zero tensor (a DTensor random op)."""
    dt = distribute_tensor(torch.zeros(shape, device=device), mesh, placements, src_data_rank=None)
    return dt.uniform_()


def _gather_locals(dt: DTensor, group=None) -> list[torch.Tensor]:
    return all_ranks_object(dt.to_local().detach().cpu(), group)


@check(requires=())
def cpu_mesh_refused(ctx):
    """torch's tracker refuses a cpu mesh: OffsetBasedRNGTracker(cpu mesh) raises RuntimeError
    naming "CUDA/CUDA-like/XPU" — why the rng checks are SKIPped, not failed, on the cpu
    backend (torch.distributed.tensor._random, PR 103235)."""
    mesh = DeviceMesh("cpu", list(range(ctx.world_size)))
    with expect_raises(RuntimeError, "CUDA/CUDA-like/XPU", what="OffsetBasedRNGTracker(cpu mesh)"):
        _random.OffsetBasedRNGTracker(mesh, run_state_sync=False)


@check
def supported(ctx):
    """is_rng_supported_mesh is True for the device's mesh (the handle has set_rng_state), the
    backend declares an RNG class other than "unsupported", and the tracker builds on the
    rank's device (PR 103235, PR 102468)."""
    mesh = ctx.mesh((ctx.world_size,))
    assert _random.is_rng_supported_mesh(mesh), (
        f"is_rng_supported_mesh is False on {ctx.device_type}, expected True (the handle needs "
        "set_rng_state)")
    declared = ctx.spec.capabilities.rng
    assert declared in ("offset-exact", "offset-consistent"), (
        f"backend declares rng={declared!r}, expected 'offset-exact' or 'offset-consistent'")
    tracker = _fresh(ctx, mesh)
    expected = torch.device(ctx.device_type, ctx.rank % _handle(ctx).device_count())
    assert tracker._device == expected, f"tracker device {tracker._device}, expected {expected}"


@check(covers=("torch.<device>.get_rng_state", "torch.<device>.set_rng_state"))
def state_layout(ctx):
    """get_rng_state() is 16 bytes that decode to (seed, offset): torch.manual_seed(s) gives
    seed s at offset 0 on the device, a device random op moves the offset forward, the state
    is accepted for the device as an int, a str and a torch.device, and set_rng_state restores
    it (the Philox layout the tracker assumes, PR 103235)."""
    handle = _handle(ctx)
    torch.manual_seed(4321)
    seed, offset = _device_seed_offset(ctx)
    assert (seed, offset) == (4321, 0), (
        f"after torch.manual_seed(4321): (seed, offset) ({seed}, {offset}), expected (4321, 0)")
    saved = handle.get_rng_state(ctx.device)
    first = torch.rand(64, device=ctx.device)
    seed2, offset2 = _device_seed_offset(ctx)
    if ctx.spec.capabilities.rng == "offset-exact":  # 64 elements take offsets 0..63
        assert (seed2, offset2) == (4321, 64), (
            f"after torch.rand(64): (seed, offset) ({seed2}, {offset2}), expected (4321, 64): an "
            "offset-exact generator advances by ceil4(numel)")
    assert seed2 == 4321 and offset2 > offset, (
        f"after torch.rand(64): (seed, offset) ({seed2}, {offset2}), expected seed 4321 and an "
        f"offset above {offset} (the op must advance the device generator)")
    for form in (ctx.device.index, str(ctx.device), ctx.device):
        got, want = handle.get_rng_state(form), handle.get_rng_state(ctx.device)
        assert torch.equal(got, want), (
            f"get_rng_state({form!r}) is {_seed_offset(got)}, expected get_rng_state"
            f"({ctx.device}) = {_seed_offset(want)}")
    handle.set_rng_state(saved, ctx.device)
    restored = _device_seed_offset(ctx)
    assert restored == (4321, 0), (
        f"after set_rng_state(saved): (seed, offset) {restored}, expected (4321, 0)")
    assert_equal(torch.rand(64, device=ctx.device), first, "draw after restoring the state")


@check
def manual_seed_sync(ctx):
    """DTensor's manual_seed(seed, mesh) gives every rank of the mesh that seed (offset 0), and
    on a rank outside a sub-mesh it raises RuntimeError ("requires the current rank to be a
    part of the device mesh") (torch.distributed.tensor._random.manual_seed, PR 103235)."""
    torch.manual_seed(1000 + ctx.rank)
    mesh = ctx.mesh((ctx.world_size,))
    _random.manual_seed(777, mesh)
    states = all_ranks_object(_device_seed_offset(ctx))
    assert all(s == (777, 0) for s in states), (
        f"(seed, offset) per rank after manual_seed(777, mesh): {states}, expected (777, 0) on each")
    half = ctx.world_size // 2
    sub = DeviceMesh(ctx.device_type, list(range(half)))
    if ctx.rank < half:
        _random.manual_seed(778, sub)
        got = _device_seed_offset(ctx)
        assert got[0] == 778, f"after manual_seed(778, sub-mesh): (seed, offset) {got}, expected seed 778"
    else:
        with expect_raises(RuntimeError, "part of the device mesh",
                           what="manual_seed on a sub-mesh, on a non-member rank"):
            _random.manual_seed(778, sub)


@check
def tracker_type(ctx):
    """With no tracker yet, the first random DTensor op creates an OffsetBasedRNGTracker on the
    rank's device (PR 103235: the default policy)."""
    torch.manual_seed(5)
    _random._rng_tracker = None
    mesh = ctx.mesh((ctx.world_size,))
    _rand(mesh, (8, 4), [Shard(0)], ctx.device)
    tracker = _random._rng_tracker
    assert isinstance(tracker, _random.OffsetBasedRNGTracker), (
        f"tracker is {type(tracker).__name__}, expected OffsetBasedRNGTracker")
    expected = torch.device(ctx.device_type, ctx.rank % _handle(ctx).device_count())
    assert tracker._device == expected, f"tracker device {tracker._device}, expected {expected}"


@check
def offset_advance(ctx):
    """After a random DTensor op every rank's offset moves from o to o + ceil4(numel of the
    whole DTensor), for Shard(0), Shard(1) and Replicate of a (5, 7) tensor (35 -> 36) and a
    2-D mesh layout (OffsetBasedRNGTracker._set_post_op_offset, PR 103235)."""
    mesh = ctx.mesh((ctx.world_size,))
    mesh2 = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    _fresh(ctx, mesh)
    for m, placements in ((mesh, [Shard(0)]), (mesh, [Shard(1)]), (mesh, [Replicate()]),
                          (mesh2, [Shard(0), Replicate()])):
        before = _device_seed_offset(ctx)[1]
        _rand(m, (5, 7), placements, ctx.device)
        after = all_ranks_object(_device_seed_offset(ctx)[1])
        assert all(a == before + _ceil4(35) for a in after), (
            f"{placements}: offsets after the op {after}, expected {before} + {_ceil4(35)} on every rank")


def _assert_pairwise_distinct(pieces, what):
    for i in range(len(pieces)):
        for j in range(i + 1, len(pieces)):
            assert not torch.equal(pieces[i], pieces[j]), (
                f"{what}: shards {i} and {j} are equal, expected different random values")


@check
def shard_distinct(ctx):
    """A random Shard(0) and a random Shard(1) DTensor hold different values on every shard
    (each shard starts at its own offset) (PR 103235)."""
    mesh = ctx.mesh((ctx.world_size,))
    _fresh(ctx, mesh)
    for placement in (Shard(0), Shard(1)):
        pieces = _gather_locals(_rand(mesh, (8, 8), [placement], ctx.device))
        _assert_pairwise_distinct(pieces, str(placement))


@check
def replicate_equal(ctx):
    """A random Replicate DTensor is the same on every rank (PR 103235)."""
    mesh = ctx.mesh((ctx.world_size,))
    _fresh(ctx, mesh)
    pieces = _gather_locals(_rand(mesh, (6, 5), [Replicate()], ctx.device))
    for r, piece in enumerate(pieces):
        assert_equal(piece, pieces[0], f"Replicate random values on rank {r} vs rank 0")


@check
def mesh_2d(ctx):
    """On a (dp, tp) mesh a random [Shard(0), Replicate()] DTensor is equal along the replicate
    (tp) dim and distinct along the shard (dp) dim (PR 103235)."""
    mesh = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    _fresh(ctx, mesh)
    local = _rand(mesh, (8, 6), [Shard(0), Replicate()], ctx.device).to_local().cpu()
    along_tp = all_ranks_object(local, mesh["tp"].get_group())
    for piece in along_tp:
        assert_equal(piece, local, "random values along the replicate (tp) dim")
    along_dp = all_ranks_object(local, mesh["dp"].get_group())
    _assert_pairwise_distinct(along_dp, "along the shard (dp) dim")


@check
def determinism(ctx):
    """The same seed gives the same random DTensor: two runs after torch.manual_seed(s) (with a
    fresh tracker each time) give bitwise equal local shards; another seed gives other values
    (PR 103235)."""
    mesh = ctx.mesh((ctx.world_size,))
    runs = []
    for seed in (11, 11, 12):
        _fresh(ctx, mesh, seed)
        runs.append(_rand(mesh, (8, 6), [Shard(0)], ctx.device).to_local().cpu())
    assert_equal(runs[1], runs[0], "second run with the same seed")
    assert not torch.equal(runs[2], runs[0]), (
        "seed 12 gave the values of seed 11, expected different values")


@check(requires=TRACKER + ("offset-exact",))
def offset_exact(ctx):
    """For an offset-exact backend a random Shard(0) DTensor equals, bit for bit, the same op on
    one device at the same seed: shard r starts at offset r * local numel (a multiple of 4)
    (PR 103235's offset policy)."""
    mesh = ctx.mesh((ctx.world_size,))
    shape = (4 * ctx.world_size, 8)
    _fresh(ctx, mesh, 99)
    full = _rand(mesh, shape, [Shard(0)], ctx.device).full_tensor()
    torch.manual_seed(99)
    reference = torch.zeros(shape, device=ctx.device).uniform_()
    assert_equal(full, reference, "Shard(0) random DTensor vs the single-device op")


@check(requires=TRACKER + ("offset-exact",))
def offset_rounding(ctx):
    """For an offset-exact backend a device random op of n elements advances the generator by
    ceil4(n) also when n is not a multiple of 4 (Philox draws four values per counter): after
    torch.rand(5) the offset is 8, and torch.rand(5) then torch.rand(3) draw elements 0..4 and
    8..10 of one torch.rand(12) at the same seed — the offsets the tracker computes for shards
    and after each op (torch.distributed.tensor._random, PR 103235)."""
    torch.manual_seed(77)
    first = torch.rand(5, device=ctx.device)
    seed, offset = _device_seed_offset(ctx)
    assert (seed, offset) == (77, 8), (
        f"after torch.rand(5): (seed, offset) ({seed}, {offset}), expected (77, 8): ceil4(5)")
    second = torch.rand(3, device=ctx.device)
    torch.manual_seed(77)
    whole = torch.rand(12, device=ctx.device).cpu()
    assert_equal(first.cpu(), whole[:5], "torch.rand(5) vs elements 0..4 of torch.rand(12)")
    assert_equal(second.cpu(), whole[8:11],
                 "torch.rand(3) after torch.rand(5) vs elements 8..10 of torch.rand(12)")


@check
def dropout(ctx):
    """F.dropout on DTensors in training mode: a Replicate input gets the same mask on every
    rank, a Shard(0) input a different mask on each shard; kept values are scaled by 1/(1-p)
    (PR 103235: dropout is a tracked random op). The edges draw nothing and are the CPU's on
    every device (``aten.native_dropout``): p=1 drops every element (a mask all False, zero
    gradients), p=0 and evaluation mode keep the input (a mask all True)."""
    x = torch.arange(1.0, 9.0, device=ctx.device, requires_grad=True)
    for p, train, kept in ((1.0, True, False), (0.0, True, True), (0.5, False, True)):
        out, mask = torch.ops.aten.native_dropout(x, p, train)
        what = f"native_dropout(p={p}, train={train})"
        assert out is not None and mask is not None, f"{what} returned an undefined tensor"
        assert out.device == x.device and mask.device == x.device, (
            f"{what} returned tensors on {out.device} and {mask.device}, not on {x.device}")
        assert mask.dtype == torch.bool, f"{what}: the mask is {mask.dtype}, not torch.bool"
        assert_equal(out.detach().cpu(), torch.arange(1.0, 9.0) * kept, f"{what}'s output")
        assert mask.cpu().tolist() == [kept] * 8, f"{what}'s mask: {mask.cpu().tolist()}"
    F.dropout(x, p=1.0, training=True).sum().backward()
    assert_equal(x.grad.cpu(), torch.zeros(8), "the gradient through dropout(p=1)")
    mesh = ctx.mesh((ctx.world_size,))
    _fresh(ctx, mesh)
    ones = torch.ones(8, 16, device=ctx.device)
    rep = F.dropout(distribute_tensor(ones, mesh, [Replicate()]), p=0.5, training=True).to_local().cpu()
    values = rep.unique().tolist()
    assert set(values) <= {0.0, 2.0}, (
        f"dropout(p=0.5) of ones gave values {values}, expected only 0 and 2 (kept / (1 - p))")
    for r, piece in enumerate(all_ranks_object(rep)):
        assert_equal(piece, rep, f"Replicate dropout mask on rank {r}")
    shard = F.dropout(distribute_tensor(ones, mesh, [Shard(0)]), p=0.5, training=True)
    _assert_pairwise_distinct(_gather_locals(shard), "Shard(0) dropout masks")


@check
def user_generator(ctx):
    """A random DTensor op given generator= (a device Generator) draws from that generator's
    state — a reseeded generator repeats the values and matches the default generator at the
    same seed — advances it by ceil4(numel), and leaves the default generator alone
    (PR 103235's tracker with a user generator)."""
    _skip_where_torch_picks_another_device(ctx)
    mesh = ctx.mesh((ctx.world_size,))
    _fresh(ctx, mesh, 5)
    gen = torch.Generator(device=ctx.device)
    default_before = _device_seed_offset(ctx)

    def draw():
        dt = distribute_tensor(torch.zeros(8, 6, device=ctx.device), mesh, [Shard(0)], src_data_rank=None)
        return dt.uniform_(generator=gen).to_local().cpu()

    gen.manual_seed(42)
    first = draw()
    seed, offset = _seed_offset(gen.get_state())
    assert (seed, offset) == (42, _ceil4(48)), (
        f"user generator (seed, offset) {(seed, offset)} after an (8, 6) op, expected "
        f"(42, {_ceil4(48)})")
    default_after = _device_seed_offset(ctx)
    assert default_after == default_before, (
        f"the default generator moved from {default_before} to {default_after}, expected it "
        "untouched (the op was given generator=)")
    gen.manual_seed(42)
    assert_equal(draw(), first, "reseeded user generator")
    _fresh(ctx, mesh, 42)
    default_draw = distribute_tensor(torch.zeros(8, 6, device=ctx.device), mesh, [Shard(0)],
                                     src_data_rank=None).uniform_().to_local().cpu()
    assert_equal(default_draw, first, "default generator at the same seed")


@check(covers=("torch.<device>.get_rng_state", "torch.<device>.set_rng_state"))
def fork_rng(ctx):
    """torch.random.fork_rng(devices=[device], device_type=...) restores the device's RNG state
    on exit: a draw after the block repeats the draw inside it (torch.random.fork_rng, which
    the tracker runs every random op in)."""
    torch.manual_seed(8)
    before = _handle(ctx).get_rng_state(ctx.device).clone()
    with torch.random.fork_rng(devices=[ctx.device], device_type=ctx.device_type):
        inside = torch.rand(32, device=ctx.device)
    after = _handle(ctx).get_rng_state(ctx.device)
    assert torch.equal(after, before), (
        f"after fork_rng: (seed, offset) {_seed_offset(after)}, expected {_seed_offset(before)} "
        "(the state before the block)")
    assert_equal(torch.rand(32, device=ctx.device), inside, "draw after fork_rng")


@check
def run_state_sync(ctx):
    """OffsetBasedRNGTracker(mesh, run_state_sync=True) broadcasts rank 0's device RNG state:
    ranks seeded differently all end with rank 0's (seed, offset) (PR 103235)."""
    torch.manual_seed(200 + ctx.rank)
    torch.rand(4 * (ctx.rank + 1), device=ctx.device)
    rank0 = all_ranks_object(_device_seed_offset(ctx))[0]
    mesh = ctx.mesh((ctx.world_size,))
    _random._rng_tracker = _random.OffsetBasedRNGTracker(mesh, run_state_sync=True)
    states = all_ranks_object(_device_seed_offset(ctx))
    assert all(s == rank0 for s in states), (
        f"(seed, offset) per rank after run_state_sync: {states}, expected rank 0's {rank0} on each")


@check
def init_weights(ctx):
    """nn.init uniform_, normal_, trunc_normal_ and kaiming_uniform_ on DTensor parameters are
    deterministic at a seed, give equal replicas for Replicate and distinct shards for
    Shard(0) (PR 103235: parameter init through the tracker)."""
    mesh = ctx.mesh((ctx.world_size,))
    inits = {
        "uniform_": nn.init.uniform_,
        "normal_": nn.init.normal_,
        "trunc_normal_": nn.init.trunc_normal_,
        "kaiming_uniform_": lambda t: nn.init.kaiming_uniform_(t, a=5 ** 0.5),
    }
    for name, init in inits.items():
        for placement in (Replicate(), Shard(0)):
            results = []
            for _ in range(2):
                _fresh(ctx, mesh, 31)
                param = nn.Parameter(distribute_tensor(torch.empty(8, 6, device=ctx.device), mesh,
                                                       [placement], src_data_rank=None))
                with torch.no_grad():
                    init(param)
                results.append(param.to_local().detach().cpu())
            assert_equal(results[1], results[0], f"{name} on {placement}: same seed")
            pieces = all_ranks_object(results[0])
            if placement == Replicate():
                for r, piece in enumerate(pieces):
                    assert_equal(piece, results[0], f"{name} replica on rank {r}")
            else:
                _assert_pairwise_distinct(pieces, f"{name} on Shard(0)")


@check
def submesh(ctx):
    """A random op on a DTensor of a sub-mesh (the first half of the ranks): members advance
    their offset by ceil4(numel) and hold distinct shards; non-members do not run the op and
    their RNG state is left unchanged (PR 103235: "the RNG state may be asynchronous outside of
    participating ranks")."""
    full_mesh = ctx.mesh((ctx.world_size,))
    _fresh(ctx, full_mesh)
    half = ctx.world_size // 2
    sub = DeviceMesh(ctx.device_type, list(range(half)))
    before = _device_seed_offset(ctx)
    dt = distribute_tensor(torch.zeros(8, 4, device=ctx.device), sub, [Shard(0)], src_data_rank=None)
    dt.uniform_()
    after = _device_seed_offset(ctx)
    pieces = all_ranks_object(dt.to_local().cpu())
    if ctx.rank < half:
        assert after == (before[0], before[1] + _ceil4(32)), (
            f"member (seed, offset) {before} -> {after}, expected "
            f"{(before[0], before[1] + _ceil4(32))}")
        _assert_pairwise_distinct(pieces[:half], "sub-mesh shards")
    else:
        assert after == before, (
            f"non-member (seed, offset) {before} -> {after}, expected it unchanged")
        assert dt.to_local().numel() == 0, (
            f"non-member local shard has {dt.to_local().numel()} elements, expected 0")
    dist.barrier()


#: Seeds that need more than 32 bits, up to the largest torch.manual_seed accepts.
WIDE_SEEDS = (2**32 + 5, 2**63 + 11, 2**64 - 1)


@check(covers=("torch.<device>.manual_seed_all", "torch.<device>.initial_seed"))
def seed_width(ctx):
    """The device generator keys on all 64 bits of the seed, as CUDA's Philox (its key is
    64 bits; torch's CPU mt19937 keeps 32, so the cpu backend skips with the module's reason):
    after torch.manual_seed(s) for s >= 2**32, torch.rand on the device differs from what the
    seed's low 32 bits draw, and torch.<device>.initial_seed() returns s
    (torch.manual_seed, torch.cuda.initial_seed)."""
    handle = _handle(ctx)
    for seed in WIDE_SEEDS:
        low = seed & 0xFFFFFFFF
        torch.manual_seed(seed)
        wide_draw = torch.rand(64, device=ctx.device).cpu()
        assert handle.initial_seed() == seed, (
            f"after torch.manual_seed({seed}) initial_seed() is {handle.initial_seed()}, "
            f"expected {seed}" + (" (the low 32 bits: seed truncated)"
                                  if handle.initial_seed() == low else ""))
        torch.manual_seed(low)
        assert not torch.equal(torch.rand(64, device=ctx.device).cpu(), wide_draw), (
            f"torch.manual_seed({seed}) and manual_seed({low}) draw the same numbers on "
            f"{ctx.device}: the generator keeps only the low 32 bits of the seed")


@check(covers=("torch.<device>.set_device", "torch.<device>.manual_seed",
       "torch.<device>.manual_seed_all", "torch.<device>.initial_seed",
       "torch.<device>.get_rng_state"))
def seed_every_device(ctx):
    """Seeding reaches the right device's generator with the whole seed: manual_seed(s_i) with
    device i current seeds device i only (initial_seed() and the seed bytes of
    get_rng_state(i) are s_i, every other device keeps its own), and torch.manual_seed(s) /
    manual_seed_all(s) seed every device (torch.cuda.manual_seed / manual_seed_all,
    torch.random._seed_custom_device; the state's first 8 bytes are the uint64 seed)."""
    handle = _handle(ctx)
    here = handle.current_device()
    count = handle.device_count()
    seeds = [2**40 + 7919 * i + 3 for i in range(count)]
    try:
        for i, seed in enumerate(seeds):
            handle.set_device(i)
            handle.manual_seed(seed)
            assert handle.initial_seed() == seed, (
                f"manual_seed({seed}) with device {i} current: initial_seed() is "
                f"{handle.initial_seed()}, expected {seed}")
        for i, seed in enumerate(seeds):
            got = _seed_offset(handle.get_rng_state(i))
            assert got == (seed, 0), (
                f"device {i} after manual_seed({seed}) with it current (and the others seeded "
                f"after it): (seed, offset) {got}, expected ({seed}, 0)")
        for what, seed_all in (("torch.manual_seed", torch.manual_seed),
                               ("manual_seed_all", handle.manual_seed_all)):
            seed = 2**50 + 17 + (what == "manual_seed_all")
            seed_all(seed)
            got = [_seed_offset(handle.get_rng_state(i)) for i in range(count)]
            wrong = {i: g for i, g in enumerate(got) if g != (seed, 0)}
            assert not wrong, (
                f"after {what}({seed}) devices {sorted(wrong)} have (seed, offset) "
                f"{list(wrong.values())}, expected ({seed}, 0) on all {count}")
    finally:
        handle.set_device(here)
