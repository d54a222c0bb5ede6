"""Operator conformance on torch's own OpInfo database: every op's sample inputs run on the
device under test and on the CPU, forward and (where the OpInfo supports autograd) backward,
and the results compared. This is what torch's ``TestCommon.test_compare_cpu``
(test/test_ops.py) does for CUDA, on a PrivateUse1 device, with one row per op and dtype.

What comes from torch, not from here:

- the ops, their sample inputs and the dtypes each declares on the CPU:
  ``torch.testing._internal.common_methods_invocations.op_db`` (``OpInfo.sample_inputs``,
  ``OpInfo.supported_dtypes``, ``OpInfo.supported_backward_dtypes``);
- which ops torch itself does not compare across devices: the device-agnostic
  ``unittest.skip``/``expectedFailure`` decorators an OpInfo declares for ``TestCommon``'s
  ``test_compare_cpu`` (an empty tensor's values, ops whose result depends on the device's
  algorithm); a row says the reason torch gives;
- tolerances: ``test_compare_cpu``'s (``atol = rtol = 1e-3``), or the OpInfo's
  ``toleranceOverride`` for that test and dtype when larger;
- ops whose precision torch picks by device type (:data:`DEVICE_POLICIES`): a difference there
  is ``xfail`` with torch's rule;
- which ops draw random numbers: an aten op the OpInfo calls that carries
  ``torch.Tag.nondeterministic_seeded``. The device's generator need not produce the CPU's
  stream (the ``rng`` area checks the device's generator), so those rows are skipped.

A row's status is ``pass``, ``fail`` (a value differs: the row says which output, where and
by how much), ``error`` (the device raised where the CPU did not) or ``skip`` (with torch's
reason). Known-wrong ops of a backend are listed in its expectations file (``[ops]`` table,
:mod:`accelkit.conformance.engine.expectations`), each with a reason.

Levels (``ACCELKIT_OPS_LEVEL``): ``quick`` (the default) takes the first
:data:`QUICK_SAMPLES` samples of each op for each of :data:`DTYPES` it declares, and checks
the backward in float32 only; ``full`` takes every sample and the backward in every dtype of
:data:`DTYPES` the OpInfo declares for it.
"""

from __future__ import annotations

import functools
import itertools
import os
import unittest
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: The dtypes checked, where an OpInfo declares them on the CPU.
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64)
#: Samples per op and dtype at the quick level.
QUICK_SAMPLES = 2
#: Levels and what ``ACCELKIT_OPS_LEVEL`` may say.
LEVELS = ("quick", "full")
#: torch's test whose decorators say which ops are not compared with the CPU.
TORCH_TEST = ("TestCommon", "test_compare_cpu")
#: test_compare_cpu's tolerance (test/test_ops.py).
TOLERANCE = 1e-3
#: Ops whose precision torch itself picks by device type, so that any device but the CPU and
#: CUDA computes them otherwise by torch's design: (OpInfo name prefix, dtypes, torch's rule).
#: A difference in those dtypes is ``xfail`` with the rule, as for torch's own expectedFailure.
DEVICE_POLICIES = (
    ("nn.functional.linear_cross_entropy", (torch.float16, torch.bfloat16),
     "torch accumulates float16 and bfloat16 in float32 on the CPU and CUDA only, in the input's "
     "dtype on any other device (LinearCrossEntropyOptions._resolve_auto_acc_dtype, "
     "torch/nn/modules/linear_cross_entropy_options.py)"),
)


def level() -> str:
    """``ACCELKIT_OPS_LEVEL`` (``quick`` unless set); anything else is an error naming it."""
    value = os.environ.get("ACCELKIT_OPS_LEVEL", "quick")
    if value not in LEVELS:
        raise ValueError(f"ACCELKIT_OPS_LEVEL={value!r}: set it to one of {', '.join(LEVELS)}")
    return value


