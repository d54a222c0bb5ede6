"""Tensor parallelism with ``parallelize_module`` on the backend's device, and PR 134247: the
mesh may come from the ambient ``with mesh:`` context, ``parallelize_plan=None`` warns and
leaves the module alone, and a model may call ``parallelize_module`` inside its own
``__init__`` (the PR's FeedForward example).

Every TP module is compared with the same single-device module built from the same weights on
this rank; float results use ``assert_close`` (sharded matmuls sum in another order: rtol 1e-5,
atol 1e-5 unless stated).
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
import torch.nn.functional as F
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import (
    ALSO_AT,
    all_ranks_object,
    assert_close,
    assert_equal,
    assert_value,
    expect_raises,
    host_tensor,
)
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, _random, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, any_world_size=True)

DIM, HIDDEN = 16, 32


def _seeded(module: nn.Module, seed: int) -> nn.Module:
    """Give every parameter of ``module`` values from ``seed``, identical on every rank."""
    with torch.no_grad():
        for i, param in enumerate(module.parameters()):
            param.copy_(host_tensor(param.shape, seed * 100 + i) * 0.3)
    return module


def _full(t) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _assert_grads(tp_model, ref_model, what, **tol):
    for (name, p), (_, ref) in zip(tp_model.named_parameters(), ref_model.named_parameters(), strict=True):
        assert p.grad is not None, f"{what}: {name} has no gradient"
        assert_close(_full(p.grad), ref.grad, f"{what}: grad of {name}", **tol)


def _assert_params(tp_model, ref_model, what, **tol):
    for (name, p), (_, ref) in zip(tp_model.named_parameters(), ref_model.named_parameters(), strict=True):
        assert_close(_full(p.detach()), ref.detach(), f"{what}: {name}", **tol)


def _assert_matches_reference(ctx, model, ref, x, what, loss, **tol):
    """``model`` (parallelized, on the device) and ``ref`` (single-device) agree on input ``x``
    (host) in the forward output, the input's gradient and every parameter's gradient of
    ``loss(output)``."""
    xd = x.to(ctx.device, copy=True).requires_grad_()
    xr = x.clone().requires_grad_()
    out, expected = model(xd), ref(xr)
    assert_close(out, expected, f"{what} forward", **tol)
    loss(out).backward()
    loss(expected).backward()
    assert_close(xd.grad, xr.grad, f"{what} input gradient", **tol)
    _assert_grads(model, ref, what, **tol)


def _pair(ctx, factory, seed):
    """(single-device reference on the host, a copy on the rank's device)."""
    ref = _seeded(factory(), seed)
    return ref, copy.deepcopy(ref).to(ctx.device)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


MLP_PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}


@check
def colwise(ctx):
    """ColwiseParallel shards a Linear's weight and bias on dim 0; with a replicated input the
    local output is this rank's column block of the single-device output, and backward gives
    each rank its block of the weight gradient (torch.distributed.tensor.parallel)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, lin = _pair(ctx, lambda: nn.Linear(DIM, HIDDEN), 1)
    parallelize_module(lin, mesh, ColwiseParallel())
    assert lin.weight.placements == (Shard(0),) and lin.bias.placements == (Shard(0),)
    x = host_tensor((4, DIM), 2)
    out = lin(x.to(ctx.device, copy=True))
    expected = ref(x)
    assert not isinstance(out, DTensor), "ColwiseParallel returned a DTensor with use_local_output=True"
    assert_close(out, expected.chunk(ctx.world_size, -1)[ctx.rank], "colwise local output")
    out.sum().backward()
    expected.sum().backward()
    _assert_grads(lin, ref, "colwise")


@check(any_world_size=False)
def rowwise(ctx):
    """RowwiseParallel shards the weight on dim 1 and replicates the bias; fed this rank's
    slice of the input's last dim it returns the full single-device output on every rank
    (an all_reduce), and gradients match (torch.distributed.tensor.parallel)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, lin = _pair(ctx, lambda: nn.Linear(HIDDEN, DIM), 3)
    parallelize_module(lin, mesh, RowwiseParallel())
    assert lin.weight.placements == (Shard(1),) and lin.bias.placements == (Replicate(),)
    x = host_tensor((4, HIDDEN), 4)
    out = lin(x.chunk(ctx.world_size, -1)[ctx.rank].to(ctx.device, copy=True))
    expected = ref(x)
    assert_close(out, expected, "rowwise output")
    out.sum().backward()
    expected.sum().backward()
    _assert_grads(lin, ref, "rowwise")


