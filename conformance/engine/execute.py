"""Running one check on one rank, from a clean state.

Shared by the engine's pool workers and the torchrun mode. Before each check the rank is put
back into a known state: the default process group stays; groups the previous check created
are destroyed and, if there were any, DTensor's sharding-propagation caches are cleared (on
this thread and on the autograd thread of the rank's device); c10d's group counter is set to the
value every rank agrees on (so the next ``new_group`` gets the same name everywhere, even after
a check that failed on one rank only); no ambient ``with mesh:`` is left (PR 134247); DTensor's
RNG tracker is dropped (PR 103235); host and device RNGs are reseeded with the same seed on
every rank; peak-memory counters are reset. torch has no public API for the first five:
:mod:`accelkit.core.torch_internals` does them. After the check the device is synchronized, so
an asynchronous device's queued error is the result of the check that queued it.
"""

from __future__ import annotations

import linecache
import os
import time
import traceback
from typing import Any

from accelkit.conformance.api import CheckContext, CheckDef, Skip
from accelkit.conformance.outcomes import RankResult, RankStatus
from accelkit.core import torch_internals

#: Every check starts from this seed on host and device.
SEED = 1234


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


def reset_state(device_type: str, group_count: int, seed: int = SEED) -> None:
    """Bring this rank back to the state every check starts from (see the module docstring)."""
    import torch

    handle = device_handle(device_type)
    if torch_internals.destroy_groups_but_the_default():
        device = None if handle is None else torch.device(device_type, handle.current_device())
        torch_internals.clear_sharding_caches(device)
    torch_internals.raise_group_counter(group_count)
    torch_internals.leave_ambient_meshes()
    torch_internals.drop_rng_tracker()
    torch.manual_seed(seed)
    if handle is not None and hasattr(handle, "manual_seed_all"):
        handle.manual_seed_all(seed)


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


def synchronize(handle) -> None:
    """Wait for the work the check queued on the device (``handle.synchronize()``; nothing on
    cpu): an asynchronous device raises a queued kernel's or collective's error here, so it is
    charged to the check that queued it, not to the next one."""
    if handle is not None and hasattr(handle, "synchronize"):
        handle.synchronize()


def run_on_rank(check: CheckDef, ctx: CheckContext, group_count_before: int) -> RankResult:
    """Run ``check`` on this rank from a clean state and describe what happened. A simulated
    check runs inside a fake default process group of ``ctx.world_size`` ranks
    (:func:`accelkit.conformance.launchers.simulate.fake_world`), made and destroyed around it."""
    if check.simulated:
        from accelkit.conformance.launchers.simulate import fake_world

        with fake_world(ctx.spec.device_type, ctx.world_size, ctx.rank):
            return _run(check, ctx, group_count_before)
    return _run(check, ctx, group_count_before)


def _run(check: CheckDef, ctx: CheckContext, group_count_before: int) -> RankResult:
    """The reset, the check and the device synchronization after it, under one ``try``:
    whatever raises is this check's result (ERROR naming the step), never an exception that
    kills the rank."""
    handle = device_handle(ctx.spec.device_type)
    result = RankResult(rank=ctx.rank, status=RankStatus.PASS)
    start = time.perf_counter()
    step = "resetting the rank's state before the check"
    try:
        reset_state(ctx.spec.device_type, group_count_before)
        reset_peak_memory(handle)
        step = "the check"
        returned = check.fn(ctx)
        step = "synchronizing the device after the check"
        synchronize(handle)
        result.returned = _short_repr(returned)
    except Skip as exc:
        result.status, result.message = RankStatus.SKIP, str(exc)
    except AssertionError as exc:
        result.status, result.message = RankStatus.FAIL, _assertion_message(exc)
        result.traceback = _check_traceback(exc)
    except BaseException as exc:  # noqa: BLE001 (SystemExit from a check is an error too)
        where = "" if step == "the check" else f" ({step})"
        result.status, result.message = RankStatus.ERROR, _describe_exception(exc) + where
        result.traceback = _check_traceback(exc)
    if result.status is not RankStatus.PASS:
        _drain(handle, result)
    result.rows = ctx.rows
    result.duration_s = round(time.perf_counter() - start, 6)
    result.peak_host_mb, result.peak_device_mb = peak_memory(handle)
    result.group_count = torch_internals.group_counter()
    return result


def _drain(handle, result: RankResult) -> None:
    """After a check that did not pass: wait for what it left queued on the device, so its
    asynchronous errors do not surface in the next check; such an error is added to this
    check's message (a SKIP that left a failing kernel behind becomes an ERROR)."""
    try:
        synchronize(handle)
    except Exception as exc:  # noqa: BLE001 (reported, the rank goes on)
        queued = f"synchronizing the device after the check raised {_describe_exception(exc)}"
        if result.status is RankStatus.SKIP:
            result.status, result.message = RankStatus.ERROR, f"{queued} (the check skipped: {result.message})"
        else:
            result.message = f"{result.message}; {queued}"