@functools.cache
def op_db() -> tuple:
    """torch's OpInfos, by full name (``name.variant``), sorted (imported once per process):
    ``op_db`` and the ``torch._foreach_*`` ops of the ``foreach_*_op_db`` lists beside it
    (what optimizers' foreach paths and gradient clipping call, each returning a list)."""
    from torch.testing._internal import common_methods_invocations as cmi

    foreach = (cmi.foreach_unary_op_db + cmi.foreach_binary_op_db + cmi.foreach_pointwise_op_db
               + cmi.foreach_reduce_op_db + cmi.foreach_other_op_db)
    return tuple(sorted(cmi.op_db + foreach, key=full_name))


def op_names() -> set[str]:
    """Every OpInfo's full name (what an expectations file's ``[ops]`` entries name)."""
    return {full_name(op) for op in op_db()}


def full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def family(op) -> str:
    """Which ``ops`` check an OpInfo belongs to: ``unary``, ``binary``, ``reductions``, ``nn``,
    ``linalg`` (linalg, fft, special), ``foreach`` or ``other``."""
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo

    if op.name.startswith("_foreach_"):
        return "foreach"
    if op.name.startswith("nn.functional.") or op.name.startswith("nn."):
        return "nn"
    if op.name.startswith(("linalg.", "fft.", "special.")):
        return "linalg"
    if isinstance(op, UnaryUfuncInfo):
        return "unary"
    if isinstance(op, BinaryUfuncInfo):
        return "binary"
    if isinstance(op, ReductionOpInfo):
        return "reductions"
    return "other"


def ops_of(name: str) -> list:
    """The OpInfos of family ``name``."""
    return [op for op in op_db() if family(op) == name]


def _torch_says(op, device_type: str, dtype: torch.dtype) -> tuple[str | None, bool, float]:
    """What torch's ``test_compare_cpu`` decorators say for ``op`` and ``dtype`` on any device:
    the reason it is skipped (or None), whether a failure is expected (torch marks it
    ``expectedFailure``: the row runs, and a difference is ``xfail``), and the tolerance
    (:data:`TOLERANCE`, the dtype's ``torch.testing.assert_close`` default or the OpInfo's
    ``toleranceOverride``, the largest)."""
    from torch.testing._comparison import default_tolerances
    from torch.testing._internal.common_device_type import toleranceOverride

    tolerance = max(TOLERANCE, *default_tolerances(dtype))
    expected_failure = False
    for decorator in op.get_decorators(*TORCH_TEST, device_type, dtype, {}):
        if isinstance(decorator, toleranceOverride):
            if dtype in decorator.d:
                tolerance = max(tolerance, decorator.d[dtype].atol, decorator.d[dtype].rtol)
            continue
        if decorator is unittest.expectedFailure:
            expected_failure = True
            continue
        probe = decorator(lambda: None) if callable(decorator) else None
        if getattr(probe, "__unittest_skip__", False):
            return f"torch skips it in test_compare_cpu: {probe.__unittest_skip_why__}", False, tolerance
    return None, expected_failure, tolerance


class _SeededOps(TorchDispatchMode):
    """Records the aten ops a call runs that draw random numbers
    (``torch.Tag.nondeterministic_seeded``)."""

    def __init__(self) -> None:
        super().__init__()
        self.seeded: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.seeded.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _to_cpu(t):
    """A CPU copy of a device sample's tensor (a leaf that requires grad if ``t`` does)."""
    if not isinstance(t, torch.Tensor):
        return t
    copy = t.detach().to("cpu", copy=True)
    return copy.requires_grad_(True) if t.requires_grad else copy


def _leaf(t):
    """``t`` as a leaf of its own over the same memory (requiring grad if ``t`` does): the
    device side differentiates with respect to leaves, as the CPU side does with its copies. A
    sample tensor that is a view of another sample tensor (istft's ``window[:8]``) otherwise
    gets no gradient on the device where its CPU copy gets one."""
    if not isinstance(t, torch.Tensor):
        return t
    return t.detach().requires_grad_(True) if t.requires_grad else t


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _call(op, sample):
    """``op`` on ``sample``'s inputs: the inputs and the processed output."""
    out = op(sample.input, *sample.args, **sample.kwargs)
    return (sample.input, sample.args, sample.kwargs), sample.output_process_fn_grad(out)


