"""DTensor on the backend's device: placement, redistribution, operators, autograd,
construction, communication counts and serialisation.

Every value is compared with the single-device result computed on this rank from the same
host tensor (bitwise where the math is exact: integer-valued float inputs make sums and
matmuls order-independent; ``assert_close`` with the stated tolerance otherwise).
Sources: torch.distributed.tensor (DTensor API), PR 102468 (DTensor on a cuda-like device),
PR 102336 (DTensor collectives through the dispatchable process group), PR 134247 (the mesh
from the ambient ``with mesh:`` context also serves distribute_tensor / from_local).
"""

from __future__ import annotations

import io

import torch
import torch.distributed as dist
import torch.distributed.tensor as dtensor_api
import torch.nn.functional as F
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import (
    ALSO_AT,
    assert_close,
    assert_equal,
    assert_on_device,
    assert_value,
    expect_raises,
    host_tensor,
    local_chunk,
)
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.distributed.tensor.debug import CommDebugMode

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, any_world_size=True)


def _ints(shape, seed, low=-4, high=5):
    """A host float32 tensor of small integers, identical on every rank."""
    return host_tensor(shape, seed, torch.float32, low=low, high=high)


def _mesh_2d(ctx):
    return ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))


def expected_local(full: torch.Tensor, mesh: DeviceMesh, placements) -> torch.Tensor:
    """The local shard DTensor's default sharding gives this rank: torch.chunk along each
    Shard dim, mesh dim by mesh dim, an empty tensor where chunk runs out."""
    local = full
    coord = mesh.get_coordinate()
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            chunks = torch.chunk(local, mesh.size(mesh_dim), dim=placement.dim)
            index = coord[mesh_dim]
            local = chunks[index] if index < len(chunks) else local.narrow(placement.dim, 0, 0)
    return local


def _check_distributed(ctx, full, mesh, placements, what):
    dt = distribute_tensor(full.to(ctx.device, copy=True), mesh, placements)
    assert isinstance(dt, DTensor), f"{what}: distribute_tensor returned {type(dt).__name__}"
    assert_value(tuple(dt.placements), tuple(placements), f"{what}: placements")
    assert_value(tuple(dt.shape), tuple(full.shape), f"{what}: global shape")
    local = dt.to_local()
    assert_on_device(ctx, local, f"{what}: local tensor")
    assert_equal(local, expected_local(full, mesh, placements), f"{what}: local shard")
    assert_equal(dt.full_tensor(), full, f"{what}: full_tensor()")
    return dt


@check
def distribute_1d(ctx):
    """distribute_tensor on a 1-D mesh with Shard(0), Shard(1) and Replicate, on an even
    (8, 6) and an uneven (7, 5) tensor: each rank holds torch.chunk's piece (empty where chunk
    runs out), on its own device, and full_tensor() is the original (torch.distributed.tensor)."""
    mesh = ctx.mesh((ctx.world_size,))
    for shape in ((8, 6), (7, 5)):
        full = _ints(shape, 1)
        for placement in (Shard(0), Shard(1), Replicate()):
            _check_distributed(ctx, full, mesh, [placement], f"{shape} {placement}")


@check(any_world_size=False)
def distribute_2d(ctx):
    """distribute_tensor on a 2-D (dp, tp) mesh with [Shard(0), Shard(1)], [Replicate(),
    Shard(0)], [Shard(1), Replicate()] and [Shard(0), Shard(0)] (nested), even and uneven;
    local pieces and full_tensor() as on one device (torch.distributed.tensor)."""
    mesh = _mesh_2d(ctx)
    layouts = ([Shard(0), Shard(1)], [Replicate(), Shard(0)], [Shard(1), Replicate()],
               [Shard(0), Shard(0)])
    for shape in ((8, 6), (7, 5)):
        full = _ints(shape, 2)
        for placements in layouts:
            _check_distributed(ctx, full, mesh, placements, f"{shape} {placements}")


