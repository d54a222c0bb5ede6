"""Running one check on one rank, from a clean state (issue #3).

Shared by the engine's pool workers and the torchrun mode. Before each check the rank is put
back into a known state: the default process group stays; groups the previous check created
are destroyed (tracked through ``torch.distributed.distributed_c10d._world.pg_map``) and, if
there were any, DTensor's sharding-propagation caches are cleared (``_clear_sharding_caches``);
c10d's
group counter is set to the value every rank agrees on (so the next ``new_group`` gets the same
name everywhere, even after a check that failed on one rank only); no ambient ``with mesh:``
is left on ``device_mesh._mesh_resources.mesh_stack`` (PR 134247); DTensor's RNG tracker is
dropped (``torch.distributed.tensor._random._rng_tracker = None``, PR 103235); host and device
RNGs are reseeded with the same seed on every rank; peak-memory counters are reset.
"""

from __future__ import annotations

import linecache
import os
import time
import traceback
from typing import Any

from accelkit.conformance.api import CheckContext, CheckDef, Skip
from accelkit.conformance.outcomes import RankResult

#: Every check starts from this seed on host and device.
SEED = 1234


def _c10d():
    from torch.distributed import distributed_c10d

    return distributed_c10d


def device_handle(device_type: str):
    """``torch.<device_type>`` (the device handle), or None for cpu."""
    import torch

    if device_type == "cpu":
        return None
    return getattr(torch, device_type, None)


def _read_status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_memory(handle) -> None:
    """Resets the host high-water mark (``VmHWM``, by writing 5 to ``/proc/self/clear_refs``)
    and the device handle's peak counter when it has one."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    if handle is not None and hasattr(handle, "reset_peak_memory_stats"):
        try:
            handle.reset_peak_memory_stats()
        except Exception:  # a handle may declare it and not support it yet
            pass


def peak_memory(handle) -> tuple[float | None, float | None]:
    """(host peak RSS MiB since the last reset, device peak allocated MiB or None)."""
    hwm = _read_status_kb("VmHWM")
    host = round(hwm / 1024, 1) if hwm is not None else None
    device = None
    if handle is not None and hasattr(handle, "max_memory_allocated"):
        try:
            device = round(handle.max_memory_allocated() / 2**20, 1)
        except Exception:
            device = None
    return host, device


def _clear_sharding_caches(device_type: str) -> None:
    """Clear DTensor's sharding-propagation caches. DeviceMesh equality ignores process groups,
    so a cached sharding would hand a later check's equal mesh the destroyed groups of an
    earlier one ("Could not resolve the process group"). The caches are per thread: they are
    cleared here and, through a one-node backward, on the autograd engine's thread of this
    rank's device, where backward ops on device tensors run."""
    import torch
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    handle = device_handle(device_type)
    if handle is None:
        return

    class ClearInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            _clear_sharding_prop_cache()
            return grad

    x = torch.zeros((), device=torch.device(device_type, handle.current_device()), requires_grad=True)
    ClearInBackward.apply(x).backward()


def reset_state(device_type: str, group_count: int, seed: int = SEED) -> None:
    """Bring this rank back to the state every check starts from (see the module docstring)."""
    import torch
    from torch.distributed import device_mesh
    from torch.distributed.tensor import _random

    c10d = _c10d()
    default = c10d._get_default_group()
    stale = [pg for pg in c10d._world.pg_map if pg is not default]
    for pg in stale:
        c10d.destroy_process_group(pg)
    if stale:
        _clear_sharding_caches(device_type)
    c10d._world.group_count = max(c10d._world.group_count, group_count)
    device_mesh._mesh_resources.mesh_stack.clear()
    _random._rng_tracker = None
    torch.manual_seed(seed)
    handle = device_handle(device_type)
    if handle is not None and hasattr(handle, "manual_seed_all"):
        handle.manual_seed_all(seed)


def group_count() -> int:
    return _c10d()._world.group_count


def _assertion_message(exc: AssertionError) -> str:
    text = str(exc).strip()
    if text:
        return f"AssertionError: {text}"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "AssertionError"
    code = tb.tb_frame.f_code
    line = linecache.getline(code.co_filename, tb.tb_lineno).strip()
    return f"AssertionError at {os.path.basename(code.co_filename)}:{tb.tb_lineno}: {line}"


def _check_traceback(exc: BaseException) -> str:
    """The traceback from the check's own frame down (this module's frame left out)."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _describe_exception(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text:
        return f"out of memory: {text}"
    return text


def _short_repr(value: Any, limit: int = 200) -> str | None:
    if value is None:
        return None
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_on_rank(check: CheckDef, ctx: CheckContext, group_count_before: int) -> RankResult:
    """Run ``check`` on this rank from a clean state and describe what happened."""
    reset_state(ctx.spec.device_type, group_count_before)
    handle = device_handle(ctx.spec.device_type)
    reset_peak_memory(handle)
    result = RankResult(rank=ctx.rank, status="pass")
    start = time.perf_counter()
    try:
        result.returned = _short_repr(check.fn(ctx))
    except Skip as exc:
        result.status, result.message = "skip", str(exc)
    except AssertionError as exc:
        result.status, result.message = "fail", _assertion_message(exc)
        result.traceback = _check_traceback(exc)
    except BaseException as exc:  # noqa: BLE001 (SystemExit from a check is an error too)
        result.status, result.message = "error", _describe_exception(exc)
        result.traceback = _check_traceback(exc)
    result.duration_s = round(time.perf_counter() - start, 6)
    result.peak_host_mb, result.peak_device_mb = peak_memory(handle)
    result.group_count = group_count()
    return result