@check(any_world_size=False)
def mlp(ctx):
    """A Colwise -> Rowwise MLP (dict plan) matches the single-device MLP in forward, in the
    input's gradient and in every parameter's gradient (torch.distributed.tensor.parallel)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, model = _pair(ctx, MLP, 5)
    parallelize_module(model, mesh, MLP_PLAN)
    _assert_matches_reference(ctx, model, ref, host_tensor((4, 3, DIM), 6), "MLP",
                              lambda y: y.pow(2).sum())


class WideMLP(nn.Module):
    """520 -> 1040 -> 520: activations of (520, 520) float32 are 1.03 MiB (past the mock
    transport's 512 KiB rounds and a 1 MiB switch). (An uneven hidden size is refused by torch
    2.13's rowwise layer itself; dtensor.large_redistribute covers uneven shards.)"""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(520, 1040)
        self.down = nn.Linear(1040, 520)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


@check(any_world_size=False)
def large_mlp(ctx):
    """A Colwise -> Rowwise MLP whose rowwise output all_reduce and input-gradient all_reduce
    move (520, 520) float32 (1.03 MiB) matches the single-device MLP in forward, the input's
    gradient and every parameter's gradient (torch.distributed.tensor.parallel)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, model = _pair(ctx, WideMLP, 12)
    parallelize_module(model, mesh, MLP_PLAN)
    _assert_matches_reference(ctx, model, ref, host_tensor((520, 520), 13), "wide MLP",
                              lambda y: y.pow(2).mean(), rtol=1e-4, atol=1e-4)


@check
def sequence_parallel(ctx):
    """SequenceParallel on a LayerNorm: the local input is this rank's slice of the sequence
    dim, the output is a Shard(1) DTensor equal to the single-device LayerNorm, the parameters
    are replicated and their gradients (Partial, summed over ranks) match
    (torch.distributed.tensor.parallel.SequenceParallel)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, norm = _pair(ctx, lambda: nn.LayerNorm(DIM), 7)
    parallelize_module(norm, mesh, SequenceParallel())
    assert_value(norm.weight.placements, (Replicate(),), "norm.weight.placements")
    x = host_tensor((2, 2 * ctx.world_size, DIM), 8)
    out = norm(x.chunk(ctx.world_size, 1)[ctx.rank].to(ctx.device, copy=True))
    assert isinstance(out, DTensor) and out.placements == (Shard(1),), f"output {type(out).__name__}"
    expected = ref(x)
    assert_close(out.full_tensor(), expected, "SequenceParallel LayerNorm output")
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    _assert_grads(norm, ref, "SequenceParallel LayerNorm")


class _Echo(nn.Module):
    """Records the input it sees and returns it unchanged."""

    def forward(self, x):
        self.seen = x
        return x * 1


@check
def prepare_module_io(ctx):
    """PrepareModuleInput turns a local Shard(0) input into a Replicate DTensor (the module sees
    the whole batch), and PrepareModuleOutput turns a Replicate output into a local Shard(0)
    tensor again (torch.distributed.tensor.parallel.PrepareModuleInput/Output)."""
    mesh = ctx.mesh((ctx.world_size,))
    echo = _Echo()
    parallelize_module(echo, mesh, PrepareModuleInput(
        input_layouts=Shard(0), desired_input_layouts=Replicate(), use_local_output=False))
    full = host_tensor((2 * ctx.world_size, 3), 9)
    local = full.chunk(ctx.world_size)[ctx.rank].to(ctx.device, copy=True)
    out = echo(local)
    assert isinstance(echo.seen, DTensor) and echo.seen.placements == (Replicate(),), (
        f"module saw {type(echo.seen).__name__}")
    assert_equal(echo.seen.to_local(), full, "PrepareModuleInput: the module's input")
    assert_equal(_full(out), full, "PrepareModuleInput: output")
    echo2 = _Echo()
    parallelize_module(echo2, mesh, PrepareModuleOutput(
        output_layouts=Replicate(), desired_output_layouts=Shard(0), use_local_output=True))
    out2 = echo2(DTensor.from_local(full.to(ctx.device, copy=True), mesh, [Replicate()]))
    assert not isinstance(out2, DTensor), "PrepareModuleOutput(use_local_output=True) returned a DTensor"
    assert_equal(out2, full.chunk(ctx.world_size)[ctx.rank], "PrepareModuleOutput: local Shard(0) output")


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MLP() for _ in range(2))
        self.head = nn.Linear(DIM, DIM)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