@check
def from_local_to_local(ctx):
    """from_local(local, mesh, [Shard(0)]) infers the global shape and stride from even local
    shards; to_local() returns the same values, shape and stride; passing shape/stride builds
    an uneven DTensor whose full_tensor() is right; a transposed (non-contiguous) Replicate
    local tensor keeps its strides through from_local and to_local (DTensor.from_local /
    to_local)."""
    mesh = ctx.mesh((ctx.world_size,))
    full = _ints((4 * ctx.world_size, 3), 3)
    local = torch.chunk(full, ctx.world_size)[ctx.rank].to(ctx.device, copy=True)
    dt = DTensor.from_local(local, mesh, [Shard(0)])
    assert dt.shape == full.shape and dt.stride() == full.stride(), (
        f"from_local global shape/stride {tuple(dt.shape)}/{dt.stride()}, "
        f"expected {tuple(full.shape)}/{full.stride()}")
    back = dt.to_local()
    assert back.shape == local.shape and back.stride() == local.stride()
    assert_equal(back, local, "to_local() after from_local()")
    assert_equal(dt.full_tensor(), full, "full_tensor() of from_local(Shard(0))")
    uneven = _ints((7, 3), 4)
    piece = expected_local(uneven, mesh, [Shard(0)]).to(ctx.device, copy=True)
    dt = DTensor.from_local(piece, mesh, [Shard(0)], shape=uneven.shape, stride=uneven.stride())
    assert_value(dt.shape, uneven.shape, "dt.shape")
    assert_equal(dt.full_tensor(), uneven, "full_tensor() of an uneven from_local")
    transposed = _ints((3, 4), 5).to(ctx.device, copy=True).t()
    dt = DTensor.from_local(transposed, mesh, [Replicate()])
    assert_value(dt.stride(), transposed.stride(), "stride")
    assert_value(dt.to_local().stride(), transposed.stride(), "dt.to_local().stride()")


_TRANSITIONS_1D = (
    ([Shard(0)], [Replicate()]),
    ([Replicate()], [Shard(0)]),
    ([Shard(0)], [Shard(1)]),
    ([Shard(1)], [Shard(0)]),
    ([Replicate()], [Shard(1)]),
)

_TRANSITIONS_2D = (
    ([Shard(0), Shard(1)], [Replicate(), Replicate()]),
    ([Replicate(), Shard(0)], [Shard(1), Replicate()]),
    ([Shard(0), Shard(0)], [Replicate(), Shard(1)]),
    ([Shard(1), Replicate()], [Shard(0), Shard(1)]),
    ([Replicate(), Replicate()], [Shard(0), Shard(0)]),
)


def _check_transitions(ctx, mesh, transitions, shapes):
    for shape in shapes:
        full = _ints(shape, 6)
        for src, dst in transitions:
            dt = distribute_tensor(full.to(ctx.device, copy=True), mesh, src)
            out = dt.redistribute(mesh, dst)
            what = f"{shape} {src} -> {dst}"
            assert_value(tuple(out.placements), tuple(dst), f"{what}: placements")
            assert_on_device(ctx, out.to_local(), what)
            assert_equal(out.to_local(), expected_local(full, mesh, dst), f"{what}: local shard")
            assert_equal(out.full_tensor(), full, f"{what}: full_tensor()")


@check
def redistribute_1d(ctx):
    """redistribute on a 1-D mesh: S(0)->R, R->S(0), S(0)->S(1), S(1)->S(0), R->S(1), on even
    and uneven tensors; each result holds the expected shard (DTensor.redistribute)."""
    _check_transitions(ctx, ctx.mesh((ctx.world_size,)), _TRANSITIONS_1D, ((8, 8), (7, 5)))


@check(any_world_size=False)
def redistribute_2d(ctx):
    """redistribute on a 2-D (dp, tp) mesh between mixed layouts ([S(0),S(1)]->[R,R],
    [R,S(0)]->[S(1),R], [S(0),S(0)]->[R,S(1)], [S(1),R]->[S(0),S(1)], [R,R]->[S(0),S(0)]),
    even and uneven (DTensor.redistribute)."""
    _check_transitions(ctx, _mesh_2d(ctx), _TRANSITIONS_2D, ((8, 8), (6, 5)))


#: A shape past the mock transport's 512 KiB rounds and a 1 MiB protocol switch (1.18 MiB of
#: float32), whose 1031 rows split unevenly over 2, 4 and 8 ranks.
LARGE_UNEVEN = (1031, 300)


@check
def large_redistribute(ctx):
    """redistribute of a (1031, 300) float32 DTensor (1.2 MiB; its rows split unevenly over the
    ranks): S(0)->R, R->S(0), S(0)->S(1), S(1)->S(0) each hold the expected shard and the
    whole tensor (DTensor.redistribute)."""
    _check_transitions(ctx, ctx.mesh((ctx.world_size,)), _TRANSITIONS_1D[:4], (LARGE_UNEVEN,))


