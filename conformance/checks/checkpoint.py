"""torch.distributed.checkpoint (DCP) with DTensors on the backend's device: nothing is lost
on a round trip, a checkpoint saved in one layout loads into another (resharding), and a
tensor-parallel model's state dict (and its optimizer's) survives save and load.

The ranks share one temporary directory: rank 0 creates it and broadcasts its path over the
default group (``_util.shared_tmpdir``); DCP's own planning runs over the default group too.
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import (
    ALSO_AT,
    assert_equal,
    assert_on_device,
    host_tensor,
    local_chunk,
    shared_tmpdir,
)
from accelkit.conformance.checks.tp import MLP, MLP_PLAN, _seeded
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import parallelize_module

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, any_world_size=True)

SHAPE = (8, 12)


def _saved_shard0(ctx, path):
    """Save {"weight": Shard(0), "bias": Replicate, "plain": a plain device tensor} and return
    the host tensors saved."""
    mesh = ctx.mesh((ctx.world_size,))
    weight, bias = host_tensor(SHAPE, 1), host_tensor((5,), 2)
    plain = host_tensor((3,), 3)
    state = {
        "weight": distribute_tensor(weight.to(ctx.device, copy=True), mesh, [Shard(0)]),
        "bias": distribute_tensor(bias.to(ctx.device, copy=True), mesh, [Replicate()]),
        "plain": plain.to(ctx.device, copy=True),
    }
    dcp.save(state, checkpoint_id=path)
    return weight, bias, plain


def _load_weight_as(ctx, path, mesh, placements):
    target = {"weight": distribute_tensor(torch.zeros(SHAPE, device=ctx.device), mesh, placements)}
    dcp.load(target, checkpoint_id=path)
    loaded = target["weight"]
    assert isinstance(loaded, DTensor) and tuple(loaded.placements) == tuple(placements)
    assert_on_device(ctx, loaded.to_local(), f"weight loaded as {placements}")
    return loaded


@check
def sharded_roundtrip(ctx):
    """dcp.save of a sharded state dict (a Shard(0) DTensor, a Replicate DTensor, a plain device
    tensor) and dcp.load into zeroed tensors of the same layout restore every value bitwise,
    on the device (torch.distributed.checkpoint.save/load)."""
    mesh = ctx.mesh((ctx.world_size,))
    with shared_tmpdir() as tmp:
        path = os.path.join(tmp, "ckpt")
        weight, bias, plain = _saved_shard0(ctx, path)
        target = {
            "weight": distribute_tensor(torch.zeros(SHAPE, device=ctx.device), mesh, [Shard(0)]),
            "bias": distribute_tensor(torch.zeros(5, device=ctx.device), mesh, [Replicate()]),
            "plain": torch.zeros(3, device=ctx.device),
        }
        dcp.load(target, checkpoint_id=path)
    assert_equal(target["weight"].to_local(), local_chunk(weight, ctx.rank, ctx.world_size), "weight shard")
    assert_equal(target["weight"].full_tensor(), weight, "weight")
    assert_equal(target["bias"].to_local(), bias, "bias replica")
    assert_on_device(ctx, target["plain"], "plain tensor")
    assert_equal(target["plain"], plain, "plain tensor")


@check(also_at=(2,), any_world_size=False)
def reshard_shard1(ctx):
    """A checkpoint saved as Shard(0) over the ranks loads into a Shard(1) DTensor: each rank
    gets its column block of the saved tensor (torch.distributed.checkpoint.load reshards on load)."""
    with shared_tmpdir() as tmp:
        path = os.path.join(tmp, "ckpt")
        weight, _, _ = _saved_shard0(ctx, path)
        loaded = _load_weight_as(ctx, path, ctx.mesh((ctx.world_size,)), [Shard(1)])
    assert_equal(loaded.to_local(), weight.chunk(ctx.world_size, 1)[ctx.rank], "Shard(1) local block")


@check
def reshard_replicate(ctx):
    """A checkpoint saved as Shard(0) loads into a Replicate DTensor: every rank gets the whole
    saved tensor (torch.distributed.checkpoint.load reshards on load)."""
    with shared_tmpdir() as tmp:
        path = os.path.join(tmp, "ckpt")
        weight, _, _ = _saved_shard0(ctx, path)
        loaded = _load_weight_as(ctx, path, ctx.mesh((ctx.world_size,)), [Replicate()])
    assert_equal(loaded.to_local(), weight, "Replicate local tensor")


@check(any_world_size=False)
def reshard_2d(ctx):
    """A checkpoint saved as Shard(0) on a 1-D mesh loads into [Shard(0), Shard(1)] and into
    [Replicate(), Shard(0)] on a 2-D (dp, tp) mesh, each rank getting its block (DCP
    resharding on load, torch.distributed.checkpoint.load)."""
    mesh = ctx.mesh((2, ctx.world_size // 2), ("dp", "tp"))
    with shared_tmpdir() as tmp:
        path = os.path.join(tmp, "ckpt")
        weight, _, _ = _saved_shard0(ctx, path)
        for placements in ([Shard(0), Shard(1)], [Replicate(), Shard(0)]):
            loaded = _load_weight_as(ctx, path, mesh, placements)
            assert_equal(loaded.full_tensor(), weight, f"full tensor loaded as {placements}")
            dp, tp = mesh.get_coordinate()
            block = weight
            for size, coord, placement in zip(mesh.shape, (dp, tp), placements, strict=True):
                if isinstance(placement, Shard):
                    block = block.chunk(size, placement.dim)[coord]
            assert_equal(loaded.to_local(), block, f"local block loaded as {placements}")


@check(any_world_size=False)
def tp_model_roundtrip(ctx):
    """A tensor-parallel MLP (Colwise -> Rowwise) and its AdamW state, saved with
    get_state_dict + dcp.save and loaded with dcp.load + set_state_dict into a differently
    initialised TP model, give bitwise equal parameters, optimizer state and outputs
    (torch.distributed.checkpoint.state_dict)."""
    mesh = ctx.mesh((ctx.world_size,))

    def build(seed):
        model = parallelize_module(_seeded(MLP(), seed).to(ctx.device), mesh, MLP_PLAN)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        x = host_tensor((4, 16), seed + 1).to(ctx.device, copy=True)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        return model, opt

    model, opt = build(40)
    other, other_opt = build(50)
    with shared_tmpdir() as tmp:
        path = os.path.join(tmp, "ckpt")
        model_sd, opt_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": opt_sd}, checkpoint_id=path)
        other_model_sd, other_opt_sd = get_state_dict(other, other_opt)
        state = {"model": other_model_sd, "optim": other_opt_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(other, other_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters(), strict=True):
        assert q.placements == p.placements, f"{name}: placements {q.placements} != {p.placements}"
        assert_equal(q.to_local(), p.to_local(), f"parameter {name}")
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            a, b = opt.state[p][key], other_opt.state[q][key]
            assert_equal(b.to_local(), a.to_local(), f"optimizer {key}")
    x = host_tensor((3, 16), 60).to(ctx.device, copy=True)
    assert_equal(other(x), model(x), "output of the reloaded TP model")
