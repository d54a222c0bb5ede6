"""Pipeline parallelism on the backend's device (torch.distributed.pipelining): the
point-to-point traffic between stages on the backend's own collective library (tags, batched
isend/irecv), the schedules torch ships, a model split by ``pipeline()``, and pipelining
composed with FSDP2, with tensor parallelism and with both (a 3-D run that checkpoints and
resumes).

Every schedule check trains a stack of residual MLP blocks (``x + w2(tanh(w1(x)))``) split into
stages, each stage on its rank's own device, for ``STEPS`` SGD steps of ``MICROBATCHES``
micro-batches (one per stage where the stages are more), and compares the loss, every stage's gradients and the parameters after the
step with the same model trained on one device (this rank's device, no process group) on the
whole batch. The schedules scale gradients by the number of micro-batches (``scale_grads``),
so the pipeline's gradients are those of the whole batch's mean loss; they differ from the
single device's only in summation order, hence ``TOL``.

Sources: torch.distributed.pipelining (``PipelineStage``, ``schedules.py``, ``pipeline`` and
``pipe_split`` in ``_IR.py``), torch.distributed.batch_isend_irecv, torchtitan's 3-D recipe
(pipeline stages whose modules are tensor-parallel and FSDP2-sharded).
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import (
    ALSO_AT,
    assert_close,
    assert_equal,
    assert_on_device,
    host_tensor,
    shared_tmpdir,
)
from torch import nn
from torch.distributed import pipelining
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, any_world_size=True)

#: Feature and hidden width of a block, the batch, its micro-batches and the SGD steps.
DIM, HIDDEN, BATCH, MICROBATCHES, STEPS, LR = 8, 16, 16, 8, 2, 0.1
#: Tolerance of a pipelined result against one device (summation order only).
TOL = {"rtol": 1e-4, "atol": 1e-6}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN)
        self.w2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.tanh(self.w1(x)))


class Stack(nn.Module):
    """Blocks named by their index in the whole model, so a stage's parameter names (and its
    checkpoint keys) are the whole model's."""

    def __init__(self, blocks: dict[int, Block]) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({str(i): b for i, b in blocks.items()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x


def whole_model(n_blocks: int, seed: int = 0) -> Stack:
    """The model every rank builds identically (CPU, from ``seed``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Stack({i: Block() for i in range(n_blocks)})


def stage_module(model: Stack, stage: int, n_stages: int) -> Stack:
    """A copy of stage ``stage``'s blocks (an even share, in order)."""
    per = len(model.blocks) // n_stages
    return copy.deepcopy(Stack({i: model.blocks[str(i)] for i in range(stage * per, (stage + 1) * per)}))


def batch(step: int, rows: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs and targets (CPU, the same on every rank)."""
    return host_tensor((rows, DIM), 100 + step), host_tensor((rows, DIM), 200 + step)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def _host(t: torch.Tensor) -> torch.Tensor:
    """A host copy (never the tensor itself: on the cpu backend ``.cpu()`` would alias a
    parameter the next step updates)."""
    return t.detach().to("cpu", copy=True)


class Reference:
    """The whole model trained on this rank's device alone: per step, the loss, the output,
    the gradients (by parameter name) and the parameters after the step."""

    def __init__(self, ctx, model: Stack, steps: int = STEPS, halves: int = 1, rows: int = BATCH) -> None:
        ref = copy.deepcopy(model).to(ctx.device)
        opt = torch.optim.SGD(ref.parameters(), lr=LR)
        self.losses, self.outputs, self.grads, self.params = [], [], [], []
        #: per step, the loss of each of ``halves`` equal slices of the batch (a data-parallel
        #: replica's share), before the step
        self.part_losses = []
        for step in range(steps):
            x, y = (t.to(ctx.device) for t in batch(step, rows))
            with torch.no_grad():
                self.part_losses.append([loss_fn(ref(xs), ys).cpu() for xs, ys in
                                         zip(x.chunk(halves), y.chunk(halves), strict=True)])
            out = ref(x)
            loss = loss_fn(out, y)
            loss.backward()
            self.losses.append(loss.detach().cpu())
            self.outputs.append(out.detach().cpu())
            self.grads.append({n: _host(p.grad) for n, p in ref.named_parameters()})
            opt.step()
            opt.zero_grad()
            self.params.append({n: _host(p) for n, p in ref.named_parameters()})


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def compare_stage(ctx, module: nn.Module, expected: dict[str, torch.Tensor], what: str) -> None:
    """Every parameter (or gradient, per ``what``) of a stage module equals the whole model's
    entry of the same name, and lives on this rank's device."""
    for name, param in module.named_parameters():
        value = param.grad if what == "gradient" else param
        assert value is not None, f"{name}: no {what} on this stage"
        assert_on_device(ctx, _full(value), f"{name} {what}")
        assert_close(_full(value), expected[name], f"{name} {what}", **TOL)


def train_stages(ctx, schedule_cls, stage_ids: list[int], n_stages: int, *, group=None,
                 modules: list[nn.Module] | None = None, model: Stack | None = None,
                 replicas: int = 1, replica: int = 0) -> None:
    """Train this rank's stages ``stage_ids`` of ``n_stages`` under ``schedule_cls`` for
    ``STEPS`` steps (``group``: the pipeline's ranks, default all) and compare each step with
    the whole model on one device. ``modules``: the stages' modules when already
    parallelized; ``replicas``: data-parallel copies of the pipeline, each taking its slice
    (``replica``) of the batch."""
    # DualPipeV needs a micro-batch per stage: more stages (ranks) than MICROBATCHES, a larger batch
    microbatches = max(MICROBATCHES, n_stages)
    per = BATCH * microbatches // MICROBATCHES
    total = per * replicas
    rows = slice(replica * per, (replica + 1) * per)
    model = model or whole_model(n_stages)
    reference = Reference(ctx, model, halves=replicas, rows=total)
    modules = modules or [stage_module(model, s, n_stages).to(ctx.device) for s in stage_ids]
    stages = [pipelining.PipelineStage(m, s, n_stages, ctx.device, group=group)
              for m, s in zip(modules, stage_ids, strict=True)]
    multi = issubclass(schedule_cls, pipelining.schedules.PipelineScheduleMulti)
    schedule = schedule_cls(stages if multi else stages[0], n_microbatches=microbatches,
                            loss_fn=loss_fn)
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=LR)
    first, last = 0 in stage_ids, n_stages - 1 in stage_ids
    for step in range(STEPS):
        x, y = (t[rows].to(ctx.device) for t in batch(step, total))
        losses: list[torch.Tensor] = []
        out = schedule.step(*((x,) if first else ()), target=y if last else None,
                            losses=losses if last else None)
        if last:
            assert len(losses) == microbatches, f"{len(losses)} micro-batch losses, expected {microbatches}"
            loss = torch.stack([t.detach() for t in losses]).mean()
            assert_on_device(ctx, loss, f"step {step} loss")
            assert_close(loss, reference.part_losses[step][replica], f"step {step} loss", **TOL)
            if out is not None and replicas == 1:
                assert_close(out, reference.outputs[step], f"step {step} output", **TOL)
        for module in modules:
            compare_stage(ctx, module, reference.grads[step], "gradient")
        opt.step()
        opt.zero_grad()
        for module in modules:
            compare_stage(ctx, module, reference.params[step], f"parameter after step {step}")


def _loop(ctx, per_rank: int) -> list[int]:
    """This rank's stages when ``per_rank`` stages per rank are assigned round-robin (rank r
    holds r, r + world, ...), as the looped and interleaved schedules expect."""
    return [ctx.rank + i * ctx.world_size for i in range(per_rank)]


def _v_shape(ctx) -> list[int]:
    """This rank's two stages in the V placement (rank r holds r and 2 * world - 1 - r), as
    the zero-bubble V schedules expect."""
    return [ctx.rank, 2 * ctx.world_size - 1 - ctx.rank]


def _schedule(ctx, name: str):
    cls = getattr(pipelining, name, None)
    if cls is None:
        ctx.skip(f"torch {torch.__version__.split('+')[0]} has no torch.distributed.pipelining.{name}")
    return cls


@check
def p2p_batched_tags(ctx):
    """batch_isend_irecv between pipeline neighbours on the device: each rank posts, in one
    batch, sends of several tensors (dtypes float32, bfloat16 and int64, an empty one, one of
    2 MiB that crosses a transport's chunks) to its right neighbour with distinct tags and the
    receives of its left neighbour's in the opposite tag order, plus the reverse direction;
    every tensor arrives on the device with its values, matched by tag
    (torch.distributed.batch_isend_irecv, P2POp)."""
    right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    specs = [((3, 5), torch.float32), ((0,), torch.float32), ((7,), torch.bfloat16),
             ((4, 4), torch.int64), ((512 * 1024,), torch.float32)]

    def payload(src: int, dst: int, tag: int) -> torch.Tensor:
        shape, dtype = specs[tag]
        return host_tensor(shape, 1000 * src + 10 * dst + tag, dtype, low=-50, high=50)

    ops, received = [], []
    for tag in range(len(specs)):
        for peer in (right, left):
            ops.append(dist.P2POp(dist.isend, payload(ctx.rank, peer, tag).to(ctx.device), peer, tag=tag))
    for tag in reversed(range(len(specs))):
        for peer in (left, right):
            shape, dtype = specs[tag]
            buf = torch.zeros(shape, dtype=dtype, device=ctx.device)
            ops.append(dist.P2POp(dist.irecv, buf, peer, tag=tag))
            received.append((peer, tag, buf))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for peer, tag, buf in received:
        assert_on_device(ctx, buf, f"tensor from rank {peer} with tag {tag}")
        assert_equal(buf, payload(peer, ctx.rank, tag), f"tensor from rank {peer} with tag {tag}")


@check
def schedule_gpipe(ctx):
    """torch.distributed.pipelining.ScheduleGPipe, one stage per rank: all forwards, then all backwards; loss, output,
    every stage's gradients and parameters after each SGD step equal one device's within TOL."""
    train_stages(ctx, pipelining.ScheduleGPipe, [ctx.rank], ctx.world_size)


@check
def schedule_1f1b(ctx):
    """torch.distributed.pipelining.Schedule1F1B, one stage per rank: forwards and backwards interleaved after a warm-up;
    results equal one device's within TOL."""
    train_stages(ctx, pipelining.Schedule1F1B, [ctx.rank], ctx.world_size)


@check
def schedule_interleaved_1f1b(ctx):
    """torch.distributed.pipelining.ScheduleInterleaved1F1B, two stages per rank placed round-robin (stage-to-stage traffic
    goes around the ranks twice, the last stage's output returns to rank 0's next stage);
    results equal one device's within TOL."""
    train_stages(ctx, pipelining.ScheduleInterleaved1F1B, _loop(ctx, 2), 2 * ctx.world_size)


@check
def schedule_looped_bfs(ctx):
    """torch.distributed.pipelining.ScheduleLoopedBFS, two stages per rank round-robin, each rank running all micro-batches
    of its earlier stage first; results equal one device's within TOL."""
    train_stages(ctx, pipelining.ScheduleLoopedBFS, _loop(ctx, 2), 2 * ctx.world_size)


@check
def schedule_interleaved_zero_bubble(ctx):
    """torch.distributed.pipelining.ScheduleInterleavedZeroBubble, two stages per rank round-robin: backward split into the
    input gradient (sent on at once) and the weight gradient (deferred into the bubbles);
    results equal one device's within TOL."""
    train_stages(ctx, pipelining.ScheduleInterleavedZeroBubble, _loop(ctx, 2), 2 * ctx.world_size)


@check
def schedule_zbv_zero_bubble(ctx):
    """torch.distributed.pipelining.ScheduleZBVZeroBubble, two stages per rank in the V placement (rank 0 holds the first
    and the last stage, so the loss is computed where the input enters); results equal one
    device's within TOL."""
    train_stages(ctx, _schedule(ctx, "ScheduleZBVZeroBubble"), _v_shape(ctx), 2 * ctx.world_size)


@check
def schedule_dualpipev(ctx):
    """torch.distributed.pipelining.ScheduleDualPipeV (where the installed torch has it), V placement, forward and backward
    of different micro-batches overlapped; results equal one device's within TOL."""
    train_stages(ctx, _schedule(ctx, "ScheduleDualPipeV"), _v_shape(ctx), 2 * ctx.world_size)


class Traced(nn.Module):
    """A model marked for splitting inside its forward (``pipe_split``)."""

    def __init__(self, n_blocks: int) -> None:
        super().__init__()
        self.stack = whole_model(n_blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.stack.blocks.values()):
            if i:
                pipelining.pipe_split()
            x = block(x)
        return x


@check
def pipeline_split(ctx):
    """pipeline() traces a model with pipe_split() marks into one stage per rank
    (Pipe.num_stages == world size); build_stage puts each stage on its rank's device and
    ScheduleGPipe trains it; loss and gradients equal one device's within TOL
    (torch.distributed.pipelining.pipeline, Pipe.build_stage)."""
    traced = Traced(ctx.world_size)
    reference = Reference(ctx, traced.stack, steps=1)
    x, y = batch(0)
    pipe = pipelining.pipeline(traced, mb_args=(x.chunk(MICROBATCHES)[0],))
    assert pipe.num_stages == ctx.world_size, (
        f"pipeline() made {pipe.num_stages} stages from {ctx.world_size - 1} pipe_split marks")
    stage = pipe.build_stage(ctx.rank, ctx.device)
    module = stage.submod
    for name, param in module.named_parameters():
        assert_on_device(ctx, param, f"stage {ctx.rank} parameter {name}")
    schedule = pipelining.ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    losses: list[torch.Tensor] = []
    last = ctx.rank == ctx.world_size - 1
    schedule.step(*((x.to(ctx.device),) if ctx.rank == 0 else ()),
                  target=y.to(ctx.device) if last else None, losses=losses if last else None)
    if last:
        assert_close(torch.stack([t.detach() for t in losses]).mean(), reference.losses[0], "loss", **TOL)
    # a split stage keeps the traced module's parameter names (stack.blocks.<i>.w1.weight)
    own = {name.removeprefix("stack."): p for name, p in module.named_parameters()}
    assert sorted(own) == sorted(stage_module(traced.stack, ctx.rank, ctx.world_size).state_dict()), (
        f"stage {ctx.rank} holds {sorted(own)}, expected block {ctx.rank}'s parameters")
    for name, param in own.items():
        assert param.grad is not None, f"{name}: no gradient"
        assert_close(param.grad, reference.grads[0][name], f"{name} gradient", **TOL)


def _pp_by(ctx, inner: str):
    """A 2 x (world / 2) mesh ("pp", inner): this rank's stage (its pp coordinate), the
    pipeline group and the inner mesh."""
    mesh = ctx.mesh((2, ctx.world_size // 2), ("pp", inner))
    return mesh["pp"].get_local_rank(), mesh["pp"].get_group(), mesh[inner]


def _tp(module: Stack, mesh) -> Stack:
    return parallelize_module(module, mesh, {f"blocks.{i}.{w}": p for i in module.blocks
                                             for w, p in (("w1", ColwiseParallel()), ("w2", RowwiseParallel()))})


def _fsdp(module: Stack, mesh) -> Stack:
    for block in module.blocks.values():
        fully_shard(block, mesh=mesh)
    return fully_shard(module, mesh=mesh)


@check(any_world_size=False)  # an even world: 2 stages of world / 2 ranks
def pp_fsdp2(ctx):
    """torch.distributed.pipelining over FSDP2 (a 2 x N/2 mesh: 2 stages, each FSDP2-sharded over its
    data-parallel ranks, each replica a slice of the batch), Schedule1F1B: each replica's loss
    equals one device's on that slice, and the gathered gradients and parameters equal one
    device's on the whole batch within TOL (the schedule drives FSDP2's gradient sync and
    resharding)."""
    stage, group, dp = _pp_by(ctx, "dp")
    model = whole_model(4)
    replicas, replica = dp.size(), dp.get_local_rank()
    module = _fsdp(stage_module(model, stage, 2).to(ctx.device), dp)
    train_stages(ctx, pipelining.Schedule1F1B, [stage], 2, group=group, modules=[module], model=model,
                 replicas=replicas, replica=replica)


@check(any_world_size=False)  # an even world: 2 stages of world / 2 ranks
def pp_tp(ctx):
    """torch.distributed.pipelining over tensor parallelism (a 2 x N/2 mesh: 2 stages, each block's w1 Colwise
    and w2 Rowwise over the stage's tensor-parallel ranks), Schedule1F1B: loss, output and the
    gathered gradients and parameters equal one device's within TOL."""
    stage, group, tp = _pp_by(ctx, "tp")
    model = whole_model(4)
    module = _tp(stage_module(model, stage, 2).to(ctx.device), tp)
    train_stages(ctx, pipelining.Schedule1F1B, [stage], 2, group=group, modules=[module], model=model)


#: The 3-D run's AdamW steps and the step after which it checkpoints.
STEPS_3D, SAVE_AFTER = 4, 2
#: Optimizer state keyed by parameter name, param_groups included: the stages hold different
#: parameters, and a nested state dict's ``param_groups`` would be one entry that every stage
#: saves under the same key (torchtitan checkpoints pipelined models this way).
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def _train_3d(ctx, module: Stack, stage: int, group, replica: int, replicas: int, steps: range,
              opt) -> list[torch.Tensor]:
    """``steps`` of the 3-D run; the last stage's per-step losses (CPU)."""
    pipe_stage = pipelining.PipelineStage(module, stage, 2, ctx.device, group=group)
    schedule = pipelining.Schedule1F1B(pipe_stage, n_microbatches=MICROBATCHES // replicas,
                                       loss_fn=loss_fn)
    per = BATCH // replicas
    out = []
    for step in steps:
        x, y = (t[replica * per:(replica + 1) * per].to(ctx.device) for t in batch(step))
        losses: list[torch.Tensor] = []
        schedule.step(*((x,) if stage == 0 else ()), target=y if stage == 1 else None,
                      losses=losses if stage == 1 else None)
        opt.step()
        opt.zero_grad()
        if stage == 1:
            out.append(torch.stack([t.detach() for t in losses]).mean().cpu())
    return out


@check(world_size=8, also_at=(), any_world_size=False)
def train_3d(ctx):
    """A 3-D run at 8 ranks, 2 (pipeline) x 2 (data parallel, FSDP2) x 2 (tensor parallel):
    4 residual MLP blocks in 2 stages, each stage tensor-parallel and then FSDP2-sharded,
    Schedule1F1B, STEPS_3D AdamW steps. Each replica's loss per step equals one device's
    training on the whole batch (its slice's loss) within TOL, and the parameters at the end
    too. A distributed checkpoint (torch.distributed.checkpoint with get_state_dict: model and
    optimizer, the optimizer's state flattened to parameter names) saved after step SAVE_AFTER and loaded into a freshly built 3-D model continues
    to bitwise the same losses."""
    mesh = ctx.mesh((2, 2, 2), ("pp", "dp", "tp"))
    stage, group = mesh["pp"].get_local_rank(), mesh["pp"].get_group()
    replicas, replica = mesh["dp"].size(), mesh["dp"].get_local_rank()
    model = whole_model(4)

    def build():
        module = _fsdp(_tp(stage_module(model, stage, 2).to(ctx.device), mesh["tp"]), mesh["dp"])
        return module, torch.optim.AdamW(module.parameters(), lr=1e-2)

    ref = copy.deepcopy(model).to(ctx.device)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    expected = []
    for step in range(STEPS_3D):
        x, y = (t.to(ctx.device) for t in batch(step))
        with torch.no_grad():
            expected.append(loss_fn(*(t.chunk(replicas)[replica] for t in (ref(x), y))).cpu())
        loss_fn(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()

    module, opt = build()
    with shared_tmpdir() as tmp:
        path = os.path.join(tmp, "ckpt")
        first = _train_3d(ctx, module, stage, group, replica, replicas, range(SAVE_AFTER), opt)
        model_state, optim_state = get_state_dict(module, opt, options=FLAT)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
        rest = _train_3d(ctx, module, stage, group, replica, replicas, range(SAVE_AFTER, STEPS_3D), opt)
        resumed, resumed_opt = build()
        model_state, optim_state = get_state_dict(resumed, resumed_opt, options=FLAT)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(resumed, resumed_opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=FLAT)
        again = _train_3d(ctx, resumed, stage, group, replica, replicas, range(SAVE_AFTER, STEPS_3D),
                          resumed_opt)
    if stage == 1:
        for step, loss in enumerate(first + rest):
            assert_close(loss, expected[step], f"step {step} loss of replica {replica}", rtol=1e-4, atol=1e-5)
        for step, (loss, resumed_loss) in enumerate(zip(rest, again, strict=True), start=SAVE_AFTER):
            assert_equal(resumed_loss, loss, f"step {step} loss after resuming from the checkpoint")
    named = dict(ref.named_parameters())
    for name, param in module.named_parameters():
        assert_close(_full(param), named[name], f"{name} after {STEPS_3D} steps", rtol=1e-4, atol=1e-5)