@check(any_world_size=False)
def dict_plan_wildcards(ctx):
    """A dict plan with nested FQNs and wildcards ("layers.*.up", "layers.*.down", "head")
    parallelizes every matching submodule (placements checked) and the model matches one
    device forward and backward; a key matching nothing warns "could not be resolved"
    (torch.distributed.tensor.parallel.parallelize_module)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, model = _pair(ctx, _Stack, 10)
    plan = {"layers.*.up": ColwiseParallel(), "layers.*.down": RowwiseParallel(),
            "head": ColwiseParallel(output_layouts=Replicate())}
    parallelize_module(model, mesh, plan)
    for i in range(2):
        assert_value(model.layers[i].up.weight.placements, (Shard(0),),
                     f"layers.{i}.up.weight placements")
        assert_value(model.layers[i].down.weight.placements, (Shard(1),),
                     f"layers.{i}.down.weight placements")
    assert_value(model.head.weight.placements, (Shard(0),), "model.head.weight.placements")
    x = host_tensor((3, DIM), 11)
    out, expected = model(x.to(ctx.device, copy=True)), ref(x)
    assert_close(out, expected, "dict-plan model forward")
    out.sum().backward()
    expected.sum().backward()
    _assert_grads(model, ref, "dict-plan model")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallelize_module(_Stack(), mesh, {"blocks.*.up": ColwiseParallel()})
    assert any("could not be resolved" in str(w.message) for w in caught), (
        f"no 'could not be resolved' warning for an unmatched key: {[str(w.message) for w in caught]}")


@check(any_world_size=False)
def ambient_mesh(ctx):
    """``with mesh: parallelize_module(m, parallelize_plan=...)`` without a mesh argument uses
    the ambient mesh: the parameters are DTensors on that very mesh and the module matches
    one device (PR 134247)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, model = _pair(ctx, MLP, 12)
    with mesh:
        parallelize_module(model, parallelize_plan=MLP_PLAN)
    for name in ("up", "down"):
        placed_on = getattr(model, name).weight.device_mesh
        assert placed_on == mesh, f"{name}.weight is on {placed_on}, not the ambient mesh"
    x = host_tensor((4, DIM), 13)
    assert_close(model(x.to(ctx.device, copy=True)), ref(x), "MLP parallelized under `with mesh:`")


class FeedForward(nn.Module):
    """PR 134247's example: parallelize_module called inside __init__, mesh from the context.
    ``partial_output`` returns w2's Partial result as is; otherwise it is redistributed to
    Replicate, the two choices the PR describes."""

    def __init__(self, dim: int, hidden_dim: int, partial_output: bool = False) -> None:
        super().__init__()
        w1 = nn.Linear(dim, hidden_dim, bias=False)
        w2 = nn.Linear(hidden_dim, dim, bias=False)
        w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.w1 = parallelize_module(w1, parallelize_plan=ColwiseParallel(use_local_output=False))
        self.w2 = parallelize_module(w2, parallelize_plan=RowwiseParallel(
            input_layouts=Shard(-1), output_layouts=Partial(), use_local_output=False))
        self.w3 = parallelize_module(w3, parallelize_plan=ColwiseParallel(use_local_output=False))
        self.partial_output = partial_output

    def forward(self, x):
        y = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return y if self.partial_output else y.redistribute(placements=[Replicate()])


class _PlainFeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _feedforward_pair(ctx, mesh, partial_output):
    ref = _seeded(_PlainFeedForward(DIM, HIDDEN), 14)
    with torch.device(ctx.device), mesh:
        model = FeedForward(DIM, HIDDEN, partial_output)
    with torch.no_grad():
        for name in ("w1", "w2", "w3"):
            getattr(model, name).weight.copy_(distribute_tensor(
                getattr(ref, name).weight.detach().to(ctx.device, copy=True), mesh,
                getattr(model, name).weight.placements))
    return ref, model


