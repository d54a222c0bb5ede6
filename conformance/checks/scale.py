"""Scale: the parts of the distributed stack whose behaviour depends on the world size, at 16,
64, 256 and 1,024 ranks, simulated in one process on torch's fake process group registered for
the device under test (:mod:`accelkit.conformance.launchers.simulate`): DeviceMesh 1-D to 4-D layouts,
per-dimension groups, slicing, flattening and how many process groups each creates; DTensor
shard layouts and the collectives a redistribute plans; ``parallelize_module`` and FSDP2
``fully_shard`` plans on meta parameters; the RNG tracker's Philox offsets for every rank's
coordinate. Each of these runs as rank 0 of the world (the fake group moves no data, so they
check layouts, plans and counts). The ``local_*`` checks (16 and 64 ranks) check the numbers:
under ``LocalTensorMode`` (torch.distributed._local_tensor) every simulated rank's values are
computed in the one process, and DTensor, TP and FSDP2 results must equal the single-device
ones. The report keeps these results apart from the real ones and records each size's time
and peak memory.

Sources: torch.testing._internal.distributed.fake_pg (``FakeProcessGroup``),
torch.distributed.device_mesh (PR 102336: sub-groups per mesh dimension), torch's
``distributed/tensor/_utils.py`` (``_compute_local_shape_and_global_offset``),
``distributed/tensor/_random.py`` (``OffsetBasedRNGTracker``, PR 103235),
torch.distributed.tensor.parallel.parallelize_module, torch.distributed.fsdp.fully_shard.
"""

from __future__ import annotations

import copy
import itertools
import math

import torch
import torch.distributed as dist
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._transformer import Transformer, tp_plan
from accelkit.conformance.checks._util import assert_close, assert_value, host_tensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.distributed_c10d import _world
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._random import (
    OffsetBasedRNGTracker,
    _calc_first_shard_size,
    _calc_shard_info,
    _PhiloxState,
)
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.debug import CommDebugMode

CHECK_DEFAULTS = Defaults(world_size=16, also_at=(64, 256, 1024), simulated=True)

#: Names of the dimensions of an N-D mesh (the last N): replicate x shard x context x tensor.
DIM_NAMES = ("rep", "shard", "cp", "tp")


def mesh_shape(world_size: int, ndim: int) -> tuple[int, ...]:
    """A row-major mesh shape of ``ndim`` dimensions over ``world_size`` (a power of two)
    ranks, as even as the factors of two allow, the larger dimensions last."""
    if world_size & (world_size - 1):
        raise ValueError(f"the scale checks need a power-of-two world size, got {world_size}")
    exponents = [0] * ndim
    for i in range(world_size.bit_length() - 1):
        exponents[ndim - 1 - i % ndim] += 1
    return tuple(2 ** e for e in exponents)


def _mesh(ctx, ndim: int):
    shape = mesh_shape(ctx.world_size, ndim)
    return init_device_mesh(ctx.device_type, shape, mesh_dim_names=DIM_NAMES[-ndim:])


def _group_count() -> int:
    """The process groups this rank holds (c10d's ``_world.pg_map``), the default one included."""
    return len(_world.pg_map)


