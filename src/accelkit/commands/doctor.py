"""``accelkit doctor BACKEND``: set the backend up in this process and run the device-handle
checker on its device, then, for a backend that declares an RNG class other than
``unsupported``, a plain random op on the device (it must advance the generator's offset:
:func:`accelkit.core.checker.check_random_op`), then the runtime itself: copies in every
direction and size compared byte for byte (:func:`accelkit.core.checker.check_copies`, through
torch and through the runtime's own ``Runtime::copy``) and the waiting calls of an asynchronous
runtime (:func:`accelkit.core.checker.check_synchronization`), and, for a PrivateUse1 device, list
whose kernel each op has (accelkit's C++ layer or the vendor's); exit 1 when the report has
errors, 2 when the
backend cannot be found, is unavailable on this host (e.g. cuda without a GPU) or cannot be set
up. It also prints the installed torch (release and build), whether accelkit was verified on it,
and each private torch API accelkit uses that this torch lacks
(:func:`accelkit.core.torch_internals.render_private_apis`)."""

from __future__ import annotations

import argparse
import sys

from accelkit.core import registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("backend", metavar="BACKEND", help="backend name (see `accelkit backends`)")


def run(args: argparse.Namespace) -> int:
    try:
        spec = registry.get(args.backend)
    except registry.BackendRegistryError as exc:
        print(f"accelkit doctor: {exc}", file=sys.stderr)
        return 2
    available, reason = spec.probe(1)
    if not available:
        print(f"accelkit doctor: backend {spec.name!r} is unavailable here: {reason}",
              file=sys.stderr)
        return 2
    try:
        spec.setup()
    except Exception as exc:  # NotImplementedError for unfinished backends, import errors, ...
        print(f"accelkit doctor: cannot set up backend {spec.name!r}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    from accelkit.core.checker import (
        Finding,
        check_copies,
        check_device_handle,
        check_random_op,
        check_synchronization,
    )
    from accelkit.core.torch_internals import render_private_apis

    print(f"backend {spec.name!r}: device {spec.device_type!r}, collectives "
          f"{spec.process_group_backend!r}")
    print(render_private_apis())
    report = check_device_handle(spec.device_type)
    state_sound = not any(f.member in ("get_rng_state", "set_rng_state") for f in report.errors)
    if spec.device_type != "cpu" and spec.capabilities.rng != "unsupported" and state_sound:
        report.probes += 1
        report.findings += check_random_op(spec.device_type,
                                           offset_exact=spec.capabilities.rng == "offset-exact")
    if spec.device_type != "cpu" and report.ok:
        probes, findings = check_synchronization(spec.device_type)
        report.probes += probes
        report.findings += findings
        if findings:  # the copy probes wait with synchronize(): their verdict would mislead
            report.findings.append(Finding(
                "info", "<copy probes>", "copy probes skipped: they rely on synchronize()",
                "nothing more", "fix the waiting calls above and run the doctor again"))
        else:
            probes, findings = check_copies(spec.device_type)
            report.probes += probes
            report.findings += findings
    print(report.render())
    if spec.device_type == torch_privateuse1_name():
        print(render_kernels())
    return 0 if report.ok else 1


def torch_privateuse1_name() -> str:
    import torch

    return torch._C._get_privateuse1_backend_name()


def render_kernels() -> str:
    """The PrivateUse1 kernels by owner: the vendor's (with their file), accelkit's, torch's."""
    from accelkit.core.kernels import fallback_owner, privateuse1_kernels

    kernels = privateuse1_kernels()
    by_owner: dict[str, list] = {}
    for k in kernels:
        by_owner.setdefault(k.owner, []).append(k)
    fallback = fallback_owner()
    lines = [f"PrivateUse1 kernels: {len(by_owner.get('vendor', []))} the vendor's, "
             f"{len(by_owner.get('accelkit', []))} accelkit's, "
             f"{len(by_owner.get('torch', []))} torch's; other ops run through "
             + ("no fallback (they fail)" if fallback is None
                else f"{fallback.owner}'s boxed fallback ({fallback.site})")]
    for k in by_owner.get("vendor", []):
        lines.append(f"  vendor    {k.op}  ({k.site})")
    for k in by_owner.get("accelkit", []):
        lines.append(f"  accelkit  {k.op}")
    return "\n".join(lines)
