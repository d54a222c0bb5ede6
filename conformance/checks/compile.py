"""``torch.compile`` on the backend's device: single-device graphs, functional collectives,
DTensor programs, a tensor-parallel block and DTensor random ops, compiled and compared with
eager on every rank.

Most checks come in two variants: ``_aot_eager`` (Dynamo and AOTAutograd, the graph run by
eager kernels: needs only Dynamo's device interface) and ``_inductor`` (torch.compile's
default backend, which generates code for the device; needs the ``inductor`` capability, else
SKIP naming the aot_eager variant). Each compiled function is called twice with the same
shapes and must be compiled once (Dynamo's guards hold). Compiled floats are compared with
``assert_close`` (Inductor fuses and reorders arithmetic; rtol 1e-5, atol 1e-5 unless stated),
integer-exact results bitwise.

Inductor's caches go to ``$TORCHINDUCTOR_CACHE_DIR`` or, when unset, ``inductor/`` under
accelkit's cache directory (``$ACCELKIT_CACHE_DIR``, ``~/.cache/accelkit``), so a second run
reuses the generated code; Inductor compiles in the rank's own process
(``compile_threads = 1`` unless ``TORCHINDUCTOR_COMPILE_THREADS`` says otherwise).
Sources: ``torch._dynamo.device_interface`` / ``torch._inductor.codegen.common`` (device
registration), ``torch.distributed._functional_collectives``, ``torch.distributed.tensor``
(PR 102468, PR 102336), PR 134247 (the ambient ``with mesh:``), PR 103235 (the RNG tracker).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import (
    ALSO_AT,
    all_ranks_object,
    assert_close,
    assert_equal,
    host_tensor,
    rank_input,
)
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, _random, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT)

#: The two ways each program is compiled, and what the Inductor one needs.
BACKENDS = {"aot_eager": (), "inductor": ("inductor",)}
#: Seconds an Inductor variant may take: with empty caches its first compile builds C++ kernels
#: in every rank (over 60 s on a busy 2-core host); warm, a few seconds.
INDUCTOR_TIMEOUT_S = 300.0


def _variants(fn: Callable | None = None, *, requires: tuple[str, ...] = ()) -> Callable:
    """``@_variants`` or ``@_variants(requires=...)``: register ``fn(ctx, backend)`` as the
    checks ``compile.<fn name>_aot_eager`` and ``compile.<fn name>_inductor`` (needing
    ``requires`` too; the Inductor one also the ``inductor`` capability and
    :data:`INDUCTOR_TIMEOUT_S`); the docstring is shared, with the backend appended."""

    def decorate(fn: Callable) -> Callable:
        for backend, needs in BACKENDS.items():
            def run(ctx, _backend=backend):
                _prepare_inductor()
                return fn(ctx, _backend)

            run.__name__ = run.__qualname__ = f"{fn.__name__}_{backend}"
            run.__module__ = fn.__module__
            run.__doc__ = f"{fn.__doc__}\n\nCompiled with backend={backend!r}."
            check(requires=(*requires, *needs),
                  timeout=INDUCTOR_TIMEOUT_S if backend == "inductor" else None)(run)
        return fn

    return decorate if fn is None else decorate(fn)


def _prepare_inductor() -> None:
    """Inductor's caches under accelkit's cache directory unless TORCHINDUCTOR_CACHE_DIR is set,
    and compilation in this process (one compile-worker pool per rank would crowd the host)."""
    from accelkit.core.cpp import cache_root

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        import torch._inductor.config

        torch._inductor.config.compile_threads = 1


class Compiled:
    """``torch.compile(fn, backend=..., fullgraph=...)`` that records every graph Dynamo hands
    the backend (one per compiled frame, more after a graph break; a recompilation adds one)."""

    def __init__(self, fn: Callable, backend: str, fullgraph: bool = True) -> None:
        from torch._dynamo import lookup_backend

        self.graphs: list[torch.fx.GraphModule] = []
        self.fullgraph = fullgraph
        self.after_first_call: int | None = None
        inner = lookup_backend(backend)

        def record(gm, example_inputs):
            self.graphs.append(gm)
            return inner(gm, example_inputs)

        torch._dynamo.reset()
        self.fn = torch.compile(fn, backend=record, fullgraph=fullgraph)

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        if self.after_first_call is None:
            self.after_first_call = len(self.graphs)
        return out

    def op_names(self) -> set[str]:
        """The ``namespace::name`` of every operator the graphs call."""
        names = set()
        for gm in self.graphs:
            for node in gm.graph.nodes:
                target = node.target
                name = getattr(target, "_qualified_op_name", None) or getattr(
                    getattr(target, "_schema", None), "name", None)
                if node.op == "call_function" and name:
                    names.add(name)
        return names

    def assert_compiled_once(self, what: str) -> None:
        """Later calls with the same shapes compiled nothing new; with fullgraph, one graph."""
        first = self.after_first_call
        assert len(self.graphs) == first, (
            f"{what}: {len(self.graphs) - first} recompilation(s) on calls with the same "
            f"shapes ({first} graph(s) after the first call)")
        assert first == 1 or not self.fullgraph, f"{what}: {first} graphs with fullgraph=True"


@check
def registration(ctx):
    """Dynamo has a DeviceInterface for the device type and, when the backend declares the
    ``inductor`` capability, Inductor has a backend for it (scheduling, wrapper codegen and
    device op overrides, torch._inductor.codegen.common.register_backend_for_device /
    register_device_op_overrides); a device registered through accelkit without one gets a
    refusal naming aot_eager, not a KeyError (accelkit.core.compiler)."""
    from accelkit.core.compiler import compiler_status

    _prepare_inductor()
    status = compiler_status(ctx.device_type)
    assert status.interface is not None, f"Dynamo has no DeviceInterface for {ctx.device_type!r}"
    from torch._dynamo.device_interface import get_interface_for_device

    if ctx.device_type != "cpu":  # torch's CpuInterface has no device_count
        interface = get_interface_for_device(ctx.device_type)
        # this host's devices, for this host's ranks (a launch across hosts has fewer on each
        # host than it has ranks; torchrun and the pool set LOCAL_WORLD_SIZE)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
        assert interface.device_count() >= local, (
            f"{status.interface}.device_count() is {interface.device_count()}, but this host "
            f"runs {local} ranks, one per device")
        assert interface.current_device() == ctx.device.index, (
            f"{status.interface}.current_device() is {interface.current_device()}, "
            f"expected {ctx.device.index}")
    if ctx.spec.capabilities.inductor:
        assert status.inductor, f"the backend declares inductor=True: {status.reason}"
    else:
        assert not status.inductor and "aot_eager" in (status.reason or ""), (
            f"the backend declares inductor=False but {status}")


@_variants
def ops(ctx, backend):
    """A small MLP's loss on this rank's device (a matmul with a bias and GELU epilogue,
    elementwise ops, a softmax and a sum reduction) compiled with torch.compile equals eager in
    the loss and the output, and its backward (the compiled backward graph) in every
    gradient; results stay on the rank's own device index."""
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(ctx.device)
    ref = copy.deepcopy(model)

    def forward(m, x, y):
        out = m(x)
        return (torch.softmax(out, -1) * y).sum(1).mean() + (out.sin() * 0.1).pow(2).mean(), out

    compiled = Compiled(forward, backend)
    for call in range(2):
        x = host_tensor((4, 16), 10 + call).to(ctx.device)
        y = host_tensor((4, 8), 20 + call).to(ctx.device)
        model.zero_grad()
        ref.zero_grad()
        loss, out = compiled(model, x, y)
        ref_loss, ref_out = forward(ref, x, y)
        loss.backward()
        ref_loss.backward()
        assert out.device == ctx.device, f"compiled output on {out.device}, expected {ctx.device}"
        assert_close(loss, ref_loss, f"call {call}: loss")
        assert_close(out, ref_out, f"call {call}: output")
        for (name, p), r in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert_close(p.grad, r.grad, f"call {call}: gradient of {name}")
    compiled.assert_compiled_once("MLP forward")