@check
def feedforward_in_init(ctx):
    """PR 134247's FeedForward (w1/w3 Colwise, w2 Rowwise, SiLU gate) built under
    ``with mesh:`` with parallelize_module inside __init__ matches the single-device module in
    forward and in every weight's gradient (PR 134247)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, model = _feedforward_pair(ctx, mesh, partial_output=False)
    for name, placement in (("w1", Shard(0)), ("w2", Shard(1)), ("w3", Shard(0))):
        weight = getattr(model, name).weight
        assert isinstance(weight, DTensor) and weight.placements == (placement,), f"{name}.weight"
        assert_value(weight.device_mesh, mesh, f"{name}.weight's mesh")
    x = host_tensor((4, DIM), 15)
    out = model(x.to(ctx.device, copy=True))
    expected = ref(x)
    assert_value(out.placements, (Replicate(),), "out.placements")
    assert_close(out.to_local(), expected, "FeedForward forward")
    out.to_local().sum().backward()
    expected.sum().backward()
    _assert_grads(model, ref, "FeedForward")


@check
def partial_output(ctx):
    """The FeedForward may return w2's Partial output as is or redistribute it to Replicate:
    the Partial DTensor's full_tensor(), the Replicate result and the single-device output are
    the same values (PR 134247: "there is modeling flexibility here")."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, model = _feedforward_pair(ctx, mesh, partial_output=True)
    x = host_tensor((4, DIM), 16)
    y = model(x.to(ctx.device, copy=True))
    assert isinstance(y, DTensor) and y.placements == (Partial("sum"),), f"placements {y.placements}"
    replicated = y.redistribute(placements=[Replicate()]).to_local()
    assert_equal(y.full_tensor(), replicated, "Partial.full_tensor() vs redistribute(Replicate())")
    assert_close(replicated, ref(x), "Partial output vs one device")


@check
def plan_none_warns(ctx):
    """parallelize_module with parallelize_plan=None warns "No parallelize_plan is provided ...
    this parallelize_module call will do nothing" and returns the very same module, unchanged;
    so does the PR description's positional call parallelize_module(m, ColwiseParallel()) under
    ``with mesh:`` (the style lands in device_mesh, the plan stays None) (PR 134247)."""
    mesh = ctx.mesh((ctx.world_size,))
    for what, call in (("parallelize_plan=None", lambda m: parallelize_module(m, mesh)),
                       ("positional style", lambda m: parallelize_module(m, ColwiseParallel()))):
        module = nn.Linear(DIM, DIM).to(ctx.device)
        before = module.weight.detach().clone()
        with warnings.catch_warnings(record=True) as caught, mesh:
            warnings.simplefilter("always")
            result = call(module)
        messages = [str(w.message) for w in caught]
        assert any("No parallelize_plan is provided" in m and "will do nothing" in m for m in messages), (
            f"{what}: no 'No parallelize_plan is provided' warning: {messages}")
        assert result is module, f"{what}: returned another module"
        assert not isinstance(module.weight, DTensor), f"{what}: the weight became a DTensor"
        assert_equal(module.weight.detach(), before, f"{what}: weight changed")


@check
def no_mesh_raises(ctx):
    """parallelize_module with a plan but neither a mesh argument nor an ambient mesh raises
    RuntimeError "No device mesh is currently active!" and leaves the module unchanged
    (PR 134247: "mesh is still in fact required")."""
    module = nn.Linear(DIM, DIM).to(ctx.device)
    with expect_raises(RuntimeError, "No device mesh is currently active",
                       what="parallelize_module without any mesh"):
        parallelize_module(module, parallelize_plan=ColwiseParallel())
    assert not isinstance(module.weight, DTensor)


@check(any_world_size=False)
def nd_ambient_mesh(ctx):
    """With a 2-D mesh as the ambient mesh parallelize_module gets the whole 2-D mesh (not the
    TP dim) and fails exactly as when that mesh is passed explicitly ("placements must have the
    same length as device_mesh.ndim"); ``with mesh["tp"]:`` works (PR 134247 review: the user
    picks the intended mesh)."""
    mesh = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    with expect_raises(ValueError, what="ColwiseParallel on a 2-D ambient mesh") as ambient, mesh:
        parallelize_module(nn.Linear(DIM, DIM).to(ctx.device), parallelize_plan=ColwiseParallel())
    with expect_raises(ValueError, what="ColwiseParallel on a 2-D mesh argument") as explicit:
        parallelize_module(nn.Linear(DIM, DIM).to(ctx.device), mesh, ColwiseParallel())
    errors = [ambient.message, explicit.message]
    assert errors[0] == errors[1] and "device_mesh.ndim" in errors[0], errors
    with mesh["tp"]:
        lin = parallelize_module(nn.Linear(DIM, DIM).to(ctx.device), parallelize_plan=ColwiseParallel())
    assert_value(lin.weight.device_mesh, mesh["tp"], "the weight's mesh")