def _first_difference(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> str | None:
    """None if ``actual`` (any device) equals ``expected`` (CPU) within ``tolerance``
    (``torch.testing.assert_close``, NaNs equal), else the first lines of its message."""
    try:
        torch.testing.assert_close(actual.detach().cpu(), expected.detach(), atol=tolerance,
                                   rtol=tolerance, equal_nan=True, check_device=False)
    except AssertionError as exc:
        return " ".join(line.strip() for line in str(exc).strip().splitlines()[:4])
    return None


def _compare(what: str, actual, expected, tolerance: float, device_type: str) -> str | None:
    """None if the device's results are on ``device_type`` and equal the CPU's, else the first
    difference: a result left on another device (the host, say) is wrong even when its values
    are right."""
    got, want = _tensors(actual), _tensors(expected)
    if len(got) != len(want):
        return f"{what}: {len(got)} tensors, the CPU gives {len(want)}"
    for i, a in enumerate(got):
        if a.device.type != device_type:
            return f"{what} {i} is on {a.device}, not on the {device_type} device"
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        diff = _first_difference(a, e, tolerance)
        if diff is not None:
            return f"{what} {i}: {diff}"
    return None


def _backward(inputs, out, seed: int, device: torch.device) -> list:
    """The gradients of ``out`` with respect to the inputs that require them, for upstream
    gradients drawn from ``seed`` on the CPU (the same on both devices); None where an input
    gets none."""
    leaves = [t for t in _tensors(inputs) if t.requires_grad]
    outs = [t for t in _tensors(out) if t.requires_grad]
    if not leaves or not outs:
        return []
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(device) for o in outs]
    return list(torch.autograd.grad(outs, leaves, grads, allow_unused=True))


def _seeded_ops(op, sample) -> set[str]:
    """The aten ops tagged ``nondeterministic_seeded`` that ``op`` runs on a CPU copy of
    ``sample``: a separate call, since under a dispatch mode some CPU kernels see their
    inputs' conjugate bit resolved differently (``linalg.pinv`` of a complex matrix differs)."""
    recorder = _SeededOps()
    try:
        with recorder:
            _call(op, sample.transform(_to_cpu))
    except Exception:  # noqa: BLE001 (the reference call below reports what the CPU raises)
        pass
    return recorder.seeded


def _results_belong(sample, device: torch.device) -> str:
    """The device type an op's results belong on: the ``device`` its sample asks for
    (``new_zeros(..., device="cpu")``), else the device of its tensor inputs, else torch's
    default device (``arange(2)``)."""
    asked = sample.kwargs.get("device")
    if asked is not None:
        return torch.device(asked).type
    if _tensors((sample.input, sample.args, sample.kwargs)):
        return device.type
    return torch.get_default_device().type


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _case(op, sample, device: torch.device, tolerance: float, backward: bool,
          seed: int) -> tuple[str | None, set[str]]:
    """One sample (made on ``device``) on the device and on a CPU copy of it: None or what
    differs, and the seeded aten ops the op runs (the CPU's values are then no reference).
    The CPU runs first, on copies, so an op that writes to its inputs cannot change them."""
    seeded = _seeded_ops(op, sample)
    if seeded:
        return None, seeded
    cpu_inputs, cpu_out = _call(op, sample.transform(_to_cpu))
    try:
        dev_inputs, dev_out = _call(op, sample.transform(_leaf))
    except Exception as exc:  # noqa: BLE001 (what the device raised is the row's result)
        return f"error: {_first_line(exc)}", set()
    diff = _compare("output", dev_out, cpu_out, tolerance, _results_belong(sample, device))
    if diff is not None or not backward:
        return diff, set()
    want = _backward(cpu_inputs, cpu_out, seed, torch.device("cpu"))
    try:
        got = _backward(dev_inputs, dev_out, seed, device)
    except Exception as exc:  # noqa: BLE001
        return f"error in backward: {_first_line(exc)}", set()
    got = [g for g in got if g is not None]
    want = [g for g in want if g is not None]
    return _compare("gradient", got, want, tolerance, device.type), set()