@_variants
def functional_collectives(ctx, backend):
    """all_reduce, all_gather_tensor and reduce_scatter_tensor of
    torch.distributed._functional_collectives, waited with wait_tensor, traced in one compiled
    function: the graph holds _c10d_functional ops (all_reduce, all_gather_into_tensor,
    reduce_scatter_tensor, wait_tensor), the results equal the sums / concatenation of every
    rank's input (bitwise: small integers), and the group's device collectives are the
    backend's library."""
    group = dist.group.WORLD
    library = group._get_backend(torch.device(ctx.device_type)).name()
    assert library == ctx.spec.collective_backend, (
        f"the default group's {ctx.device_type} backend is {library!r}, expected "
        f"{ctx.spec.collective_backend!r}")
    n = ctx.world_size

    def program(x):
        summed = funcol.wait_tensor(funcol.all_reduce(x * 2, "sum", group))
        gathered = funcol.wait_tensor(funcol.all_gather_tensor(x + 1, 0, group))
        scattered = funcol.wait_tensor(funcol.reduce_scatter_tensor(gathered, "sum", 0, group))
        return summed + 1, gathered, scattered

    compiled = Compiled(program, backend)
    for call in range(2):
        every = [rank_input((2 * n, 3), r, seed=30 + call) for r in range(n)]
        summed, gathered, scattered = compiled(every[ctx.rank].to(ctx.device))
        stacked = torch.stack(every)
        total = (stacked * 2).sum(0) + 1
        concat = torch.cat([e + 1 for e in every])
        assert_equal(summed, total, f"call {call}: all_reduce")
        assert_equal(gathered, concat, f"call {call}: all_gather_tensor")
        expected = (concat * n).chunk(n)[ctx.rank]
        assert_equal(scattered, expected, f"call {call}: reduce_scatter_tensor")
    compiled.assert_compiled_once("functional collectives")
    ops = {n.split("::")[1] for n in compiled.op_names() if n.startswith("_c10d_functional::")}
    wanted = {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "wait_tensor"}
    assert wanted <= ops, (f"_c10d_functional ops in the graph: {sorted(ops)}; missing "
                           f"{sorted(wanted - ops)}")