class Block(nn.Module):
    """A pre-norm transformer block: multi-head attention and an MLP, with residuals."""

    def __init__(self, dim: int = DIM, heads: int = 4) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.o = nn.Linear(dim, dim)
        self.mlp = MLP()

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm1(x)
        q, k, v = (proj(h).view(b, s, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(attn)
        return x + self.mlp(self.norm2(x))


BLOCK_PLAN = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
              "o": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}


@check(also_at=(2,), any_world_size=False)
def transformer_block(ctx):
    """A transformer block under TP (q/k/v Colwise so each rank holds whole heads, o Rowwise,
    MLP Colwise->Rowwise) matches the single-device block forward and backward, input and
    parameter gradients (torch.distributed.tensor.parallel; atol 1e-4)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, block = _pair(ctx, Block, 17)
    parallelize_module(block, mesh, BLOCK_PLAN)
    _assert_matches_reference(ctx, block, ref, host_tensor((2, 5, DIM), 18), "block",
                              lambda y: y.pow(2).mean(), atol=1e-4, rtol=1e-4)


def _dropout_region(ctx, mesh, seed):
    """Dropout inside a TP region: on the Shard(0) (batch-sharded) activation of a Colwise
    layer fed a Shard(0) input."""
    torch.manual_seed(seed)
    _random._rng_tracker = _random.OffsetBasedRNGTracker(mesh, run_state_sync=False)
    x = DTensor.from_local(torch.ones(2, DIM, device=ctx.device), mesh, [Shard(0)])
    return F.dropout(x, p=0.5, training=True)


@check(requires=("rng-tracker",))
def dropout_deterministic(ctx):
    """Dropout on a TP activation is deterministic at a seed and gives each shard its own mask
    (PR 103235's tracker inside a PR 134247-style TP model)."""
    mesh = ctx.mesh((ctx.world_size,))
    first = _dropout_region(ctx, mesh, 21).to_local().cpu()
    again = _dropout_region(ctx, mesh, 21).to_local().cpu()
    assert_equal(again, first, "dropout mask at the same seed")
    pieces = all_ranks_object(first)
    for i in range(len(pieces)):
        for j in range(i + 1, len(pieces)):
            assert not torch.equal(pieces[i], pieces[j]), f"shards {i} and {j} got the same dropout mask"


@check(requires=("rng-tracker", "offset-exact"))
def dropout_offset_exact(ctx):
    """On an offset-exact backend dropout on a Shard(0) TP activation is bitwise the
    single-device dropout at the same seed (PR 103235's offsets)."""
    mesh = ctx.mesh((ctx.world_size,))
    full = _dropout_region(ctx, mesh, 22).full_tensor()
    torch.manual_seed(22)
    reference = F.dropout(torch.ones(2 * ctx.world_size, DIM, device=ctx.device), p=0.5, training=True)
    assert_equal(full, reference, "sharded dropout vs one device")


@check(any_world_size=False)
def optimizer_step(ctx):
    """SGD (momentum) and AdamW steps on TP parameters of an MLP give the same parameters as on
    one device after three steps (torch.optim on DTensor parameters; rtol 1e-4, atol 1e-5)."""
    mesh = ctx.mesh((ctx.world_size,))
    for make_opt in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                     lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)):
        ref, model = _pair(ctx, MLP, 23)
        parallelize_module(model, mesh, MLP_PLAN)
        opt, ref_opt = make_opt(model.parameters()), make_opt(ref.parameters())
        for step in range(3):
            x = host_tensor((4, DIM), 24 + step)
            for m, o, inp in ((model, opt, x.to(ctx.device, copy=True)), (ref, ref_opt, x)):
                o.zero_grad()
                m(inp).pow(2).mean().backward()
                o.step()
        _assert_params(model, ref, type(opt).__name__, rtol=1e-4, atol=1e-5)


