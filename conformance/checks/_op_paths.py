"""Which aten ops have a path on the device: a sweep over torch's operator registry (the
dispatcher's op names and, per op, the dispatch keys it has a kernel for).

An op has a path on a PrivateUse1 device when the dispatcher finds a kernel for it there: one
of the device's own (PrivateUse1, or its sparse and nested keys, which accelkit's layer gives
every op with a kernel for the CPU's: core/csrc/aten/layouts.cpp), a composite (its kernel calls
other ops: CompositeImplicitAutograd, CompositeExplicitAutograd[NonFunctional]), or a CPU
kernel, which the layer's boxed fallback runs (core/csrc/aten/fallback.cpp). Every other op fails on
the device with "Could not run ...". Those are listed by family in ``no_device_path.toml``,
each family with the reason nobody can give its ops a path; an op no family matches is a gap
the ``ops.registry`` check reports.
"""

from __future__ import annotations

import re
import sys
from importlib.resources import files

import torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Dispatch keys whose kernel is a path on the device.
PATH_KEYS = ("PrivateUse1", "SparsePrivateUse1", "SparseCsrPrivateUse1", "NestedTensorPrivateUse1",
             "CompositeImplicitAutograd", "CompositeExplicitAutograd",
             "CompositeExplicitAutogradNonFunctional", "CPU")
#: Keys named in a gap's row: where torch has kernels for an op the device cannot run.
OTHER_KEYS = ("CUDA", "MPS", "XPU", "HPU", "MTIA", "QuantizedCPU", "QuantizedCUDA", "MkldnnCPU",
              "SparseCPU", "SparseCsrCPU", "NestedTensorCPU", "Meta")


def families() -> list[tuple[re.Pattern, str]]:
    """The documented families of ops without a path: (pattern, reason)."""
    text = files("accelkit.conformance.checks").joinpath("no_device_path.toml").read_text()
    return [(re.compile(f["match"]), f["reason"]) for f in tomllib.loads(text)["family"]]


def without_path() -> list[str]:
    """Every aten op (``name.overload``) with no kernel the device can reach."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return [name.removeprefix("aten::") for name in sorted(torch._C._dispatch_get_all_op_names())
            if name.startswith("aten::") and not any(has(name, key) for key in PATH_KEYS)]


def rows() -> list[dict]:
    """A row per op without a path: ``skip`` with its family's reason, or ``error`` naming
    the keys torch has kernels for where no family matches."""
    known = families()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    out = []
    for op in without_path():
        reason = next((why for pattern, why in known if pattern.search(op)), None)
        row = {"op": f"aten::{op}", "dtype": "*", "samples": 0, "backward": False}
        if reason is not None:
            out.append({**row, "status": "skip", "detail": f"no path on the device: {reason}"})
        else:
            keys = [key for key in OTHER_KEYS if has(f"aten::{op}", key)] or ["none here"]
            out.append({**row, "status": "error",
                        "detail": f"no kernel on the device, no composite and no CPU kernel for the "
                                  f"fallback to run (kernels for: {', '.join(keys)}); register a "
                                  f"kernel for the device, or say why none can exist "
                                  f"(accelkit/conformance/checks/no_device_path.toml)"})
    return out