@_variants
def dtensor_program(ctx, backend):
    """A DTensor program compiled with fullgraph=True (no graph break allowed): redistribute
    Shard(0) -> Replicate, a row-sharded matmul against a replicated weight, and a sum over
    the sharded dim, which leaves a Partial("sum") DTensor, redistributed to Replicate; the
    outputs have eager DTensor's placements and local values and equal the single-device
    results (bitwise: small integers) (torch.distributed.tensor)."""
    mesh = ctx.mesh((ctx.world_size,))
    n = ctx.world_size

    def program(a, w):
        partial = (a @ w).sum(0)
        return a.redistribute(mesh, [Replicate()]) * 2, (a @ w).relu(), partial, \
            partial.redistribute(mesh, [Replicate()])

    compiled = Compiled(program, backend)
    for call in range(2):
        a_host = host_tensor((2 * n, 6), 40 + call, low=-4, high=5)
        w_host = host_tensor((6, 5), 50 + call, low=-4, high=5)
        a = distribute_tensor(a_host.to(ctx.device), mesh, [Shard(0)])
        w = distribute_tensor(w_host.to(ctx.device), mesh, [Replicate()])
        got, want = compiled(a, w), program(a, w)
        product = a_host @ w_host
        singles = (a_host * 2, product.relu(), product.sum(0), product.sum(0))
        placements = ((Replicate(),), (Shard(0),), (Partial("sum"),), (Replicate(),))
        for i, (g, e, p, single) in enumerate(zip(got, want, placements, singles, strict=True)):
            assert isinstance(g, DTensor) and tuple(g.placements) == tuple(e.placements) == p, (
                f"call {call}: output {i} is {type(g).__name__} "
                f"{getattr(g, 'placements', '')}, eager {e.placements}, expected {p}")
            assert_equal(g.to_local(), e.to_local(), f"call {call}: output {i} vs eager")
            assert_equal(g.full_tensor(), single, f"call {call}: output {i} vs one device")
    compiled.assert_compiled_once("DTensor program")


class Block(nn.Module):
    """An MLP block with a residual and a LayerNorm."""

    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


@_variants
def tp_block(ctx, backend):
    """parallelize_module under ``with mesh:`` (the mesh argument left out, PR 134247) with a
    Colwise -> Rowwise plan, then torch.compile of the block (fullgraph=True): the forward
    output, the input's gradient and every parameter's gradient equal the single-device
    block's (torch.distributed.tensor.parallel)."""
    mesh = ctx.mesh((ctx.world_size,))
    ref = Block()
    with torch.no_grad():
        for i, p in enumerate(ref.parameters()):
            p.copy_(host_tensor(p.shape, 60 + i) * 0.3)
    block = copy.deepcopy(ref).to(ctx.device)
    with mesh:
        parallelize_module(block, parallelize_plan={"up": ColwiseParallel(),
                                                    "down": RowwiseParallel()})
    compiled = Compiled(block, backend)
    for call in range(2):
        block.zero_grad()
        ref.zero_grad()
        x = host_tensor((4, 16), 70 + call)
        xd = x.to(ctx.device, copy=True).requires_grad_()
        xr = x.clone().requires_grad_()
        out, expected = compiled(xd), ref(xr)
        assert_close(out, expected, f"call {call}: forward")
        out.pow(2).sum().backward()
        expected.pow(2).sum().backward()
        assert_close(xd.grad, xr.grad, f"call {call}: input gradient")
        for (name, p), r in zip(block.named_parameters(), ref.parameters(), strict=True):
            grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            assert_close(grad, r.grad, f"call {call}: gradient of {name}")
    compiled.assert_compiled_once("TP block")