@check(requires=("rng-tracker",), any_world_size=False)
def meta_init_2d(ctx):
    """An MLP built on the meta device, parallelized on the TP dim of a (dp, tp) mesh, then
    to_empty(device) and reset_parameters() at one seed: every weight's shards differ within a
    TP group and are equal across the DP dim (PR 103235 tracker + PR 134247 TP)."""
    mesh = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    with torch.device("meta"):
        model = MLP()
    parallelize_module(model, mesh["tp"], MLP_PLAN)
    model.to_empty(device=ctx.device)
    torch.manual_seed(25)
    _random._rng_tracker = None
    for module in (model.up, model.down):
        module.reset_parameters()
    for name in ("up.weight", "down.weight"):
        local = model.get_parameter(name).to_local().detach().cpu()
        assert local.device.type == "cpu" and torch.isfinite(local).all(), name
        tp_pieces = all_ranks_object(local, mesh["tp"].get_group())
        for i in range(len(tp_pieces)):
            for j in range(i + 1, len(tp_pieces)):
                assert not torch.equal(tp_pieces[i], tp_pieces[j]), f"{name}: TP shards {i} and {j} are equal"
        for piece in all_ranks_object(local, mesh["dp"].get_group()):
            assert_equal(piece, local, f"{name}: shard across the DP dim")


def _counts(comm_mode) -> dict[str, int]:
    return {str(op).split(".")[-1]: n for op, n in comm_mode.get_comm_counts().items() if n}


@check(any_world_size=False)
def comm_counts(ctx):
    """CommDebugMode counts for TP: Colwise forward none and backward one all_reduce (the
    input gradient); Rowwise forward one all_reduce and backward none; the Colwise->Rowwise
    MLP one all_reduce each way (torch.distributed.tensor.parallel, CommDebugMode)."""
    mesh = ctx.mesh((ctx.world_size,))
    col = parallelize_module(nn.Linear(DIM, HIDDEN).to(ctx.device), mesh, ColwiseParallel())
    row = parallelize_module(nn.Linear(HIDDEN, DIM).to(ctx.device), mesh, RowwiseParallel())
    model = parallelize_module(_seeded(MLP(), 26).to(ctx.device), mesh, MLP_PLAN)
    cases = (
        ("Colwise", col, (4, DIM), {}, {"all_reduce": 1}),
        ("Rowwise", row, (4, HIDDEN // ctx.world_size), {"all_reduce": 1}, {}),
        ("MLP", model, (4, DIM), {"all_reduce": 1}, {"all_reduce": 1}),
    )
    for what, module, shape, fwd_expected, bwd_expected in cases:
        x = torch.ones(shape, device=ctx.device, requires_grad=True)
        with CommDebugMode() as fwd:
            out = module(x)
        with CommDebugMode() as bwd:
            out.sum().backward()
        assert _counts(fwd) == fwd_expected, f"{what} forward: {_counts(fwd)}, expected {fwd_expected}"
        assert _counts(bwd) == bwd_expected, f"{what} backward: {_counts(bwd)}, expected {bwd_expected}"


class TiedLM(nn.Module):
    """An embedding and an output head sharing one weight (vocab x dim), as language models do."""

    VOCAB, WIDTH = 16, 8

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.VOCAB, self.WIDTH)
        self.head = nn.Linear(self.WIDTH, self.VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens)))


@check
def tied_weights(ctx):
    """A tied embedding/output head moved to the device stays tied (one Parameter: .to() keeps
    identity through torch._has_compatible_shallow_copy_type), and after parallelize_module
    (embedding RowwiseParallel, head ColwiseParallel, both Shard(0) of the vocab, re-tied as
    torch's TP examples do) forward output and the tied weight's gradient (both uses summed)
    equal the single-device model."""
    mesh = ctx.mesh((ctx.world_size,))
    ref, model = _pair(ctx, TiedLM, 30)
    assert model.head.weight is model.embed.weight, "tying broken by .to(device)"
    parallelize_module(model, mesh, {"embed": RowwiseParallel(input_layouts=Replicate()),
                                     "head": ColwiseParallel(output_layouts=Replicate())})
    model.head.weight = model.embed.weight
    assert model.embed.weight.placements == (Shard(0),)
    tokens = torch.randint(0, TiedLM.VOCAB, (3, 5), generator=torch.Generator().manual_seed(31))
    out, expected = model(tokens.to(ctx.device)), ref(tokens)
    assert_close(out, expected, "tied LM forward")
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    assert_close(_full(model.embed.weight.grad), ref.embed.weight.grad,
                 "gradient of the tied weight (embedding + head)")