@check
def large_partial(ctx):
    """A Partial("sum") DTensor of (1031, 300) float32 (1.2 MiB; rows split unevenly) reduces
    exactly: P->R (one all_reduce of 1.2 MiB) gives the sum of every rank's local tensor, P->S(0)
    (reduce_scatter into uneven shards) the matching rows of it, Partial("avg") the mean
    (torch.distributed.tensor.Partial)."""
    mesh = ctx.mesh((ctx.world_size,))
    mine = _ints(LARGE_UNEVEN, 40 + ctx.rank)
    total = torch.stack([_ints(LARGE_UNEVEN, 40 + r) for r in range(ctx.world_size)]).sum(0)
    summed = DTensor.from_local(mine.to(ctx.device, copy=True), mesh, [Partial("sum")])
    assert_equal(summed.redistribute(mesh, [Replicate()]).to_local(), total,
                 "Partial(sum) -> Replicate of (1031, 300)")
    assert_equal(summed.redistribute(mesh, [Shard(0)]).to_local(),
                 expected_local(total, mesh, [Shard(0)]), "Partial(sum) -> Shard(0) of (1031, 300)")
    avg = DTensor.from_local(mine.to(ctx.device, copy=True), mesh, [Partial("avg")])
    assert_equal(avg.full_tensor(), total / ctx.world_size, "Partial(avg) of (1031, 300)")


@check
def partial(ctx):
    """A Partial("sum") DTensor made with from_local reduces to the sum of every rank's local
    tensor (P->R via full_tensor and redistribute, P->S(0) keeps the matching chunk of the sum);
    Partial("avg") reduces to the mean; a user redistribute from Replicate to Partial is refused
    ("for internal use only") (torch.distributed.tensor.Partial)."""
    mesh = ctx.mesh((ctx.world_size,))
    locals_ = [_ints((8, 4), 10 + r) for r in range(ctx.world_size)]
    total = torch.stack(locals_).sum(0)
    summed = DTensor.from_local(locals_[ctx.rank].to(ctx.device, copy=True), mesh, [Partial("sum")])
    assert_equal(summed.full_tensor(), total, "Partial(sum).full_tensor()")
    assert_equal(summed.redistribute(mesh, [Replicate()]).to_local(), total, "Partial(sum) -> Replicate")
    scattered = summed.redistribute(mesh, [Shard(0)])
    assert_equal(scattered.to_local(), local_chunk(total, ctx.rank, ctx.world_size), "Partial(sum) -> Shard(0)")
    avg = DTensor.from_local(locals_[ctx.rank].to(ctx.device, copy=True), mesh, [Partial("avg")])
    assert_equal(avg.full_tensor(), total / ctx.world_size, "Partial(avg).full_tensor()")
    rep = distribute_tensor(total.to(ctx.device, copy=True), mesh, [Replicate()])
    with expect_raises(RuntimeError, what="redistribute(Replicate -> Partial)") as raised:
        rep.redistribute(mesh, [Partial()])
    assert "Partial" in raised.message or "P(sum)" in raised.message, raised.message


@check
def elementwise(ctx):
    """Element-wise ops on DTensors (add/mul/sub of Shard(0) and Replicate operands, a scalar,
    relu, abs, where, pow, in-place add_) keep the shard layout and equal the single-device
    result bitwise (torch.distributed.tensor op dispatch)."""
    mesh = ctx.mesh((ctx.world_size,))
    a, b = _ints((8, 6), 20), _ints((8, 6), 21)
    da = distribute_tensor(a.to(ctx.device, copy=True), mesh, [Shard(0)])
    db = distribute_tensor(b.to(ctx.device, copy=True), mesh, [Shard(0)])
    rb = distribute_tensor(b.to(ctx.device, copy=True), mesh, [Replicate()])
    cases = {
        "a + b": (da + db, a + b),
        "a * b": (da * db, a * b),
        "a - b(replicate)": (da - rb, a - b),
        "2.5 * a + 1": (2.5 * da + 1, 2.5 * a + 1),
        "relu(a)": (torch.relu(da), torch.relu(a)),
        "abs(a)": (da.abs(), a.abs()),
        "where(a > 0, a, b)": (torch.where(da > 0, da, db), torch.where(a > 0, a, b)),
        "a ** 2": (da ** 2, a ** 2),
    }
    for what, (got, expected) in cases.items():
        assert isinstance(got, DTensor), f"{what} is a {type(got).__name__}"
        assert_on_device(ctx, got.to_local(), what)
        assert_equal(got.full_tensor(), expected, what)
    assert_value(da.add(db).placements, (Shard(0),), "da.add(db).placements")
    da.add_(db)
    assert_equal(da.full_tensor(), a + b, "in-place add_")