def _samples(op, device: torch.device, dtype: torch.dtype, requires_grad: bool,
             limit: int | None) -> list:
    """The OpInfo's sample inputs made on ``device`` (as torch's device tests make them), from
    its ``sample_inputs_func``: ``OpInfo.sample_inputs`` wraps them in an iterator that looks
    for the running unittest through ``inspect.stack()`` on every sample, which costs tens of
    milliseconds in a process with distributed torch imported."""
    torch.manual_seed(0)
    samples = op.sample_inputs_func(op, device, dtype, requires_grad)
    return list(itertools.islice(samples, limit))


def check_op(op, device: torch.device, dtypes: Iterable[torch.dtype] = DTYPES,
             which: str | None = None) -> list[dict]:
    """The rows of one OpInfo on ``device``: one per dtype of ``dtypes`` it declares on the CPU
    (forward, with the backward where checked at ``which`` level, the default :func:`level`)."""
    which = which or level()
    limit = QUICK_SAMPLES if which == "quick" else None
    declared = op.supported_dtypes("cpu")
    backward_dtypes = op.supported_backward_dtypes("cpu") if op.supports_autograd else set()
    rows = []
    for dtype in dtypes:
        if dtype not in declared:
            continue
        row = {"op": full_name(op), "dtype": str(dtype).removeprefix("torch."), "samples": 0,
               "backward": False, "status": "pass", "detail": ""}
        rows.append(row)
        reason, expected_failure, tolerance = _torch_says(op, device.type, dtype)
        policy = next((rule for prefix, policy_dtypes, rule in DEVICE_POLICIES
                       if full_name(op).startswith(prefix) and dtype in policy_dtypes), None)
        if reason is not None:
            row.update(status="skip", detail=reason)
            continue
        backward = dtype in backward_dtypes and (which == "full" or dtype == torch.float32)
        row["backward"] = backward
        try:
            samples = _samples(op, device, dtype, backward, limit)
        except Exception as exc:  # noqa: BLE001 (making inputs on the device is part of the row)
            row.update(status="error", detail=f"making torch's sample inputs on the device: {_first_line(exc)}")
            continue
        for i, sample in enumerate(samples):
            try:
                diff, seeded = _case(op, sample, device, tolerance, backward, seed=i)
            except Exception as exc:  # noqa: BLE001 (the CPU reference raised: not comparable)
                row.update(status="skip", detail=f"the CPU raises on sample {i}: {_first_line(exc)}")
                break
            if seeded:
                row.update(status="skip", detail="draws random numbers "
                           f"({', '.join(sorted(seeded))} is nondeterministic_seeded): the "
                           "device's generator need not match the CPU's")
                break
            row["samples"] += 1
            if diff is not None:
                status = "error" if diff.startswith("error") else "fail"
                if expected_failure:
                    status, diff = "xfail", f"{diff} (torch expects test_compare_cpu to fail for it)"
                elif policy is not None and status == "fail":
                    status, diff = "xfail", f"{diff} ({policy})"
                row.update(status=status, detail=f"sample {i} ({_describe(sample)}): {diff}")
                break
    return rows


def _describe(sample) -> str:
    shapes = [tuple(t.shape) for t in _tensors((sample.input, sample.args, sample.kwargs))]
    return f"shapes {shapes}"[:120]


def run_family(name: str, device: torch.device, rank: int, world_size: int,
               synchronize: Callable[[], None]) -> list[dict]:
    """Rows for this rank's share of family ``name`` (every ``world_size``-th op from
    ``rank``); ``synchronize`` runs after each op, so an asynchronous device's queued error
    is charged to the op that queued it."""
    rows = []
    for op in ops_of(name)[rank::world_size]:
        try:
            rows.extend(check_op(op, device))
            synchronize()
        except Exception as exc:  # noqa: BLE001 (one op's queued error must not hide the others)
            rows.append({"op": full_name(op), "dtype": "*", "samples": 0, "backward": False,
                         "status": "error", "detail": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return rows