def _offset(ctx) -> int:
    state = getattr(torch, ctx.device_type).get_rng_state(ctx.device)
    return int(state[8:].view(torch.int64).item())


def _random_program(a, b):
    a = a.uniform_(-1, 1)
    return a * 2, F.dropout(b, p=0.5, training=True)


def _run_random(ctx, mesh, fn):
    """``fn`` on fresh DTensors from seed 77 with a fresh tracker: (local results on the host,
    the device RNG offset before and after)."""
    n = ctx.world_size
    torch.manual_seed(77)
    _random._rng_tracker = _random.OffsetBasedRNGTracker(mesh, run_state_sync=False)
    a = distribute_tensor(torch.zeros(4 * n, 3, device=ctx.device), mesh, [Shard(0)])
    b = distribute_tensor(torch.ones(5, 4 * n, device=ctx.device), mesh, [Shard(1)])
    before = _offset(ctx)
    out = fn(a, b)
    return [t.to_local().cpu() for t in out], (before, _offset(ctx))


#: What torch 2.13 raises when Dynamo traces a DTensor random op on a device other than CUDA:
#: DTensor's dispatch (torch.distributed.tensor._dispatch) puts the op in the graph through the
#: run_dtensor_rng_op higher-order op only for CUDA tensors; on other devices it runs the
#: tracker's _distribute_region at trace time, which reads the real RNG state under
#: FakeTensorMode (a hard error, not a graph break). Upstream PR 187969 opens the path to XPU.
UNTRACEABLE = "Please convert all Tensors to FakeTensors first"


@_variants(requires=("rng-tracker",))
def dtensor_random(ctx, backend):
    """uniform_ on a Shard(0) DTensor and dropout on a Shard(1) DTensor, compiled with
    fullgraph=True, give every rank the local values and the RNG offsets eager gives from the
    same seed, on two calls (OffsetBasedRNGTracker in its compiled path, run_dtensor_rng_op,
    PR 103235: each shard draws from its own offset, every rank's offset then moves to
    old + ceil4(numel of the whole DTensor)); eager gives the ranks different shards. torch
    2.13 compiles this for CUDA only: on another device the check confirms torch refuses at
    trace time (rather than compiling a graph that draws wrong numbers) and SKIPs with
    torch's reason. The Inductor variant sets torch._inductor.config.fallback_random so the
    device's random kernels run (Inductor's own RNG draws other numbers by design)."""
    import torch._inductor.config as inductor_config

    mesh = ctx.mesh((ctx.world_size,))
    want, want_offsets = _run_random(ctx, mesh, _random_program)
    shards = all_ranks_object(want[0])
    assert len({tuple(t.flatten().tolist()) for t in shards}) == ctx.world_size, (
        "eager uniform_ gave two ranks the same shard values")
    with inductor_config.patch(fallback_random=backend == "inductor"):
        compiled = Compiled(_random_program, backend)
        for call in range(2):
            try:
                got, offsets = _run_random(ctx, mesh, compiled)
            except Exception as exc:
                if ctx.device_type == "cuda" or UNTRACEABLE not in str(exc):
                    raise
                ctx.skip(f"unsupported by torch {torch.__version__.split('+')[0]}: DTensor "
                         "random ops enter the compiled graph (run_dtensor_rng_op) on CUDA "
                         f"only; on {ctx.device_type} Dynamo stops tracing the RNG tracker "
                         "under FakeTensorMode (pytorch/pytorch#187969 adds XPU); works "
                         "from torch 2.15, where DTensor's dispatch takes that path for the "
                         "current accelerator; eager DTensor random ops are checked in the rng "
                         "area")
            assert offsets == want_offsets, (
                f"call {call}: RNG offset before/after {offsets}, eager {want_offsets}")
            for name, g, e in zip(("uniform_", "dropout"), got, want, strict=True):
                assert_equal(g, e, f"call {call}: {name} local values vs eager")
    compiled.assert_compiled_once("DTensor random ops")