@check(also_at=(2,), any_world_size=False)
def matmul(ctx):
    """mm, matmul and bmm for the sharding combinations DTensor supports: S(0)@R -> S(0),
    R@S(1) -> S(1), S(1)@S(0) -> Partial, R@R -> R, S(0)@S(1), batched S(0)@S(0) bmm and a 3-D
    @ 2-D matmul; integer-valued inputs make the results bitwise equal to one device
    (torch.distributed.tensor matrix ops)."""
    mesh = ctx.mesh((ctx.world_size,))
    a, b = _ints((8, 12), 30), _ints((12, 8), 31)
    dev = ctx.device

    def d(t, p):
        return distribute_tensor(t.to(dev, copy=True), mesh, [p])

    combos = (
        (Shard(0), Replicate(), Shard(0)),
        (Replicate(), Shard(1), Shard(1)),
        (Shard(1), Shard(0), Partial()),
        (Replicate(), Replicate(), Replicate()),
        (Shard(0), Shard(1), None),
    )
    for pa, pb, out_placement in combos:
        for op in (torch.mm, torch.matmul):
            got = op(d(a, pa), d(b, pb))
            what = f"{op.__name__}({pa}, {pb})"
            if out_placement is not None:
                assert_value(got.placements, (out_placement,), f"{what}: placements")
            assert_equal(got.full_tensor(), a @ b, what)
    x, y = _ints((4, 6, 5), 32), _ints((4, 5, 3), 33)
    got = torch.bmm(d(x, Shard(0)), d(y, Shard(0)))
    assert_value(got.placements, (Shard(0),), "bmm(S(0), S(0)) placements")
    assert_equal(got.full_tensor(), torch.bmm(x, y), "bmm(S(0), S(0))")
    got = torch.matmul(d(x, Shard(1)), d(_ints((5, 4), 34), Replicate()))
    assert_equal(got.full_tensor(), torch.matmul(x, _ints((5, 4), 34)), "matmul(3-D S(1), 2-D R)")


@check(any_world_size=False)
def reductions(ctx):
    """sum, mean, amax/max and amin with and without dim, over the sharded and the unsharded
    dim of Shard(0)/Shard(1) DTensors and a 2-D [Shard(0), Shard(1)] one, equal one device
    (exact sums of integers; mean divides by a power of two) (torch.distributed.tensor)."""
    full = _ints((8, 8), 40)
    meshes = ((ctx.mesh((ctx.world_size,)), ([Shard(0)], [Shard(1)])),
              (_mesh_2d(ctx), ([Shard(0), Shard(1)],)))
    for mesh, layouts in meshes:
        for placements in layouts:
            dt = distribute_tensor(full.to(ctx.device, copy=True), mesh, placements)
            cases = {
                "sum()": (dt.sum(), full.sum()),
                "sum(0)": (dt.sum(0), full.sum(0)),
                "sum(1, keepdim)": (dt.sum(1, keepdim=True), full.sum(1, keepdim=True)),
                "mean()": (dt.mean(), full.mean()),
                "mean(0)": (dt.mean(0), full.mean(0)),
                "amax(1)": (dt.amax(1), full.amax(1)),
                "max()": (dt.max(), full.max()),
                "amin(0)": (dt.amin(0), full.amin(0)),
            }
            for what, (got, expected) in cases.items():
                assert_equal(got.full_tensor(), expected, f"{placements} {what}")


@check(any_world_size=False)
def view_ops(ctx):
    """view, reshape, transpose/t, permute, flatten and unsqueeze on a Shard(0) DTensor give the
    single-device values, with the shard dim following the view (Shard(0) -> t() is Shard(1))
    (torch.distributed.tensor view ops)."""
    mesh = ctx.mesh((ctx.world_size,))
    full = _ints((8, 6), 50)
    dt = distribute_tensor(full.to(ctx.device, copy=True), mesh, [Shard(0)])
    cases = {
        "view(8, 2, 3)": (dt.view(8, 2, 3), full.view(8, 2, 3), Shard(0)),
        "reshape(48)": (dt.reshape(48), full.reshape(48), Shard(0)),
        "t()": (dt.t(), full.t(), Shard(1)),
        "transpose(0, 1)": (dt.transpose(0, 1), full.transpose(0, 1), Shard(1)),
        "unsqueeze(0)": (dt.unsqueeze(0), full.unsqueeze(0), Shard(1)),
        "flatten()": (dt.flatten(), full.flatten(), Shard(0)),
        "view(8, 2, 3).permute(2, 0, 1)": (dt.view(8, 2, 3).permute(2, 0, 1),
                                           full.view(8, 2, 3).permute(2, 0, 1), Shard(1)),
    }
    for what, (got, expected, placement) in cases.items():
        assert_value(got.placements, (placement,), f"{what}: placements")
        assert_equal(got.full_tensor(), expected, what)


@check
def softmax(ctx):
    """softmax and log_softmax over the unsharded dim keep Shard(0); over the sharded dim the
    result is still right (values within 1e-6 of one device) (torch.distributed.tensor)."""
    mesh = ctx.mesh((ctx.world_size,))
    full = host_tensor((8, 6), 60)
    dt = distribute_tensor(full.to(ctx.device, copy=True), mesh, [Shard(0)])
    got = torch.softmax(dt, dim=1)
    assert_value(got.placements, (Shard(0),), "softmax(dim=1) placements")
    assert_close(got.full_tensor(), torch.softmax(full, 1), "softmax(dim=1)", atol=1e-6)
    assert_close(torch.log_softmax(dt, 1).full_tensor(), torch.log_softmax(full, 1), "log_softmax",
                 atol=1e-6)
    assert_close(torch.softmax(dt, dim=0).full_tensor(), torch.softmax(full, 0), "softmax(dim=0)",
                 atol=1e-6)