def _row_major_group(shape: tuple[int, ...], dims: tuple[int, ...]) -> list[int]:
    """Rank 0's group over mesh dimensions ``dims`` of a row-major mesh of ``shape``: the ranks
    whose coordinates are 0 on every other dimension."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    ranges = [range(shape[d]) for d in dims]
    return sorted(sum(i * strides[d] for i, d in zip(idx, dims, strict=True)) for idx in itertools.product(*ranges))


def _coordinates(shape: tuple[int, ...]):
    return itertools.product(*(range(n) for n in shape))


@check
def mesh_nd_groups(ctx):
    """init_device_mesh of 1 to 4 dimensions over the whole world on the device type: the
    row-major layout, rank 0's coordinate, one group per dimension (get_group by index and by
    name) holding exactly the ranks along it, served by the process group backend for the
    device; a 1-D mesh reuses the world group and an N-D mesh creates exactly N groups, anew
    for every init_device_mesh (torch.distributed.device_mesh, PR 102336)."""
    for ndim in range(1, 5):
        shape = mesh_shape(ctx.world_size, ndim)
        before = _group_count()
        mesh = _mesh(ctx, ndim)
        created = _group_count() - before
        assert_value(mesh.shape, shape, f"{ndim}-D mesh.shape")
        assert_value(mesh.device_type, ctx.device_type, f"{ndim}-D mesh.device_type")
        layout = mesh.mesh
        assert torch.equal(layout, torch.arange(ctx.world_size).reshape(shape)), (
            f"{ndim}-D mesh.mesh is not the row-major layout of {shape}")
        assert_value(tuple(mesh.get_coordinate()), (0,) * ndim, f"{ndim}-D mesh.get_coordinate()")
        assert_value(created, 0 if ndim == 1 else ndim, f"process groups created by a {ndim}-D mesh")
        for dim, name in enumerate(mesh.mesh_dim_names):
            group = mesh.get_group(dim)
            assert group is mesh.get_group(name), f"{ndim}-D get_group({dim}) is not get_group({name!r})"
            assert_value(dist.get_process_group_ranks(group), _row_major_group(shape, (dim,)),
                         f"{ndim}-D mesh: ranks of rank 0's group along {name!r}")
            backend = group._get_backend(torch.device(ctx.device_type)).name()
            assert_value(backend, "fake", f"{ndim}-D mesh: the {ctx.device_type} backend of {name!r}")
        if ndim == 1:
            assert mesh.get_group() is dist.group.WORLD, "a 1-D mesh over the world made a new group"
    again = _group_count()
    _mesh(ctx, 4)
    assert_value(_group_count() - again, 4, "process groups created by a second, equal 4-D mesh")


@check
def mesh_slice_flatten(ctx):
    """On a 4-D mesh: slicing any subset of named dimensions creates no process group and
    hands out the parent's groups; flattening ("cp", "tp") and ("rep", "shard") each creates
    one group of the product size over the expected ranks, and flattening again reuses it
    (DeviceMesh.__getitem__, DeviceMesh._flatten; PR 102336)."""
    mesh = _mesh(ctx, 4)
    shape = mesh.shape
    before = _group_count()
    for k in range(1, 5):
        for names in itertools.combinations(DIM_NAMES, k):
            sub = mesh[names]
            assert_value(sub.shape, tuple(shape[DIM_NAMES.index(n)] for n in names),
                         f"mesh[{names}].shape")
            for name in names:
                assert sub.get_group(name) is mesh.get_group(name), (
                    f"mesh[{names}].get_group({name!r}) is not the parent's group")
    assert_value(_group_count() - before, 0, "process groups created by slicing")
    for names in (("cp", "tp"), ("rep", "shard")):
        dims = tuple(DIM_NAMES.index(n) for n in names)
        size = math.prod(shape[d] for d in dims)
        before = _group_count()
        flat = mesh[names]._flatten("_".join(names))
        assert_value(_group_count() - before, 1, f"process groups created by flattening {names}")
        assert_value(flat.shape, (size,), f"flattened {names} shape")
        assert_value(dist.get_process_group_ranks(flat.get_group()), _row_major_group(shape, dims),
                     f"ranks of rank 0's flattened {names} group")
        again = mesh[names]._flatten("_".join(names))
        assert again.get_group() is flat.get_group(), f"flattening {names} again made a new group"
        assert_value(_group_count() - before, 1, f"process groups after flattening {names} twice")


def _tiles(shape: tuple[int, ...], mesh_shape_: tuple[int, ...], placements) -> None:
    """The shards of every coordinate of a mesh of ``mesh_shape_`` cover a tensor of ``shape``
    exactly once (replicas count once), as torch computes each coordinate's local shape and
    offset; every non-empty shard is held by as many coordinates as the replicated
    dimensions hold ranks (empty shards of an uneven split hold nothing)."""
    cover = torch.zeros(shape, dtype=torch.int32)
    boxes = {}
    for coord in _coordinates(mesh_shape_):
        local, offset = _compute_local_shape_and_global_offset(shape, mesh_shape_, list(coord),
                                                               placements)
        boxes.setdefault((tuple(local), tuple(offset)), []).append(coord)
    for (local, offset) in boxes:
        cover[tuple(slice(o, o + n) for o, n in zip(offset, local, strict=True))] += 1
    counts = cover.unique().tolist()
    assert counts == [1], (f"{list(shape)} on {list(mesh_shape_)} as {placements}: shards cover "
                           f"elements {counts} times, expected exactly once")
    replicas = math.prod(n for n, p in zip(mesh_shape_, placements, strict=True) if not isinstance(p, Shard))
    sizes = sorted({len(coords) for (local, _), coords in boxes.items() if math.prod(local)})
    assert sizes == [replicas], (f"{list(shape)} on {list(mesh_shape_)} as {placements}: each "
                                 f"shard held by {sizes} coordinates, expected {replicas}")


@check
def dtensor_shard_layouts(ctx):
    """DTensor placements on 2-D to 4-D meshes, even and uneven: the local shards torch
    computes for every rank's coordinate cover the global tensor exactly once, each held by
    the product of the replicated dimensions' sizes; rank 0's distribute_tensor on the device
    has the local shape computed for its coordinate (torch.distributed.tensor._utils.
    _compute_local_shape_and_global_offset, distribute_tensor)."""
    cases = [
        (2, (ctx.world_size, 6), [Shard(0), Shard(1)]),
        (2, (ctx.world_size * 2 + 3, 5), [Shard(0), Replicate()]),          # uneven
        (3, (37, ctx.world_size // 2 + 1), [Replicate(), Shard(1), Shard(0)]),  # uneven both
        (4, (8, 16, ctx.world_size // 4), [Shard(0), Replicate(), Shard(2), Shard(1)]),
    ]
    for ndim, shape, placements in cases:
        mesh = _mesh(ctx, ndim)
        _tiles(shape, mesh.shape, placements)
        local = distribute_tensor(torch.zeros(shape, device=ctx.device), mesh, placements).to_local()
        expected, _ = _compute_local_shape_and_global_offset(shape, mesh.shape, [0] * ndim, placements)
        assert_value(tuple(local.shape), tuple(expected), f"rank 0's local shape of {shape} as {placements}")
        assert_value(local.device.type, ctx.device_type, "the local shard's device type")


#: (source placements, destination placements, the one collective the redistribute issues;
#: ALLTOALL: an all_to_all, which torch replaces by an all_gather on cpu meshes).
ALLTOALL = "shard_dim_alltoall"
_REDISTRIBUTIONS = (
    ((Shard(0), Replicate(), Replicate()), (Replicate(), Replicate(), Replicate()), "all_gather_into_tensor"),
    ((Shard(0), Replicate(), Replicate()), (Shard(1), Replicate(), Replicate()), ALLTOALL),
    ((Partial(), Replicate(), Replicate()), (Replicate(), Replicate(), Replicate()), "all_reduce"),
    ((Partial(), Replicate(), Replicate()), (Shard(0), Replicate(), Replicate()), "reduce_scatter_tensor"),
    ((Replicate(), Replicate(), Shard(1)), (Replicate(), Replicate(), Replicate()), "all_gather_into_tensor"),
)


@check
def redistribute_plans(ctx):
    """DTensor.redistribute on a 3-D mesh issues exactly one collective of the expected kind
    per changed dimension (all_gather, all_to_all, all_reduce, reduce_scatter), counted by
    CommDebugMode, and the result has the destination placements and local shape; Shard on
    two dimensions to Replicate gathers twice (torch.distributed.tensor._redistribute,
    torch.distributed.tensor.debug.CommDebugMode; a cpu mesh gathers instead of all_to_all:
    torch.distributed.tensor._collective_utils.shard_dim_alltoall)."""
    mesh = _mesh(ctx, 3)
    shape = (4 * ctx.world_size, 2 * ctx.world_size)
    for src, dst, op in _REDISTRIBUTIONS:
        if op == ALLTOALL and ctx.device_type == "cpu":
            op = "all_gather_into_tensor"
        local_shape, _ = _compute_local_shape_and_global_offset(shape, mesh.shape, [0] * 3, src)
        source = DTensor.from_local(torch.zeros(local_shape, device=ctx.device), mesh, src,
                                    shape=torch.Size(shape), stride=(shape[1], 1))
        with CommDebugMode() as comm:
            out = source.redistribute(mesh, dst)
        counts = {str(k).rsplit(".", 1)[-1]: v for k, v in comm.get_comm_counts().items()}
        assert_value(counts, {op: 1}, f"collectives of {src} -> {dst}")
        assert_value(tuple(out.placements), dst, f"placements after {src} -> {dst}")
        expected, _ = _compute_local_shape_and_global_offset(shape, mesh.shape, [0] * 3, dst)
        assert_value(tuple(out.to_local().shape), tuple(expected), f"local shape after {src} -> {dst}")
    both = distribute_tensor(torch.zeros(shape, device=ctx.device), mesh,
                             [Shard(0), Shard(1), Replicate()])
    with CommDebugMode() as comm:
        both.redistribute(mesh, [Replicate()] * 3)
    assert_value(comm.get_total_counts(), 2, "collectives of [Shard(0), Shard(1), R] -> replicate")


def _meta_transformer() -> Transformer:
    with torch.device("meta"):
        return Transformer()


@check
def tp_plan_layout(ctx):
    """parallelize_module with the transformer's tensor-parallel plan on the "tp" dimension
    of a (dp, tp=4) mesh, on meta parameters: Colwise weights are Shard(0), Rowwise ones
    Shard(1) (the embedding Shard(0)), each a quarter of the full weight, norms stay plain
    parameters; no process group is created (torch.distributed.tensor.parallel.
    parallelize_module)."""
    tp = 4
    mesh = init_device_mesh(ctx.device_type, (ctx.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    model = _meta_transformer()
    full = {n: tuple(p.shape) for n, p in model.named_parameters()}
    before = _group_count()
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh["tp"], tp_plan(model))
    assert_value(_group_count() - before, 0, "process groups created by parallelize_module")
    rowwise = ("attention.wo", "feed_forward.w2")
    for name, param in model.named_parameters():
        if "norm" in name:
            assert not isinstance(param, DTensor), f"{name} became a DTensor; norms stay replicated"
            continue
        assert isinstance(param, DTensor), f"{name} is not a DTensor after parallelize_module"
        dim = 1 if name.split(".weight")[0].endswith(rowwise) else 0
        assert_value(tuple(param.placements), (Shard(dim),), f"{name}.placements")
        local = list(full[name])
        local[dim] //= tp
        assert_value(tuple(param.to_local().shape), tuple(local), f"{name} local shape")
        assert_value(param.device_mesh.get_group(), mesh.get_group("tp"), f"{name}'s group")


@check
def fsdp2_meta_sharding(ctx):
    """FSDP2 fully_shard per block and at the root on a (replicate, shard) mesh of meta
    parameters (HSDP): every parameter becomes a DTensor (Replicate(), Shard(0)) on that mesh
    whose rank-0 shard has ceil(dim0 / shard) rows, still on meta (torch.distributed.fsdp.
    fully_shard)."""
    from torch.distributed.fsdp import fully_shard

    rep = 2
    mesh = init_device_mesh(ctx.device_type, (rep, ctx.world_size // rep), mesh_dim_names=("rep", "shard"))
    model = _meta_transformer()
    full = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shard = mesh.size(1)
    for name, param in model.named_parameters():
        assert isinstance(param, DTensor), f"{name} is not a DTensor after fully_shard"
        assert_value(tuple(param.placements), (Replicate(), Shard(0)), f"{name}.placements")
        assert_value(tuple(param.shape), full[name], f"{name} global shape")
        local = (math.ceil(full[name][0] / shard), *full[name][1:])
        assert_value(tuple(param.to_local().shape), local, f"{name} rank-0 shard shape")
        assert_value(param.device.type, "meta", f"{name} device")


@check(requires=("rng-tracker",))
def rng_offsets_partition(ctx):
    """The RNG tracker's Philox offsets for every rank's coordinate of 3-D and 4-D meshes
    (even and uneven shards): ranks holding the same shard start at the same offset,
    different shards draw disjoint counter ranges, together as many counters as the tensor
    has elements, all below the offset every rank moves to afterwards; rank 0's matches
    OffsetBasedRNGTracker on the device, and a random op on the DTensor advances rank 0's
    device generator by that amount (torch.distributed.tensor._random, PR 103235)."""
    _assert_rng_partition(ctx, (
        (3, (64, ctx.world_size), (Shard(0), Replicate(), Shard(1))),
        (4, (8 * ctx.world_size, 12), (Replicate(), Shard(1), Replicate(), Shard(0))),
        (4, (2 * ctx.world_size + 8, 8), (Replicate(), Shard(0), Replicate(), Replicate())),
    ))


@check(requires=("rng-tracker",))
def rng_offsets_double_shard(ctx):
    """As rng_offsets_partition, for a tensor dimension sharded on two mesh dimensions
    ([Shard(0), Shard(0), Replicate(), Shard(1)], FSDP over TP on the same dimension): the
    shards' counter ranges must stay below the offset every rank moves to afterwards, or the
    next random op draws the same counters (torch.distributed.tensor._random,
    ``_calc_first_shard_size``)."""
    _assert_rng_partition(ctx, (
        (4, (8 * ctx.world_size, 12), (Shard(0), Shard(0), Replicate(), Shard(1))),
    ))


def _assert_rng_partition(ctx, cases) -> None:
    """Every case (mesh dimensions, global shape, placements) as rng_offsets_partition says."""
    handle = getattr(torch, ctx.device_type)
    for ndim, shape, placements in cases:
        mesh = _mesh(ctx, ndim)
        dtensor = distribute_tensor(torch.zeros(shape, device=ctx.device), mesh, list(placements))
        spec = dtensor._spec
        tracker = OffsetBasedRNGTracker(mesh)
        first = math.prod(_calc_first_shard_size(spec))
        end = tracker._compute_rng_offsets(spec)[1]
        starts: dict[int, tuple[int, int]] = {}  # shard index -> (start offset, numel)
        for coord in _coordinates(mesh.shape):
            index, count = _calc_shard_info(list(coord), spec)
            linear = tracker._calc_shard_linear_idx(index, count)
            start = (linear * first + 3) // 4 * 4
            local, _ = _compute_local_shape_and_global_offset(shape, mesh.shape, list(coord), placements)
            seen = starts.setdefault(linear, (start, math.prod(local)))
            assert seen == (start, math.prod(local)), (
                f"{placements}: coordinate {coord} holds shard {linear} at offset {start}, "
                f"another replica at {seen[0]}")
            if coord == (0,) * ndim:
                assert_value(tracker._compute_rng_offsets(spec)[0], start,
                             "rank 0's start offset from OffsetBasedRNGTracker")
        ranges = sorted(starts.values())
        for (a, n), (b, _) in zip(ranges, ranges[1:], strict=False):
            assert a + n <= b, f"{placements} on {mesh.shape}: counters [{a}, {a + n}) overlap the shard at {b}"
        assert_value(sum(n for _, n in ranges), math.prod(shape), f"{placements}: counters drawn in all")
        last = ranges[-1]
        assert last[0] + last[1] <= end, (
            f"{placements}: the last shard draws up to {last[0] + last[1]}, past the offset "
            f"{end} every rank moves to afterwards")
        before = int(_PhiloxState(handle.get_rng_state()).offset)
        dtensor.uniform_()
        after = int(_PhiloxState(handle.get_rng_state()).offset)
        assert_value(after - before, end, f"{placements}: device generator offset advance")


# -- every rank's numbers in one process: LocalTensorMode ---------------------------------------
# torch.distributed._local_tensor.LocalTensorMode runs each op once per simulated rank (a
# LocalTensor holds every rank's value) and collectives as the exchange between them, so sharded
# results can be compared with the single-device ones at 16 and 64 ranks.


def _every_rank(value, reference: torch.Tensor, what: str) -> None:
    """``value`` (a LocalTensor: one tensor per simulated rank) equals ``reference`` on every
    rank, within the tolerance of a different reduction order."""
    from torch.distributed._local_tensor import LocalTensor

    assert isinstance(value, LocalTensor), f"{what}: {type(value).__name__}, expected a LocalTensor"
    for rank, local in sorted(value._local_tensors.items()):
        assert_close(local, reference, f"{what} on simulated rank {rank}")


def _local_mesh(ctx, shape: tuple[int, ...]):
    return init_device_mesh(ctx.device_type, shape)


def _inputs(ctx, *shapes):
    return [host_tensor(shape, seed).to(ctx.device) for seed, shape in enumerate(shapes)]


@check(also_at=(64,))
def local_dtensor_numerics(ctx):
    """Under LocalTensorMode on a (world/4, 4) mesh of the device: a sharded matmul, an
    elementwise op, a sum (Partial) and redistributes Shard(0) -> Shard(1) -> Replicate give
    every simulated rank the single-device result (torch.distributed._local_tensor.
    LocalTensorMode, DTensor.redistribute)."""
    from torch.distributed._local_tensor import LocalTensorMode

    a, b = _inputs(ctx, (ctx.world_size * 2, 16), (16, 8))
    with LocalTensorMode(ctx.world_size):
        mesh = _local_mesh(ctx, (ctx.world_size // 4, 4))
        da = distribute_tensor(a, mesh, [Shard(0), Replicate()])
        db = distribute_tensor(b, mesh, [Replicate(), Shard(1)])
        product = (da @ db).relu() * 2
        total = da.sum()
        moved = da.redistribute(mesh, [Shard(1), Replicate()]).redistribute(mesh, [Replicate()] * 2)
        results = {"relu(a @ b) * 2": product.full_tensor(), "a.sum()": total.full_tensor(),
                   "a through Shard(1) to Replicate": moved.to_local()}
    expected = {"relu(a @ b) * 2": (a @ b).relu() * 2, "a.sum()": a.sum(),
                "a through Shard(1) to Replicate": a}
    for what, value in results.items():
        _every_rank(value, expected[what], what)


@check(also_at=(64,))
def local_tp_mlp_numerics(ctx):
    """Under LocalTensorMode: an MLP with Colwise/Rowwise parallel layers on the "tp" dim (4)
    of a (dp, tp) mesh gives every simulated rank the single-device output and weight
    gradients (torch.distributed.tensor.parallel.parallelize_module)."""
    from torch import nn
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).to(ctx.device)
    model = copy.deepcopy(reference)
    (x,) = _inputs(ctx, (4, 16))
    reference(x).sum().backward()
    with LocalTensorMode(ctx.world_size):
        mesh = init_device_mesh(ctx.device_type, (ctx.world_size // 4, 4), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        out = model(x).clone()  # clone: waits for RowwiseParallel's all_reduce
        out.sum().backward()
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    _every_rank(out, reference(x), "TP MLP output")
    for name, p in reference.named_parameters():
        _every_rank(grads[name], p.grad, f"TP MLP {name}.grad")


#: torch 2.13: FSDP2 frees its unsharded parameters with ``storage.resize_(0)``
#: (torch.distributed.fsdp._fully_shard._fsdp_param.free_storage), which a LocalTensor's storage
#: refuses, on any device.
_FSDP2_BLOCKED = "Attempted to call resize_() on an invalid python storage"


@check(also_at=(64,))
def local_fsdp2_numerics(ctx):
    """Under LocalTensorMode: fully_shard over every simulated rank gives the single-device
    gradients (full_tensor of each sharded gradient) on every rank; SKIP where the installed
    torch's FSDP2 cannot free a LocalTensor's storage (torch.distributed.fsdp.fully_shard,
    _fsdp_param.free_storage)."""
    from torch import nn
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).to(ctx.device)
    model = copy.deepcopy(reference)
    (x,) = _inputs(ctx, (4, 16))
    reference(x).sum().backward()
    try:
        with LocalTensorMode(ctx.world_size):
            mesh = _local_mesh(ctx, (ctx.world_size,))
            fully_shard(model, mesh=mesh)
            model(x).sum().backward()
            grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    except RuntimeError as exc:
        if _FSDP2_BLOCKED not in str(exc):
            raise
        ctx.skip(f"unsupported by torch {torch.__version__}: FSDP2 under LocalTensorMode frees "
                 "unsharded parameters with storage.resize_(0) "
                 "(torch.distributed.fsdp._fully_shard._fsdp_param.free_storage), which a "
                 f"LocalTensor's storage refuses on every device ({exc})")
    for name, p in reference.named_parameters():
        _every_rank(grads[name], p.grad, f"FSDP2 {name}.grad")


@check(also_at=(64,), requires=("rng-tracker",))
def local_random_numerics(ctx):
    """Under LocalTensorMode: a random op on a DTensor sharded on dim 0 of a (world/4, 4) mesh
    gives every simulated rank the same full tensor, whose shards all differ; SKIP where the
    installed torch's LocalTensor RNG tracker cannot serve the device: in torch 2.13 it calls
    torch.cuda (torch.distributed._local_tensor._LocalOffsetBasedRNGTracker._device), in 2.14
    and 2.15 its _distribute_region reads the CPU generator's state as the Philox state of any
    device but cuda and xpu."""
    from torch.distributed._local_tensor import LocalTensorMode

    try:
        with LocalTensorMode(ctx.world_size):
            mesh = _local_mesh(ctx, (ctx.world_size // 4, 4))
            dtensor = distribute_tensor(torch.zeros(ctx.world_size, 8, device=ctx.device), mesh,
                                        [Shard(0), Replicate()])
            dtensor.uniform_()
            full = dtensor.full_tensor()
    except AssertionError as exc:
        if "CUDA" not in str(exc):
            raise
        ctx.skip(f"unsupported by torch {torch.__version__}: LocalTensor's RNG tracker "
                 "(torch.distributed._local_tensor._LocalOffsetBasedRNGTracker._device) calls "
                 f"torch.cuda.current_device() whatever the device ({exc})")
    except RuntimeError as exc:
        if "cannot be converted to Scalar" not in str(exc):
            raise
        ctx.skip(f"unsupported by torch {torch.__version__}: LocalTensor's RNG tracker "
                 "(torch.distributed._local_tensor._LocalOffsetBasedRNGTracker"
                 "._distribute_region) takes the CPU generator's state as the Philox state of "
                 f"every device but cuda and xpu ({exc})")
    values = list(full._local_tensors.values())
    for rank, value in enumerate(values[1:], 1):
        assert torch.equal(value.cpu(), values[0].cpu()), f"simulated rank {rank}'s full tensor differs"
    rows = values[0].cpu().reshape(mesh.size(0), -1)
    assert len({tuple(r.tolist()) for r in rows}) == mesh.size(0), "two shards drew the same numbers"
