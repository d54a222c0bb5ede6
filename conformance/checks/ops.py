"""Operators: torch's OpInfo database (``common_methods_invocations.op_db``, about 700 ops)
on the device under test against the CPU, as torch's ``TestCommon.test_compare_cpu``
(test/test_ops.py) checks CUDA: each op's sample inputs, forward and, where the OpInfo
supports autograd, backward, in float32, float16, bfloat16, int64, bool and complex64 where the
OpInfo declares them (:mod:`accelkit.conformance.checks._opinfo` says how, and which ops torch
itself leaves out), every result on the device. One check per family of ops; the ranks split each family's ops between
them (each op runs on one rank, on its own device), so a check's time shrinks with the ranks.

Every op x dtype is a row of the report's op table: which ops, which dtypes, how many samples,
the first wrong value. ``ops.registry`` sweeps torch's operator registry for the ops the device
has no path for at all. A check fails on any row that differs from the CPU or raises, unless
the backend's expectations list the op under ``[ops]`` with a reason. ``ACCELKIT_OPS_LEVEL``
picks the level: ``quick`` (default: two samples per op and dtype, backward in float32) or
``full`` (every sample, backward in every dtype checked). On the cpu backend the area SKIPs:
the CPU is the reference.
"""

from __future__ import annotations

from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks import _launches, _op_paths, _opinfo
from accelkit.conformance.checks._util import ALSO_AT
from accelkit.conformance.engine.execute import device_handle, synchronize

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, any_world_size=True, timeout=600)


def _family(ctx, name: str) -> str:
    if ctx.device_type == "cpu":
        ctx.skip("the ops area compares the device with the CPU; on the cpu backend the CPU is "
                 "the reference itself")
    handle = device_handle(ctx.device_type)
    rows = _opinfo.run_family(name, ctx.device, ctx.rank, ctx.world_size,
                              lambda: synchronize(handle))
    ctx.rows.extend(rows)
    ops = {row["op"] for row in rows}
    checked = sum(row["status"] != "skip" for row in rows)
    return (f"{_opinfo.level()}: {len(ops)} ops, {len(rows)} op x dtype rows "
            f"({checked} compared) on rank {ctx.rank}")


@check
def unary(ctx):
    """Elementwise unary ops (the ``UnaryUfuncInfo`` entries of torch.testing's ``op_db``: abs,
    exp, sin, ...) equal the CPU's on their OpInfo samples, forward and backward."""
    return _family(ctx, "unary")


@check
def binary(ctx):
    """Elementwise binary ops (torch.testing's ``BinaryUfuncInfo`` entries: add, mul, pow,
    comparisons, ...), with the broadcasting and type promotion their samples use, equal the CPU's."""
    return _family(ctx, "binary")


@check
def reductions(ctx):
    """Reductions (torch.testing's ``ReductionOpInfo`` entries: sum, mean, amax, prod, ...)
    over every dim and keepdim their samples use equal the CPU's."""
    return _family(ctx, "reductions")


@check
def nn(ctx):
    """torch.nn.functional ops (convolutions, pooling, normalisations, losses, attention,
    ...) equal the CPU's on their OpInfo samples, forward and backward."""
    return _family(ctx, "nn")


@check
def linalg(ctx):
    """torch.linalg, torch.fft and torch.special ops equal the CPU's (with the OpInfo's own
    output processing where results are defined up to sign or phase)."""
    return _family(ctx, "linalg")


@check
def foreach(ctx):
    """The ``torch._foreach_*`` ops (torch.testing's ``foreach_*_op_db``: what optimizers'
    foreach paths and ``clip_grad_norm_`` call) equal the CPU's, and every tensor of the list
    each returns is on the device: a list result the boxed CPU fallback leaves on the host is
    wrong even where its values are right."""
    return _family(ctx, "foreach")


@check
def other(ctx):
    """Every other OpInfo of torch.testing's ``op_db``: views, indexing, scatter/gather, shape
    ops, sorting, factories, type conversions, matmul and the rest, equal to the CPU's."""
    return _family(ctx, "other")


@check
def registry(ctx):
    """Every aten op of torch's operator registry (torch._C._dispatch_get_all_op_names, and
    torch._C._dispatch_has_kernel_for_dispatch_key per op) has a path on the device: a kernel of the
    device's (PrivateUse1, or its sparse and nested keys), a composite, or a CPU kernel the
    boxed fallback runs, but for the families of ``no_device_path.toml`` (CUDA libraries'
    kernels, other devices' layouts, ...), each a skipped row with its reason; an op no family
    covers is a wrong row (:mod:`accelkit.conformance.checks._op_paths`). Rank 0 sweeps."""
    if ctx.device_type == "cpu":
        ctx.skip("the registry sweep looks for the device's kernels; on the cpu backend every op "
                 "runs on the CPU itself")
    if ctx.rank != 0:
        return "the sweep runs on rank 0"
    rows = _op_paths.rows()
    ctx.rows.extend(rows)
    gaps = sum(row["status"] != "skip" for row in rows)
    return (f"{len(rows)} aten ops without a path on the device: {len(rows) - gaps} in documented "
            f"families, {gaps} not")


@check(timeout=900)
def async_launch(ctx):
    """Every op is a launch: each OpInfo op of torch.testing's ``op_db``, per dtype, called while
    the current stream is held (the device module's ``_Hold``), returns before the stream is
    released, as a CUDA kernel launch does (DDP's and FSDP's overlap of computation with
    communication needs it); the ops that block (those that must read values on the host, and
    those accelkit's fallback runs at the call) are listed with their reason in
    ``blocking_ops.toml`` (:mod:`accelkit.conformance.checks._launches`). The ranks split the
    ops. SKIP on a synchronous device, or one whose module has no ``_Hold``."""
    if ctx.device_type == "cpu":
        ctx.skip("the cpu backend runs every op on the host: there is no stream to hold")
    handle = device_handle(ctx.device_type)
    is_async = getattr(handle, "is_async", None)
    if is_async is not None and not is_async():
        ctx.skip(f"{ctx.device_type} is synchronous (torch.{ctx.device_type}.is_async() is False): "
                 "every op is done when it returns; run it on the device's asynchronous mode "
                 "(the mock: ACCELKIT_MOCK_ASYNC=1)")
    hold = getattr(handle, "_Hold", None)
    if hold is None:
        ctx.skip(f"torch.{ctx.device_type} has no _Hold (a wait in stream order the host "
                 "releases; accelkit's device modules have it)")
    rows = _launches.rows(ctx.device, ctx.rank, ctx.world_size, hold, lambda: synchronize(handle))
    ctx.rows.extend(rows)
    held = sum(row["status"] == "pass" for row in rows)
    return f"{held} of {len(rows)} op x dtype rows launched with the stream held on rank {ctx.rank}"
