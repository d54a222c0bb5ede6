"""Training on the backend's device, where ports fail most: FSDP2 (``fully_shard``), DDP, HSDP,
FSDP2 x TP, SyncBatchNorm, activation checkpointing that replays random ops, resuming from a distributed
checkpoint, and tensor-parallel attention.

Every check trains the small transformer of ``_transformer.py`` (2 blocks, dim 16, 64-token
vocabulary, sequences of 8 tokens, 2 sequences per data-parallel rank) for a few AdamW steps and
compares it with the same model trained on one device (this rank's own device, no process group)
from the same initial weights on the whole batch. What FSDP2 gathers and computes is bitwise the
single-device math; the gradient reduction across ranks sums in another order, so losses,
gradients and parameters are compared within ``TOL`` (rtol 1e-4, atol 1e-5; the measured
difference after 2 steps is ~1e-7); continuing from a checkpoint, where nothing differs, is
compared bitwise. Results are read back with ``.cpu()``/``full_tensor()``, never through host
pointers, so the checks hold on an asynchronous device too.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._transformer import Config, Transformer, loss_fn, tokens, tp_plan
from accelkit.conformance.checks._util import (
    ALSO_AT,
    all_ranks_object,
    assert_close,
    assert_equal,
    host_tensor,
    shared_tmpdir,
)
from accelkit.core.versions import torch_at_least
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module
from torch.distributed.tensor.placement_types import _StridedShard

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT)

#: Sequence length, sequences per data-parallel rank, AdamW steps.
SEQ, PER_RANK, STEPS = 8, 2, 2
#: Tolerance of a data-parallel result against one device (reduction order only).
TOL = {"rtol": 1e-4, "atol": 1e-5}
CFG = Config()


def _seeded(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter from ``seed`` (identical on every rank), scaled to keep logits small."""
    with torch.no_grad():
        for i, param in enumerate(model.parameters()):
            param.copy_(host_tensor(param.shape, seed * 100 + i) * 0.3)
    return model


def _model(ctx, seed: int = 1, cfg: Config = CFG) -> Transformer:
    return _seeded(Transformer(cfg), seed).to(ctx.device)


def _adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def _batches(dp: int, steps: int = STEPS, seed: int = 10) -> list[torch.Tensor]:
    """``steps`` global batches (host) for ``dp`` data-parallel ranks."""
    return [tokens(PER_RANK * dp, SEQ, seed + s) for s in range(steps)]


def _local(batch: torch.Tensor, dp: int, dp_rank: int, device) -> torch.Tensor:
    return batch.chunk(dp)[dp_rank].to(device)


class Run:
    """Losses (host floats, the data-parallel mean), the gradients of the first step (host,
    full tensors) and the model after training."""

    def __init__(self, model, losses, first_grads):
        self.model, self.losses, self.first_grads = model, losses, first_grads


def _full(t: torch.Tensor) -> torch.Tensor:
    """A host copy of the whole tensor (never a view of a CPU parameter or optimizer state,
    which later steps update in place)."""
    t = (t.full_tensor() if isinstance(t, DTensor) else t).detach()
    return t.to("cpu", copy=True)