@check
def layer_norm(ctx):
    """layer_norm over the last dim of a Shard(0) input with replicated weight and bias keeps
    Shard(0) and matches one device within 1e-5, forward and the weight's gradient
    (torch.distributed.tensor)."""
    mesh = ctx.mesh((ctx.world_size,))
    rows = max(8, 2 * ctx.world_size)  # every rank a block of rows: torch keeps Shard(0) then
    x, w, b = host_tensor((rows, 16), 70), host_tensor((16,), 71), host_tensor((16,), 72)
    dx = distribute_tensor(x.to(ctx.device, copy=True), mesh, [Shard(0)])
    dw = distribute_tensor(w.to(ctx.device, copy=True), mesh, [Replicate()]).requires_grad_()
    db = distribute_tensor(b.to(ctx.device, copy=True), mesh, [Replicate()])
    out = F.layer_norm(dx, (16,), dw, db)
    assert_value(out.placements, (Shard(0),), "layer_norm placements")
    ref_w = w.clone().requires_grad_()
    ref = F.layer_norm(x, (16,), ref_w, b)
    assert_close(out.full_tensor(), ref, "layer_norm", atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    assert_close(dw.grad.full_tensor(), ref_w.grad, "layer_norm weight grad", atol=1e-5)


@check(also_at=(2,), any_world_size=False)
def embedding(ctx):
    """Embedding lookups with a replicated index tensor: a row-wise Shard(0) table (vocab
    parallel: masked partial sums) and a column-wise Shard(1) table both equal one device
    bitwise (torch.distributed.tensor embedding strategies)."""
    mesh = ctx.mesh((ctx.world_size,))
    table = _ints((10, 8), 80)
    idx = torch.tensor([[1, 9, 3], [0, 5, 7]])
    didx = distribute_tensor(idx.to(ctx.device, copy=True), mesh, [Replicate()])
    for placement in (Shard(0), Shard(1)):
        dtable = distribute_tensor(table.to(ctx.device, copy=True), mesh, [placement])
        got = F.embedding(didx, dtable)
        assert_equal(got.full_tensor(), F.embedding(idx, table), f"embedding with a {placement} table")


@check
def autograd(ctx):
    """Backward through DTensor ops: y = x @ w with x Shard(0) and w Replicate, upstream grad
    Shard(0): x.grad is Shard(0), w.grad is Partial(sum), and both equal the single-device
    gradients; a scalar loss gives the same values (torch.distributed.tensor autograd)."""
    mesh = ctx.mesh((ctx.world_size,))
    rows = max(8, 2 * ctx.world_size)  # every rank a block of rows: torch keeps Shard(0) then
    x, w, g = _ints((rows, 4), 90), _ints((4, 6), 91), _ints((rows, 6), 92)
    dx = distribute_tensor(x.to(ctx.device, copy=True), mesh, [Shard(0)]).requires_grad_()
    dw = distribute_tensor(w.to(ctx.device, copy=True), mesh, [Replicate()]).requires_grad_()
    dg = distribute_tensor(g.to(ctx.device, copy=True), mesh, [Shard(0)])
    (dx @ dw).backward(dg)
    assert_value(dx.grad.placements, (Shard(0),), "x.grad placements")
    assert_value(dw.grad.placements, (Partial("sum"),), "w.grad placements")
    assert_equal(dx.grad.full_tensor(), g @ w.t(), "x.grad")
    assert_equal(dw.grad.full_tensor(), x.t() @ g, "w.grad")
    dx.grad = dw.grad = None
    torch.relu(dx @ dw).sum().backward()
    rx, rw = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.relu(rx @ rw).sum().backward()
    assert_equal(dx.grad.full_tensor(), rx.grad, "x.grad (scalar loss)")
    assert_equal(dw.grad.full_tensor(), rw.grad, "w.grad (scalar loss)")


def _check_factory(ctx, mesh, name, dt, expected, placement, size):
    what = f"{name}({placement})"
    assert dt.shape == size and dt.dtype == torch.float32, f"{what}: {tuple(dt.shape)} {dt.dtype}"
    assert_value(dt.placements, (placement,), f"{what}: placements")
    local = dt.to_local()
    assert_on_device(ctx, local, what)
    assert local.shape == expected_local(torch.empty(size), mesh, [placement]).shape, (
        f"{what}: local shape {tuple(local.shape)}")
    if expected is not None:
        assert_equal(dt.full_tensor(), expected, what)


@check(any_world_size=False)
def redistribute_autograd(ctx):
    """redistribute is differentiable: the gradient of S(0)->R flows back as Shard(0) with the
    single-device values, that of S(0)->S(1) as Shard(0), and to_local/from_local pass
    gradients through (DTensor.redistribute / to_local / from_local autograd)."""
    mesh = ctx.mesh((ctx.world_size,))
    full, g = _ints((8, 8), 95), _ints((8, 8), 96)
    for dst in ([Replicate()], [Shard(1)]):
        x = distribute_tensor(full.to(ctx.device, copy=True), mesh, [Shard(0)]).requires_grad_()
        y = x.redistribute(mesh, dst)
        (y * distribute_tensor(g.to(ctx.device, copy=True), mesh, dst)).sum().backward()
        assert_value(x.grad.placements, (Shard(0),), f"S(0)->{dst}: grad placements")
        assert_equal(x.grad.full_tensor(), g, f"S(0)->{dst}: gradient")
    local = torch.chunk(full, ctx.world_size)[ctx.rank].to(ctx.device, copy=True).requires_grad_()
    dt = DTensor.from_local(local, mesh, [Shard(0)])
    (dt.redistribute(mesh, [Replicate()]).to_local() * g.to(ctx.device, copy=True)).sum().backward()
    assert_equal(local.grad, torch.chunk(g, ctx.world_size)[ctx.rank], "gradient through from_local")


@check
def factory(ctx):
    """DTensor factories on a mesh (zeros, ones, full, empty) with Shard(0) on an uneven size
    and Replicate: global and local shapes, dtype, the rank's own device, and the values
    (torch.distributed.tensor.zeros/ones/full/empty)."""
    from torch.distributed import tensor as dtensor_api

    mesh = ctx.mesh((ctx.world_size,))
    size = (7, 4)
    for placement in (Shard(0), Replicate()):
        kw = {"device_mesh": mesh, "placements": [placement]}
        for name, dt, expected in (
            ("zeros", dtensor_api.zeros(size, **kw), torch.zeros(size)),
            ("ones", dtensor_api.ones(size, **kw), torch.ones(size)),
            ("full", dtensor_api.full(size, 2.5, **kw), torch.full(size, 2.5)),
            ("empty", dtensor_api.empty(size, **kw), None),
        ):
            _check_factory(ctx, mesh, name, dt, expected, placement, size)


@check(requires=("rng-tracker",))
def factory_random(ctx):
    """The random DTensor factories rand and randn (which run inside the RNG tracker) give the
    right global/local shapes on the rank's device; rand lies in [0, 1) and a Replicate randn is
    the same on every rank (torch.distributed.tensor.rand/randn, PR 103235)."""
    from torch.distributed import tensor as dtensor_api

    mesh = ctx.mesh((ctx.world_size,))
    size = (7, 4)
    for placement in (Shard(0), Replicate()):
        kw = {"device_mesh": mesh, "placements": [placement]}
        rand = dtensor_api.rand(size, **kw)
        randn = dtensor_api.randn(size, **kw)
        _check_factory(ctx, mesh, "rand", rand, None, placement, size)
        _check_factory(ctx, mesh, "randn", randn, None, placement, size)
        values = rand.full_tensor()
        assert bool(((values >= 0) & (values < 1)).all()), f"rand({placement}) outside [0, 1)"
    replica = randn.to_local().cpu()
    every = [torch.empty_like(replica) for _ in range(ctx.world_size)]
    dist.all_gather_object(every, replica)
    for r, other in enumerate(every):
        assert_equal(other, replica, f"Replicate randn on rank {r} vs rank {ctx.rank}")


@check
def local_device_index(ctx):
    """Every DTensor local tensor lives on this rank's own device index (``<type>:<local_rank>``),
    whether made by distribute_tensor, from_local of a host tensor, redistribute or an op
    (torch.distributed.tensor, PR 102468: DTensor on a cuda-like device)."""
    mesh = ctx.mesh((ctx.world_size,))
    full = _ints((8, 4), 100)
    dt = distribute_tensor(full.to(ctx.device, copy=True), mesh, [Shard(0)])
    made = {
        "distribute_tensor": dt,
        "from_local(host tensor)": DTensor.from_local(torch.ones(2, 4), mesh, [Shard(0)]),
        "redistribute": dt.redistribute(mesh, [Replicate()]),
        "op result": dt * 2,
    }
    for what, value in made.items():
        assert_on_device(ctx, value.to_local(), what)


@check
def distribute_module(ctx):
    """distribute_module with a partition_fn (Linear weight Shard(0), bias Shard(0)), an
    input_fn (input to a Replicate DTensor) and an output_fn (result to a local full tensor):
    the module's parameters become DTensors on the device and its output equals the
    single-device Linear bitwise (torch.distributed.tensor.distribute_module)."""
    mesh = ctx.mesh((ctx.world_size,))
    torch.manual_seed(0)
    ref = nn.Linear(6, 8)
    with torch.no_grad():
        ref.weight.copy_(_ints((8, 6), 110))
        ref.bias.copy_(_ints((8,), 111))
    module = nn.Linear(6, 8).to(ctx.device)
    module.load_state_dict(ref.state_dict())

    def partition_fn(name, submodule, device_mesh):
        for pname, param in list(submodule.named_parameters(recurse=False)):
            sharded = nn.Parameter(distribute_tensor(param, device_mesh, [Shard(0)]))
            submodule.register_parameter(pname, sharded)

    def input_fn(submodule, inputs, device_mesh):
        return tuple(DTensor.from_local(t, device_mesh, [Replicate()]) for t in inputs)

    def output_fn(submodule, output, device_mesh):
        return output.full_tensor()

    dtensor_api.distribute_module(module, mesh, partition_fn, input_fn, output_fn)
    assert isinstance(module.weight, DTensor) and module.weight.placements == (Shard(0),)
    assert_on_device(ctx, module.weight.to_local(), "distributed weight")
    x = _ints((5, 6), 112)
    out = module(x.to(ctx.device, copy=True))
    assert not isinstance(out, DTensor), "output_fn's plain tensor was not returned"
    assert_equal(out, ref(x).detach(), "distributed Linear output")


@check(any_world_size=False)
def ambient_mesh(ctx):
    """Under ``with mesh:`` distribute_tensor, DTensor.from_local and the factories take that
    mesh when none is passed, and redistribute inside another mesh's context keeps the tensor's
    own mesh (PR 134247's ambient mesh; torch.distributed.tensor)."""
    from torch.distributed import tensor as dtensor_api

    mesh = ctx.mesh((ctx.world_size,))
    other = _mesh_2d(ctx)
    full = _ints((8, 4), 120)
    with mesh:
        dt = distribute_tensor(full.to(ctx.device, copy=True), placements=[Shard(0)])
        fl = DTensor.from_local(torch.chunk(full, ctx.world_size)[ctx.rank].to(ctx.device, copy=True),
                                placements=[Shard(0)])
        ones = dtensor_api.ones((8, 4), placements=[Shard(0)])
    for what, value in (("distribute_tensor", dt), ("from_local", fl), ("ones", ones)):
        assert value.device_mesh == mesh, f"{what} under `with mesh:` used {value.device_mesh}"
    assert_equal(fl.full_tensor(), full, "from_local under `with mesh:`")
    with other:
        moved = dt.redistribute(placements=[Replicate()])
    assert moved.device_mesh == mesh, "redistribute took the ambient mesh instead of the tensor's"
    assert_equal(moved.to_local(), full, "redistribute under another mesh's context")


def _counts(comm_mode) -> dict[str, int]:
    return {str(op).split(".")[-1]: n for op, n in comm_mode.get_comm_counts().items() if n}


@check
def comm_counts(ctx):
    """CommDebugMode sees exactly the collectives DTensor promises: S->R one all_gather,
    P->R one all_reduce, P->S one reduce_scatter, R->S none; distribute_tensor(Shard(0)) one
    scatter and none with src_data_rank=None (torch.distributed.tensor.debug.CommDebugMode)."""
    mesh = ctx.mesh((ctx.world_size,))
    full = _ints((8, 4), 130)
    local = full.to(ctx.device, copy=True)
    shard = distribute_tensor(local, mesh, [Shard(0)])
    part = DTensor.from_local(local, mesh, [Partial()])
    rep = distribute_tensor(local, mesh, [Replicate()])
    cases = (
        ("S(0)->R", lambda: shard.redistribute(mesh, [Replicate()]), {"all_gather_into_tensor": 1}),
        ("P->R", lambda: part.redistribute(mesh, [Replicate()]), {"all_reduce": 1}),
        ("P->S(0)", lambda: part.redistribute(mesh, [Shard(0)]), {"reduce_scatter_tensor": 1}),
        ("R->S(0)", lambda: rep.redistribute(mesh, [Shard(0)]), {}),
        ("distribute_tensor(S(0))", lambda: distribute_tensor(local, mesh, [Shard(0)]), {"scatter_": 1}),
        ("distribute_tensor(S(0), src_data_rank=None)",
         lambda: distribute_tensor(local, mesh, [Shard(0)], src_data_rank=None), {}),
    )
    for what, fn, expected in cases:
        with CommDebugMode() as comm_mode:
            result = fn()
            if isinstance(result.to_local(), torch.Tensor):
                result.to_local().sum()  # force any pending async collective
        got = _counts(comm_mode)
        assert got == expected, f"{what}: CommDebugMode counted {got}, expected {expected}"


@check
def from_local_run_check(ctx):
    """from_local(..., run_check=True) raises ValueError ("Inconsistent tensor metadata") when
    one rank's local shape or dtype differs, and with Replicate it broadcasts rank 0's data so
    every rank holds the same replica (DTensor.from_local)."""
    mesh = ctx.mesh((ctx.world_size,))
    shape = (3, 4) if ctx.rank != ctx.world_size - 1 else (2, 4)
    for what, local in (("shape", torch.ones(shape, device=ctx.device)),
                        ("dtype", torch.ones((3, 4), device=ctx.device,
                                             dtype=torch.float64 if ctx.rank == 1 else torch.float32))):
        with expect_raises(ValueError, "Inconsistent tensor metadata",
                           what=f"from_local(run_check=True) with a cross-rank {what} mismatch"):
            DTensor.from_local(local, mesh, [Shard(0)], run_check=True)
    mine = torch.full((2, 3), float(ctx.rank), device=ctx.device)
    rep = DTensor.from_local(mine, mesh, [Replicate()], run_check=True)
    assert_equal(rep.to_local(), torch.zeros(2, 3), "Replicate from_local(run_check=True) (rank 0's data)")


@check
def submesh_non_members(ctx):
    """A DTensor on a mesh of the first half of the ranks: members hold their shard and see the
    full tensor; the other ranks hold an empty local tensor and have no coordinate
    (torch.distributed.tensor sub-mesh semantics)."""
    half = ctx.world_size // 2
    sub = DeviceMesh(ctx.device_type, list(range(half)))
    full = _ints((8, 4), 140)
    dt = distribute_tensor(full.to(ctx.device, copy=True), sub, [Shard(0)])
    local = dt.to_local()
    if ctx.rank < half:
        assert_value(sub.get_coordinate(), (ctx.rank,), "sub.get_coordinate()")
        assert_equal(local, torch.chunk(full, half)[ctx.rank], "member's shard")
        assert_equal(dt.full_tensor(), full, "member's full_tensor()")
    else:
        assert sub.get_coordinate() is None, f"non-member coordinate {sub.get_coordinate()}"
        assert_value(tuple(local.shape), (0,), "a non-member's local tensor shape")
        assert dt.shape == full.shape, "non-member DTensor lost the global shape"


@check(any_world_size=False)
def meta_to_empty(ctx):
    """A module built on the meta device and distributed there holds meta DTensors; to_empty
    onto the rank's device materialises local shards of the right shape on that device, and
    loading values then gives the single-device output (DTensor on meta, torch.nn.Module.to_empty)."""
    mesh = ctx.mesh((ctx.world_size,))
    with torch.device("meta"):
        module = nn.Linear(6, 8, bias=False)

    def partition_fn(name, submodule, device_mesh):
        for pname, param in list(submodule.named_parameters(recurse=False)):
            submodule.register_parameter(pname, nn.Parameter(distribute_tensor(param, device_mesh, [Shard(0)])))

    dtensor_api.distribute_module(module, mesh, partition_fn)
    assert module.weight.is_meta and isinstance(module.weight, DTensor)
    module.to_empty(device=ctx.device)
    local = module.weight.to_local()
    assert_on_device(ctx, local, "materialised weight shard")
    assert_value(tuple(local.shape), (8 // ctx.world_size, 6), "shard shape")
    weight = _ints((8, 6), 150)
    with torch.no_grad():
        module.weight.copy_(distribute_tensor(weight.to(ctx.device, copy=True), mesh, [Shard(0)]))
    x = _ints((3, 6), 151)
    out = module(DTensor.from_local(x.to(ctx.device, copy=True), mesh, [Replicate()]))
    assert_equal(out.full_tensor(), x @ weight.t(), "output after to_empty + load")


@check
def save_load(ctx):
    """torch.save of a Shard(0) DTensor and torch.load(weights_only=True) give back a DTensor
    with the same placements, an equal mesh, the same local shard on the device and the same
    full tensor (DTensor serialisation)."""
    mesh = ctx.mesh((ctx.world_size,))
    full = _ints((8, 4), 160)
    dt = distribute_tensor(full.to(ctx.device, copy=True), mesh, [Shard(0)])
    buf = io.BytesIO()
    torch.save(dt, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert isinstance(loaded, DTensor), f"loaded a {type(loaded).__name__}"
    assert loaded.placements == dt.placements and loaded.device_mesh == mesh
    assert_on_device(ctx, loaded.to_local(), "loaded local shard")
    assert_equal(loaded.to_local(), dt.to_local(), "loaded local shard")
    assert_equal(loaded.full_tensor(), full, "loaded full_tensor()")
    dist.barrier()