def _train(model, opt, batches, dp: int, dp_rank: int, device, dp_group=None) -> Run:
    """Train on this rank's slice of each batch; losses averaged over the data-parallel ranks."""
    losses, first_grads = [], None
    for i, batch in enumerate(batches):
        local = _local(batch, dp, dp_rank, device)
        loss = loss_fn(model(local), local)
        loss.backward()
        if i == 0:
            first_grads = {n: _full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
    if dp > 1:
        per_rank = all_ranks_object([float(x) for x in losses], dp_group)
        losses = [sum(r[i] for r in per_rank) / len(per_rank) for i in range(len(batches))]
    else:
        losses = [float(x) for x in losses]
    return Run(model, losses, first_grads)


def _reference(ctx, batches) -> Run:
    """The same training on one device: the whole batch, no process group."""
    model = _model(ctx)
    return _train(model, _adamw(model.parameters()), batches, 1, 0, ctx.device)


def _assert_matches(run: Run, ref: Run, what: str) -> None:
    """First-step gradients, losses and final parameters of ``run`` equal ``ref``'s within
    ``TOL`` (the gradients first: a lost contribution shows there)."""
    assert run.first_grads.keys() == ref.first_grads.keys(), (
        f"{what}: gradients of {sorted(run.first_grads)} vs {sorted(ref.first_grads)}")
    for name, grad in ref.first_grads.items():
        assert_close(run.first_grads[name], grad, f"{what}: first-step gradient of {name}", **TOL)
    assert_close(torch.tensor(run.losses, dtype=torch.float64), torch.tensor(ref.losses, dtype=torch.float64),
                 f"{what}: losses", **TOL)
    named = dict(run.model.named_parameters())
    for name, ref_param in ref.model.named_parameters():
        assert_close(_full(named[name]), ref_param, f"{what}: parameter {name} after training", **TOL)


def _fsdp(model, mesh, **kwargs):
    """``fully_shard`` on every block, then on the root (the documented FSDP2 recipe)."""
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def _assert_device_backend(ctx, mesh, what: str) -> None:
    """Every dimension group of ``mesh`` runs the device's collective library."""
    for dim in range(mesh.ndim):
        backend = mesh.get_group(dim)._get_backend(torch.device(ctx.device_type))
        assert backend.name() == ctx.spec.collective_backend, (
            f"{what}: mesh dim {dim} uses {backend.name()!r}, not {ctx.spec.collective_backend!r}")


@check
def fsdp2_parity(ctx):
    """fully_shard per block and on the root: the sharded parameters are Shard(0) DTensors on
    the device mesh whose groups run the device's collective library, their full tensors are
    bitwise the initial weights, and 2 AdamW steps give the single-device losses, first-step
    gradients and parameters, with reshard_after_forward True, False and an int (half the mesh;
    at 2 ranks that is 1, which torch treats as False) (torch.distributed.fsdp.fully_shard)."""
    ws = ctx.world_size
    mesh = ctx.mesh((ws,))
    batches = _batches(ws)
    ref = _reference(ctx, batches)
    initial = _model(ctx)
    for reshard in (True, False, ws // 2):
        what = f"FSDP2 reshard_after_forward={reshard}"
        model = _fsdp(_model(ctx), mesh, reshard_after_forward=reshard)
        for name, param in model.named_parameters():
            assert isinstance(param, DTensor) and param.placements == (Shard(0),), (
                f"{what}: {name} is {type(param).__name__} {getattr(param, 'placements', '')}")
            assert param.device_mesh == mesh and param.to_local().device == ctx.device, (
                f"{what}: {name} on {param.device_mesh} / {param.to_local().device}")
            assert_equal(param.full_tensor(), initial.get_parameter(name), f"{what}: {name} unsharded")
        _assert_device_backend(ctx, mesh, what)
        run = _train(model, _adamw(model.parameters()), batches, ws, ctx.rank, ctx.device)
        _assert_matches(run, ref, what)


def _ddp_run(ctx, batches, hook=None) -> Run:
    """DDP with several buckets, find_unused_parameters (an extra Linear the forward never
    calls) and each step accumulated over two micro-batches, the first under no_sync()."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ws = ctx.world_size
    model = _model(ctx)
    model.unused = torch.nn.Linear(2, 2, device=ctx.device)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=4096 / 2**20)
    if hook is not None:
        ddp.register_comm_hook(dist.group.WORLD, hook)
    buckets = len(ddp._get_ddp_logging_data()["bucket_sizes"].split(","))
    assert buckets > 1, f"DDP put every gradient into {buckets} bucket"
    opt = _adamw(p for n, p in model.named_parameters() if not n.startswith("unused."))
    losses, first_grads = [], None
    for i, batch in enumerate(batches):
        micro = _local(batch, ws, ctx.rank, ctx.device).chunk(2)
        with ddp.no_sync():
            first = loss_fn(ddp(micro[0]), micro[0]) / 2
            first.backward()
        second = loss_fn(ddp(micro[1]), micro[1]) / 2
        second.backward()
        assert model.unused.weight.grad is None, "the unused parameter got a gradient"
        if i == 0:
            first_grads = {n: _full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(float((first + second).detach().cpu()))
    per_rank = all_ranks_object(losses)
    return Run(model, [sum(r[i] for r in per_rank) / ws for i in range(len(batches))], first_grads)


@check
def ddp_parity(ctx):
    """DistributedDataParallel on the device (several gradient buckets, find_unused_parameters
    with a parameter the forward never uses, no_sync() accumulation over two micro-batches)
    gives the single-device losses, first-step gradients and parameters after 2 AdamW steps;
    with the fp16_compress_hook comm hook the first step's gradients are the single-device
    ones within fp16 rounding (the ranks' gradients are summed in fp16: rtol 2e-3, atol 4e-3 x
    the tensor's largest gradient). bf16_compress_hook is refused by torch on
    every device but CUDA/NCCL and XPU/XCCL (DistributedDataParallel._check_comm_hook), so the
    fp16 hook stands for compression hooks (torch.nn.parallel.DistributedDataParallel,
    torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    batches = _batches(ctx.world_size)
    ref = _reference(ctx, batches)
    _assert_matches(_ddp_run(ctx, batches), ref, "DDP")
    compressed = _ddp_run(ctx, batches[:1], fp16_compress_hook)
    for name, grad in ref.first_grads.items():
        assert_close(compressed.first_grads[name], grad, f"DDP + fp16_compress_hook: gradient of {name}",
                     rtol=2e-3, atol=4e-3 * float(grad.abs().max()))


def _batch_sizes(ws: int) -> list[int]:
    """Uneven per-rank batch sizes (1, 2, 3, 0, 1, ...): from 4 ranks one rank is empty."""
    return [(r + 1) % 4 for r in range(ws)]


@check
def sync_batch_norm(ctx):
    """torch.nn.SyncBatchNorm on the device, ranks holding uneven slices of the batch (one
    empty from 4 ranks): the output and input gradient of each slice, the running statistics
    (updated from values other than the defaults, so that the momentum's blend of old and new
    shows) and the weight and bias gradients summed over ranks equal BatchNorm2d's on the whole batch
    on one device (within TOL). SyncBatchNorm gathers each rank's statistics and count
    (torch/nn/modules/_functions.py) and runs batch_norm_stats, batch_norm_gather_stats_with_counts,
    batch_norm_elemt and the backward's batch_norm_backward_reduce/_elemt, which torch has for
    CUDA only: the device needs its own. torch refuses SyncBatchNorm on the CPU: SKIP there
    with its message (torch.nn.SyncBatchNorm.forward)."""
    ws, channels = ctx.world_size, 4
    sizes = _batch_sizes(ws)
    x = host_tensor((sum(sizes), channels, 3, 3), 60)
    g = host_tensor(x.shape, 61)
    start = sum(sizes[:ctx.rank])
    mine = slice(start, start + sizes[ctx.rank])

    def run(norm, inp, grad):
        with torch.no_grad():
            norm.weight.copy_(host_tensor((channels,), 62) + 1)
            norm.bias.copy_(host_tensor((channels,), 63))
            # running statistics that are not the defaults (0 and 1): the update's blend of
            # old and new, (1 - momentum) * old + momentum * batch, shows in both
            norm.running_mean.copy_(host_tensor((channels,), 64))
            norm.running_var.copy_(host_tensor((channels,), 65).abs() + 0.5)
        inp = inp.to(ctx.device).requires_grad_()
        out = norm(inp)
        out.backward(grad.to(ctx.device))
        return out, inp.grad

    ref_norm = torch.nn.BatchNorm2d(channels).to(ctx.device)
    ref_out, ref_grad = run(ref_norm, x, g)
    sync = torch.nn.SyncBatchNorm(channels).to(ctx.device)
    try:
        out, grad = run(sync, x[mine], g[mine])
    except ValueError as exc:
        if ctx.device_type != "cpu":
            raise
        ctx.skip(f"unsupported by torch {torch.__version__.split('+')[0]}: {exc}")
    assert_close(out, ref_out[mine], f"SyncBatchNorm output of rank {ctx.rank}'s {sizes[ctx.rank]} samples", **TOL)
    if sizes[ctx.rank]:  # an empty slice's gradient is None (torch's SyncBatchNorm.backward)
        assert_close(grad, ref_grad[mine], f"SyncBatchNorm input gradient of rank {ctx.rank}", **TOL)
    for name in ("running_mean", "running_var"):
        assert_close(getattr(sync, name), getattr(ref_norm, name), f"SyncBatchNorm {name}", **TOL)
    for name in ("weight", "bias"):
        local = getattr(sync, name).grad  # None on a rank with an empty slice
        summed = torch.zeros(channels, device=ctx.device) if local is None else local.detach().clone()
        dist.all_reduce(summed)
        assert_close(summed, getattr(ref_norm, name).grad, f"SyncBatchNorm {name} gradient summed over ranks", **TOL)


#: From torch 2.15 FSDP2 gives each unsharded parameter the reduce dtype as its ``grad_dtype``
#: (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, ``FSDPParam.unsharded_grad_dtype``):
#: autograd then casts a bf16 parameter's gradient to fp32 as it reaches the parameter, before
#: the reduction over broadcast dimensions, instead of computing it in bf16 and casting after.
FSDP2_GRAD_DTYPE_FROM = "2.15"


def _cast_reference(ctx, batches, dtype) -> Run:
    """FSDP2 mixed precision on one device: per step and per data-parallel slice, the forward
    and backward of a ``dtype`` copy of the fp32 parameters; the slice gradients cast to fp32
    (from torch 2.15 by autograd, through the copy's ``grad_dtype``, as FSDP2 does there: see
    :data:`FSDP2_GRAD_DTYPE_FROM`) and averaged in fp32, then AdamW on the fp32 parameters."""
    ws = ctx.world_size
    model = _model(ctx)
    opt = _adamw(model.parameters())
    losses, first_grads = [], None
    fp32_grads_in_autograd = torch_at_least(FSDP2_GRAD_DTYPE_FROM)
    for i, batch in enumerate(batches):
        total, loss_sum = None, 0.0
        for r in range(ws):
            low = copy.deepcopy(model).to(dtype)
            if fp32_grads_in_autograd:
                for q in low.parameters():
                    q.grad_dtype = torch.float32
            local = _local(batch, ws, r, ctx.device)
            loss = loss_fn(low(local), local)
            loss.backward()
            loss_sum += float(loss.detach().cpu())
            grads = [q.grad.float() for q in low.parameters()]
            total = grads if total is None else [a + b for a, b in zip(total, grads, strict=True)]
        for p, g in zip(model.parameters(), total, strict=True):
            p.grad = g / ws
        if i == 0:
            first_grads = {n: _full(p.grad) for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss_sum / ws)
    return Run(model, losses, first_grads)


@check
def fsdp2_mixed_precision(ctx):
    """fully_shard with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): the
    forward sees bf16 parameters, the sharded parameters and their gradients stay fp32, and
    2 AdamW steps equal an equivalently cast single-device run (bf16 forward/backward per
    data-parallel slice, gradients cast to fp32 and averaged in fp32) within TOL: a reduction
    done in bf16 would miss by bf16 rounding, ~1e-3 (torch.distributed.fsdp.MixedPrecisionPolicy)."""
    ws = ctx.world_size
    batches = _batches(ws)
    model = _fsdp(_model(ctx), ctx.mesh((ws,)),
                  mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    seen = []
    model.layers[0].attention.wq.register_forward_pre_hook(lambda m, args: seen.append(m.weight.dtype))
    run = _train(model, _adamw(model.parameters()), batches, ws, ctx.rank, ctx.device)
    assert seen and set(seen) == {torch.bfloat16}, f"the forward saw parameters of dtype {set(seen)}"
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32, f"sharded {name} is {param.dtype}"
        assert run.first_grads[name].dtype == torch.float32, f"gradient of {name} is {run.first_grads[name].dtype}"
    _assert_matches(run, _cast_reference(ctx, batches, torch.bfloat16), "FSDP2 bf16/fp32")


@check
def fsdp2_grad_accumulation(ctx):
    """set_requires_gradient_sync(False) for the first two of three micro-batches: no sharded
    gradient exists until the last micro-batch synchronises, then the accumulated gradients and
    2 AdamW steps equal one device accumulating the same micro-batches
    (torch.distributed.fsdp.FSDPModule.set_requires_gradient_sync)."""
    ws, micro = ctx.world_size, 3
    batches = _batches(ws, steps=2 * micro)
    ref_model = _model(ctx)
    ref_opt = _adamw(ref_model.parameters())
    model = _fsdp(_model(ctx), ctx.mesh((ws,)))
    opt = _adamw(model.parameters())
    for step in range(2):
        group = batches[step * micro:(step + 1) * micro]
        for i, batch in enumerate(group):
            last = i == micro - 1
            model.set_requires_gradient_sync(last)
            local = _local(batch, ws, ctx.rank, ctx.device)
            (loss_fn(model(local), local) / micro).backward()
            full = batch.to(ctx.device)
            (loss_fn(ref_model(full), full) / micro).backward()
            if not last:
                unsynced = [n for n, p in model.named_parameters() if p.grad is not None]
                assert not unsynced, f"micro-batch {i} without sync produced sharded gradients for {unsynced}"
        for name, ref_param in ref_model.named_parameters():
            assert_close(_full(model.get_parameter(name).grad), ref_param.grad,
                         f"accumulated gradient of {name}, step {step}", **TOL)
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    for name, ref_param in ref_model.named_parameters():
        assert_close(_full(model.get_parameter(name)), ref_param, f"parameter {name}", **TOL)


def _pending_all_gather(module) -> bool:
    """Whether FSDP2 has issued ``module``'s parameter all-gather and not yet waited for it."""
    return module._get_fsdp_state()._fsdp_param_group._all_gather_result is not None


@check
def fsdp2_prefetch(ctx):
    """Explicit prefetching: with set_modules_to_forward_prefetch (block i -> block i+1) the next
    block's all-gather is already issued while a block runs its forward, with
    set_modules_to_backward_prefetch (block i -> block i-1) the same in backward, and 2 AdamW
    steps still equal one device (torch.distributed.fsdp.FSDPModule.set_modules_to_forward_prefetch,
    set_modules_to_backward_prefetch)."""
    ws = ctx.world_size
    batches = _batches(ws)
    model = _fsdp(_model(ctx), ctx.mesh((ws,)))
    first, second = model.layers
    first.set_modules_to_forward_prefetch([second])
    second.set_modules_to_backward_prefetch([first])
    seen = {"forward": [], "backward": []}
    first.feed_forward.register_forward_pre_hook(
        lambda m, args: seen["forward"].append(_pending_all_gather(second)))
    second.attention.register_full_backward_pre_hook(
        lambda m, grad: seen["backward"].append(_pending_all_gather(first)))
    run = _train(model, _adamw(model.parameters()), batches, ws, ctx.rank, ctx.device)
    for phase, pending in seen.items():
        assert pending and all(pending), f"{phase}: the prefetched block's all-gather was pending {pending}"
    _assert_matches(run, _reference(ctx, batches), "FSDP2 with explicit prefetch")


@check
def fsdp2_cpu_offload(ctx):
    """fully_shard with CPUOffloadPolicy (pinned memory on an accelerator): the sharded
    parameters and the AdamW state live on the CPU, the forward computes on the device (its
    output is a device tensor), and 2 steps equal one device (torch.distributed.fsdp.CPUOffloadPolicy)."""
    ws = ctx.world_size
    batches = _batches(ws)
    pin = ctx.device_type != "cpu"
    model = _fsdp(_model(ctx), ctx.mesh((ws,)), offload_policy=CPUOffloadPolicy(pin_memory=pin))
    outputs = []
    model.output.register_forward_hook(lambda m, args, out: outputs.append(out.device))
    opt = _adamw(model.parameters())
    run = _train(model, opt, batches[:1], ws, ctx.rank, ctx.device)
    for name, param in model.named_parameters():
        assert param.to_local().device.type == "cpu", f"sharded {name} on {param.to_local().device}"
        for key, value in opt.state[param].items():
            local = value.to_local() if isinstance(value, DTensor) else value
            assert local.device.type == "cpu", f"optimizer {key} of {name} on {local.device}"
    assert outputs == [ctx.device], f"forward computed on {outputs}, expected {ctx.device}"
    rest = _train(model, opt, batches[1:], ws, ctx.rank, ctx.device)
    run = Run(model, run.losses + rest.losses, run.first_grads)
    _assert_matches(run, _reference(ctx, batches), "FSDP2 with CPU offload")


@check
def fsdp2_ops(ctx):
    """The device kernels FSDP2 calls give bitwise the CPU results on device tensors:
    torch.ops.fsdp.all_gather_copy_in (this rank's inputs copied into its slot of the all-gather
    buffer; the returned input is a view of that buffer), torch.ops.fsdp.split_with_sizes_copy
    (dim 1, out= views) and torch.ops.fsdp.chunk_cat; and the average FSDP2 asks of the
    collective library: reduce_scatter_single and all_reduce (HSDP's replicate dim) with
    ReduceOp.AVG, exact on small integers (torch.distributed.fsdp._fully_shard._fsdp_collectives)."""
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (defines torch.ops.fsdp)

    ws, dev = ctx.world_size, ctx.device
    sizes = [6, 3, 7]
    inputs = [host_tensor((n,), 40 + i) for i, n in enumerate(sizes)]
    numel = sum(sizes)
    out = torch.zeros(numel * ws, device=dev)
    copied_in, buffer = torch.ops.fsdp.all_gather_copy_in(
        [t.to(dev) for t in inputs], out, sizes, numel, ctx.rank)
    assert buffer.data_ptr() == out.data_ptr(), "all_gather_copy_in returned another output buffer"
    assert copied_in.data_ptr() == out.data_ptr() + numel * ctx.rank * out.element_size(), (
        "all_gather_copy_in's input is not this rank's slot of the output buffer")
    expected = torch.zeros(numel * ws)
    expected[numel * ctx.rank:numel * (ctx.rank + 1)] = torch.cat(inputs)
    assert_equal(out, expected, "all_gather_copy_in buffer")

    gathered = host_tensor((ws, numel), 44)
    outs = [torch.empty(ws, n, device=dev) for n in sizes]
    torch.ops.fsdp.split_with_sizes_copy(gathered.to(dev), sizes, dim=1, out=outs)
    for got, want in zip(outs, torch.split(gathered, sizes, dim=1), strict=True):
        assert_equal(got, want, "split_with_sizes_copy output")

    grads = [host_tensor((ws * 2, 3), 45), host_tensor((ws, 5), 46)]
    cat = torch.empty(ws, 11, device=dev)
    torch.ops.fsdp.chunk_cat([g.to(dev) for g in grads], 0, ws, out=cat)
    assert_equal(cat, torch._chunk_cat(grads, 0, ws), "chunk_cat output")

    # Small integers times ws: every sum and every division by ws (a power of two) is exact.
    full = [host_tensor((ws * 4,), 47 + r, low=-8, high=9) * ws for r in range(ws)]
    total = torch.stack(full).sum(0)
    shard = torch.empty(4, device=dev)
    dist.reduce_scatter_single(shard, full[ctx.rank].to(dev), op=dist.ReduceOp.AVG)
    assert_equal(shard, (total / ws).chunk(ws)[ctx.rank], "reduce_scatter_single AVG")
    avg = full[ctx.rank].to(dev)
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    assert_equal(avg, total / ws, "all_reduce AVG")


@check(covers=("reduce_scatter_single(op=PREMUL_SUM)",))
def fsdp2_divide_factor(ctx):
    """FSDP2 with set_gradient_divide_factor(2 x world size) reduce-scatters its gradients with
    ReduceOp.PREMUL_SUM(1/factor): the first step's gradients are half the single-device ones
    (within TOL), after a bitwise-exact reduce_scatter_single with PREMUL_SUM(1/ws) of small
    integers on device tensors. gloo, torch's CPU library, refuses PREMUL_SUM: SKIP there with
    its error (torch.distributed.fsdp.FSDPModule.set_gradient_divide_factor, dist._make_nccl_premul_sum)."""
    ws = ctx.world_size
    full = [host_tensor((ws * 4,), 48 + r, low=-8, high=9) * ws for r in range(ws)]
    shard = torch.empty(4, device=ctx.device)
    try:
        dist.reduce_scatter_single(shard, full[ctx.rank].to(ctx.device), op=dist._make_nccl_premul_sum(1.0 / ws))
    except RuntimeError as exc:
        if ctx.spec.collective_backend == "gloo" and "Cannot use ReduceOp.PREMUL_SUM" in str(exc):
            ctx.skip(f"unsupported by torch's gloo: {exc}")
        raise
    assert_equal(shard, (torch.stack(full).sum(0) / ws).chunk(ws)[ctx.rank], "reduce_scatter_single PREMUL_SUM(1/ws)")
    batches = _batches(ws, steps=1)
    model = _fsdp(_model(ctx), ctx.mesh((ws,)))
    for module in (*model.layers, model):
        module.set_gradient_divide_factor(2.0 * ws)
    run = _train(model, _adamw(model.parameters()), batches, ws, ctx.rank, ctx.device)
    for name, grad in _reference(ctx, batches).first_grads.items():
        assert_close(run.first_grads[name], grad / 2, f"gradient of {name} with divide factor {2 * ws}", **TOL)


@check
def hsdp_2d(ctx):
    """HSDP: fully_shard on a 2-D (replicate, shard) mesh gives (Replicate(), Shard(0))
    parameters on that mesh, both dimension groups run the device's collective library, and 3
    AdamW steps over all ranks' data equal one device (reduce-scatter in the shard dim, then
    all-reduce in the replicate dim) (torch.distributed.fsdp.fully_shard with a 2-D DeviceMesh)."""
    ws = ctx.world_size
    mesh = ctx.mesh((2, ws // 2), ("replicate", "shard"))
    batches = _batches(ws)
    model = _fsdp(_model(ctx), mesh)
    for name, param in model.named_parameters():
        assert param.device_mesh == mesh and param.placements == (Replicate(), Shard(0)), (
            f"{name}: {param.placements} on {param.device_mesh}")
    _assert_device_backend(ctx, mesh, "HSDP")
    run = _train(model, _adamw(model.parameters()), batches, ws, ctx.rank, ctx.device)
    _assert_matches(run, _reference(ctx, batches), "HSDP")


def _fsdp_tp(ctx, mesh, seed: int = 1, cfg: Config = CFG):
    """The model with TP on mesh["tp"] (mesh from ``with mesh["tp"]:``, PR 134247) and FSDP2 on
    mesh["dp"]; its parameters end up as 2-D DTensors on ``mesh``."""
    model = _model(ctx, seed, cfg)
    with mesh["tp"]:
        parallelize_module(model, parallelize_plan=tp_plan(model))
    return _fsdp(model, mesh["dp"])


@check
def fsdp2_tp_2d(ctx):
    """FSDP2 x TP on a (dp, tp) mesh: TP through parallelize_module with the mesh taken from
    ``with mesh["tp"]:``, then fully_shard on mesh["dp"]; every parameter TP touched is a DTensor on the
    2-D mesh, sharded on dim 0 over dp (strided where TP shards dim 0 too) and by its TP style
    over tp, the others (norms) are Shard(0) on mesh["dp"], and 2 AdamW steps equal
    one device (torch.distributed.fsdp.fully_shard, torch.distributed.tensor.parallel, PR 134247)."""
    mesh = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    batches = _batches(2)
    model = _fsdp_tp(ctx, mesh)
    tp_modules = set(tp_plan(model))
    for name, param in model.named_parameters():
        dp_placement = param.placements[0]
        assert isinstance(dp_placement, (Shard, _StridedShard)) and dp_placement.dim == 0, (
            f"{name}: {param.placements}")
        expected_mesh = mesh if name.rsplit(".", 1)[0] in tp_modules else mesh["dp"]
        assert param.device_mesh == expected_mesh, f"{name} on {param.device_mesh}, expected {expected_mesh}"
    for name, tp_placement in (("attention.wq", Shard(0)), ("attention.wo", Shard(1))):
        placements = model.layers[0].get_parameter(f"{name}.weight").placements
        assert placements[1] == tp_placement, f"layers.0.{name}.weight: {placements}"
    _assert_device_backend(ctx, mesh, "FSDP2 x TP")
    dp_rank = mesh.get_local_rank("dp")
    run = _train(model, _adamw(model.parameters()), batches, 2, dp_rank, ctx.device, mesh["dp"].get_group())
    _assert_matches(run, _reference(ctx, batches), "FSDP2 x TP")


def _rng_state(ctx) -> torch.Tensor:
    """The generator state of this rank's device (the CPU generator on cpu)."""
    if ctx.device_type == "cpu":
        return torch.get_rng_state()
    return getattr(torch, ctx.device_type).get_rng_state(ctx.device)


def _checkpoint_layers(model, use_reentrant: bool) -> None:
    """Run every block under torch.utils.checkpoint.checkpoint (parameter names unchanged)."""
    from torch.utils.checkpoint import checkpoint

    for layer in model.layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=use_reentrant)


def _dropout_run(ctx, seed: int, use_reentrant: bool | None) -> dict:
    """Loss, gradients and the device generator's state after one forward and backward of the
    model with dropout 0.25 in every block, checkpointed per block unless ``use_reentrant`` is
    None."""
    model = _model(ctx, cfg=Config(dropout=0.25))
    if use_reentrant is not None:
        _checkpoint_layers(model, use_reentrant)
    torch.manual_seed(seed)
    batch = tokens(PER_RANK, SEQ, 30).to(ctx.device)
    loss = loss_fn(model(batch), batch)
    loss.backward()
    return {"loss": loss.detach().cpu(), "state": _rng_state(ctx).cpu(),
            "grads": {n: p.grad.detach().cpu() for n, p in model.named_parameters()}}


@check
def activation_checkpoint_rng(ctx):
    """torch.utils.checkpoint.checkpoint around each block of a model with dropout, on the
    device, with use_reentrant True and False: the recompute in backward replays the forward's
    dropout masks (preserve_rng_state saves and restores the device generator through the
    device module's get_rng_state/set_rng_state), so loss and every gradient are bitwise the
    run without checkpointing, and the generator ends where that run's ends; another seed gives
    another loss (the masks do come from the device generator) (torch.utils.checkpoint)."""
    plain = _dropout_run(ctx, 31, None)
    other = _dropout_run(ctx, 32, None)
    assert not torch.equal(plain["loss"], other["loss"]), "dropout gave the same loss at two seeds"
    for use_reentrant in (True, False):
        what = f"checkpoint(use_reentrant={use_reentrant})"
        run = _dropout_run(ctx, 31, use_reentrant)
        assert_equal(run["loss"], plain["loss"], f"{what}: loss")
        for name, grad in plain["grads"].items():
            assert_equal(run["grads"][name], grad, f"{what}: gradient of {name} (recomputed dropout mask)")
        assert_equal(run["state"], plain["state"], f"{what}: device generator state after backward")


@check(requires=("rng-tracker",))
def activation_checkpoint_dtensor_rng(ctx):
    """torch.utils.checkpoint.checkpoint around dropout on a Shard(0) DTensor activation, under
    DTensor's OffsetBasedRNGTracker, with use_reentrant True and False: the recompute replays
    each shard's mask (the restored device state gives the tracker the same offsets), so the
    gradients of the input and the replicated weight are bitwise the run without
    checkpointing, and the generator's (seed, offset) ends where that run's ends
    (torch.utils.checkpoint, torch.distributed.tensor._random, PR 103235)."""
    from torch.distributed.tensor import _random
    from torch.utils.checkpoint import checkpoint

    mesh = ctx.mesh((ctx.world_size,))
    x_host, w_host = host_tensor((2 * ctx.world_size, 16), 33), host_tensor((16, 16), 34) * 0.3

    def region(x, w):
        return torch.nn.functional.dropout(torch.tanh(x @ w), p=0.5, training=True)

    def run(use_reentrant):
        torch.manual_seed(35)
        _random._rng_tracker = _random.OffsetBasedRNGTracker(mesh, run_state_sync=False)
        x = DTensor.from_local(x_host.chunk(ctx.world_size)[ctx.rank].to(ctx.device), mesh, [Shard(0)])
        x.requires_grad_()
        w = DTensor.from_local(w_host.to(ctx.device), mesh, [Replicate()]).detach().requires_grad_()
        out = region(x, w) if use_reentrant is None else checkpoint(region, x, w, use_reentrant=use_reentrant)
        out.pow(2).sum().backward()
        return {"out": out.full_tensor().cpu(), "x": x.grad.full_tensor().cpu(),
                "w": w.grad.full_tensor().cpu(), "state": _rng_state(ctx).cpu()}

    plain = run(None)
    assert plain["out"].count_nonzero() < plain["out"].numel(), "dropout dropped nothing"
    for use_reentrant in (True, False):
        got = run(use_reentrant)
        for key, what in (("out", "output"), ("x", "input gradient"), ("w", "weight gradient"),
                          ("state", "generator state")):
            assert_equal(got[key], plain[key], f"checkpoint(use_reentrant={use_reentrant}): {what}")


def _state(model, opt) -> dict[str, torch.Tensor]:
    """Every parameter and every optimizer-state tensor of ``model``/``opt`` as full host
    tensors, by name (``param.<fqn>``, ``optim.<fqn>.<key>``)."""
    out = {f"param.{n}": _full(p) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        for key, value in opt.state[p].items():
            out[f"optim.{n}.{key}"] = _full(value) if isinstance(value, torch.Tensor) else torch.tensor(value)
    return out


def _assert_state_equal(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), f"{what}: {sorted(set(got) ^ set(want))} missing on one side"
    for key, value in want.items():
        assert_equal(got[key], value, f"{what}: {key}")


def _save(model, opt, path) -> None:
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)


def _load(model, opt, path) -> None:
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _resume(ctx, build, batches, dp, dp_rank, dp_group, path):
    """Train ``build(1)`` on ``batches`` uninterrupted, and again for one step, saved with
    dcp.save, loaded into ``build(2)`` (initialised from another seed) and continued.
    Returns (uninterrupted run, its state, resumed run, resumed state, state saved, state loaded)."""
    model = build(1)
    opt = _adamw(model.parameters())
    whole = _train(model, opt, batches, dp, dp_rank, ctx.device, dp_group)
    first = build(1)
    first_opt = _adamw(first.parameters())
    head = _train(first, first_opt, batches[:1], dp, dp_rank, ctx.device, dp_group)
    saved = _state(first, first_opt)
    _save(first, first_opt, path)
    fresh = build(2)
    fresh_opt = _adamw(fresh.parameters())
    _load(fresh, fresh_opt, path)
    loaded = _state(fresh, fresh_opt)
    tail = _train(fresh, fresh_opt, batches[1:], dp, dp_rank, ctx.device, dp_group)
    resumed = Run(fresh, head.losses + tail.losses, head.first_grads)
    return whole, _state(model, opt), resumed, _state(fresh, fresh_opt), saved, loaded


@check
def resume(ctx):
    """FSDP2 training resumed from a distributed checkpoint equals the uninterrupted run
    bitwise: one AdamW step, get_state_dict + dcp.save of model and optimizer, dcp.load +
    set_state_dict into a model initialised differently, one more step. Every parameter and
    optimizer-state tensor (exp_avg, exp_avg_sq, step) is compared after loading and at the
    end, the losses too; the uninterrupted run equals one device within TOL
    (torch.distributed.checkpoint, torch.distributed.checkpoint.state_dict, fully_shard)."""
    ws = ctx.world_size
    mesh = ctx.mesh((ws,))
    batches = _batches(ws)
    with shared_tmpdir() as tmp:
        whole, whole_state, resumed, resumed_state, saved, loaded = _resume(
            ctx, lambda seed: _fsdp(_model(ctx, seed), mesh), batches, ws, ctx.rank, None,
            os.path.join(tmp, "ckpt"))
    _assert_state_equal(loaded, saved, "FSDP2 state loaded from the checkpoint")
    _assert_state_equal(resumed_state, whole_state, "FSDP2 resumed vs uninterrupted")
    assert_equal(torch.tensor(resumed.losses), torch.tensor(whole.losses), "losses resumed vs uninterrupted")
    _assert_matches(whole, _reference(ctx, batches), "FSDP2 uninterrupted run")


@check
def resume_2d(ctx):
    """FSDP2 x TP training on a (dp, tp) mesh resumed from a distributed checkpoint equals the
    uninterrupted run bitwise (every parameter and optimizer-state tensor, the losses), which
    equals one device within TOL, and the same checkpoint loads into plain FSDP2 over all ranks (another mesh shape): every tensor
    arrives bitwise, and one more step there equals the 2-D run within TOL
    (torch.distributed.checkpoint resharding on load, fully_shard, parallelize_module)."""
    ws = ctx.world_size
    mesh = ctx.mesh((2, ws // 2), ("dp", "tp"))
    flat = ctx.mesh((ws,))
    batches = _batches(2)
    dp_rank, dp_group = mesh.get_local_rank("dp"), mesh["dp"].get_group()
    with shared_tmpdir() as tmp:
        path = os.path.join(tmp, "ckpt")
        whole, whole_state, resumed, resumed_state, saved, loaded = _resume(
            ctx, lambda seed: _fsdp_tp(ctx, mesh, seed), batches, 2, dp_rank, dp_group, path)
        _assert_state_equal(loaded, saved, "FSDP2 x TP state loaded from the checkpoint")
        _assert_state_equal(resumed_state, whole_state, "FSDP2 x TP resumed vs uninterrupted")
        assert_equal(torch.tensor(resumed.losses), torch.tensor(whole.losses), "losses resumed vs uninterrupted")
        _assert_matches(whole, _reference(ctx, batches), "FSDP2 x TP uninterrupted run")
        other = _fsdp(_model(ctx, 2), flat)
        other_opt = _adamw(other.parameters())
        _load(other, other_opt, path)
    _assert_state_equal(_state(other, other_opt), saved, "FSDP2 x TP checkpoint loaded into 1-D FSDP2")
    tail = _train(other, other_opt, batches[1:], 2, dp_rank, ctx.device, dp_group)
    assert_close(torch.tensor(tail.losses), torch.tensor(whole.losses[1:]), "losses after loading into 1-D FSDP2",
                 **TOL)
    named = dict(whole.model.named_parameters())
    for name, param in other.named_parameters():
        assert_close(_full(param), _full(named[name]), f"{name} after loading into 1-D FSDP2", **TOL)


#: The fused attention ops F.scaled_dot_product_attention may dispatch to, by the
#: torch.nn.attention.SDPBackend value torch._fused_sdp_choice answers for them.
_FUSED_SDPA = {
    "_scaled_dot_product_flash_attention": 1, "_scaled_dot_product_flash_attention_for_cpu": 1,
    "_scaled_dot_product_efficient_attention": 2, "_scaled_dot_product_cudnn_attention": 3,
    "_scaled_dot_product_fused_attention_overrideable": 4,
}


def _sdpa_taken(q, k, v) -> tuple[int, torch.Tensor, str | None]:
    """The SDPBackend value of the path F.scaled_dot_product_attention(causal) takes on these
    tensors (math when it dispatches to no fused op), its output and the fused op's name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    with Record() as rec:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    fused = [op for op in rec.ops if op in _FUSED_SDPA]
    return (_FUSED_SDPA[fused[0]] if fused else 0), out, (fused[0] if fused else None)


#: One block with 8 heads of 2 (every world size up to 8 gets whole heads).
ATTENTION = Config(layers=1, heads=8)


def _heads(ctx, seed: int) -> torch.Tensor:
    """A (batch 2, heads 8, seq 8, head dim 2) host tensor."""
    return host_tensor((2, ATTENTION.heads, SEQ, ATTENTION.dim // ATTENTION.heads), seed)


@check
def sdpa_choice(ctx):
    """torch._fused_sdp_choice answers, for device tensors, the SDPBackend that
    F.scaled_dot_product_attention actually takes there (the fused op it dispatches to, or math
    when it decomposes), and that path's causal attention equals the explicit
    softmax(q k^T / sqrt(d) + mask) v within TOL (torch.nn.functional.scaled_dot_product_attention).
    A device without fused attention must answer math (0); answering what the CPU would do
    misleads code that picks a layout or a sharding rule from the answer."""
    q, k, v = (_heads(ctx, 50 + i).to(ctx.device) for i in range(3))
    taken, out, _ = _sdpa_taken(q, k, v)
    choice = int(torch._fused_sdp_choice(q, k, v, is_causal=True))
    from torch.nn.attention import SDPBackend

    names = {int(b.value): b.name for b in SDPBackend.__members__.values()}
    assert choice == taken, (f"torch._fused_sdp_choice answers {names.get(choice, choice)} on "
                             f"{ctx.device_type}, but scaled_dot_product_attention takes {names[taken]}")
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    future = torch.ones_like(scores, dtype=torch.bool).triu(1)
    assert_close(out, scores.masked_fill(future, float("-inf")).softmax(-1) @ v, "causal SDPA", **TOL)


def _tp_attention_run(ctx, sdpa: bool, local_heads: bool) -> None:
    """One TP block (heads split over all ranks) forward and backward equal one device."""
    cfg = dataclasses.replace(ATTENTION, sdpa=sdpa)
    mesh = ctx.mesh((ctx.world_size,))
    ref = _model(ctx, cfg=cfg)
    model = _model(ctx, cfg=cfg)
    parallelize_module(model, mesh, tp_plan(model, local_heads=local_heads))
    batch = tokens(PER_RANK, SEQ, 60).to(ctx.device)
    what = f"TP attention ({'SDPA' if sdpa else 'explicit'}, {'local' if local_heads else 'DTensor'} heads)"
    loss, ref_loss = loss_fn(model(batch), batch), loss_fn(ref(batch), batch)
    assert_close(loss, ref_loss, f"{what}: loss", **TOL)
    loss.backward()
    ref_loss.backward()
    for name, param in ref.named_parameters():
        assert_close(_full(model.get_parameter(name).grad), param.grad, f"{what}: gradient of {name}", **TOL)


@check
def tp_attention(ctx):
    """Tensor-parallel attention that works on any device: heads split over the ranks by
    Colwise wq/wk/wv, either as DTensors with explicit softmax(q k^T / sqrt(d)) v attention
    (every op has a DTensor sharding rule) or as each rank's local heads with
    F.scaled_dot_product_attention; loss and gradients equal one device
    (torch.distributed.tensor.parallel.ColwiseParallel use_local_output)."""
    _tp_attention_run(ctx, sdpa=False, local_heads=False)
    _tp_attention_run(ctx, sdpa=True, local_heads=True)


#: How torch 2.13 fails SDPA on DTensor heads where it has no sharding rule for the path taken.
_SDPA_DTENSOR_LIMITS = ("got mixed torch.Tensor and DTensor", "does not have a sharding strategy registered")


@check
def tp_attention_sdpa(ctx):
    """F.scaled_dot_product_attention on DTensor heads (Colwise wq/wk/wv with
    use_local_output=False, as torch's own TP test Transformer) in a TP block equals one device.
    torch 2.13 has DTensor sharding rules only for the fused flash/efficient/cudnn attention
    ops: where SDPA takes another path (math on a PrivateUse1 device without fused attention,
    the CPU flash kernel on cpu) it fails, and the check SKIPs with torch's error as a torch
    limitation (torch.distributed.tensor._ops._matrix_ops; training.tp_attention shows what
    works instead)."""
    mesh = ctx.mesh((ctx.world_size,))
    from torch.distributed.tensor import distribute_tensor
    from torch.nn.attention import SDPBackend

    local = [_heads(ctx, 50 + i).to(ctx.device) for i in range(3)]
    taken, _, _ = _sdpa_taken(*local)
    heads = [distribute_tensor(t, mesh, [Shard(1)]) for t in local]
    try:
        torch.nn.functional.scaled_dot_product_attention(*heads, is_causal=True)
    except (RuntimeError, NotImplementedError) as exc:
        message = str(exc).splitlines()[0]
        if not any(limit in message for limit in _SDPA_DTENSOR_LIMITS):
            raise
        path = SDPBackend(taken).name
        ctx.skip(f"unsupported by torch {torch.__version__.split('+')[0]}: causal scaled_dot_product_attention "
                 f"on DTensor heads takes the {path} path on {ctx.device_type}, for which DTensor "
                 f"has no sharding rule: {message[:160]}")
    _tp_attention_run(ctx, sdpa=True, local_heads=False)


#: The fused attention ops context parallelism shards (ring attention).
_CP_SHARDED = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention")


@check
def context_parallel(ctx):
    """Context parallelism (torch.distributed.tensor.experimental.context_parallel): causal
    F.scaled_dot_product_attention inside the context, on q, k, v sharded along the sequence
    over the ranks (load-balanced), equals one device's attention within TOL once unsharded
    (context_parallel_unshard), forward and the gradients of q, k and v. torch shards only the
    fused flash, memory-efficient and cuDNN attention ops (ring attention,
    ``_context_parallel/_attention.py``); where SDPA takes another path on the device, torch
    refuses (or DTensor does, on the math path's mixed operands), and the check SKIPs with
    torch's error and the path taken; an error where SDPA takes a sharded op fails."""
    from torch.distributed.tensor.experimental import context_parallel as cp_context
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    from torch.nn.attention import SDPBackend

    mesh = ctx.mesh((ctx.world_size,), ("cp",))
    seq = 4 * ctx.world_size  # two chunks per rank: the head-tail load balancer's layout
    full = [host_tensor((2, 4, seq, 8), 60 + i).to(ctx.device) for i in range(3)]
    taken, expected, op = _sdpa_taken(*full)
    ref = [t.clone().requires_grad_() for t in full]
    torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True).sum().backward()
    q, k, v = (t.clone() for t in full)
    try:
        with cp_context(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
            out.sum().backward()
    except (NotImplementedError, RuntimeError) as exc:
        if op in _CP_SHARDED:
            raise
        ctx.skip(f"unsupported by torch {torch.__version__.split('+')[0]}: context_parallel shards "
                 f"only the fused flash, memory-efficient and cuDNN attention ops, and causal "
                 f"scaled_dot_product_attention takes the {SDPBackend(taken).name} path on "
                 f"{ctx.device_type}: {str(exc).splitlines()[0][:160]}")
    got = context_parallel_unshard(mesh, [out.detach(), *(t.grad for t in leaves)], [2, 2, 2, 2])
    assert_close(got[0], expected, "context-parallel attention", **TOL)
    for name, grad, r in zip("qkv", got[1:], ref, strict=True):
        assert_close(grad, r.grad, f"context-parallel d{name}", **TOL)
