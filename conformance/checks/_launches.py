"""Every op a launch: on an asynchronous device each OpInfo op, called while the current stream
is held, returns before the stream is released, as a CUDA kernel launch returns before the
kernel runs. One row per op and dtype (``ops.async_launch``).

The hold is the device module's ``_Hold`` (accelkit's device modules have it: a wait in stream
order that the host releases, ``Runtime::stream_wait``): the op's sample is made and the op
called once first (a first call may load code or compile), then the current stream is held and
the op called again. A call that has not returned after :data:`WATCHDOG` seconds waits for the
device; a watchdog thread then releases the stream, so the call returns and the row says the op
blocks. ``blocking_ops.toml`` lists the ops that block, each with its kind and reason: those
that must read tensor values on the host before they can return (a data-dependent output shape,
a Python number or bool result, an error check of the values: they wait on CUDA too), and those
accelkit's fallback runs at the call (it cannot allocate their outputs ahead; a native kernel
launches them). A listed op that blocks is a skipped row with that reason, any other op that
blocks a wrong row naming it.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from accelkit.conformance.checks import _opinfo

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Seconds a held call may take before it counts as waiting for the device; a listed op
#: (expected to block) is given LISTED_WATCHDOG, so the ops known to block cost little.
WATCHDOG = 0.5
LISTED_WATCHDOG = 0.1
#: Unlisted ops found blocking after which a rank stops (a device whose every op blocks would
#: otherwise pay the watchdog for each of them): the rest is one wrong row saying so.
MAX_BLOCKING = 16
#: The ops known to block, with their kind and reason.
BLOCKING_OPS = Path(__file__).with_name("blocking_ops.toml")
#: Their kinds.
KINDS = ("host read", "fallback")


@functools.cache
def blocking_ops() -> dict[str, str]:
    """``blocking_ops.toml``'s ops (each key an OpInfo full name) -> "<kind>: <reason>"."""
    table = tomllib.loads(BLOCKING_OPS.read_text())
    unknown = sorted(set(table) - _opinfo.op_names())
    if unknown:
        raise ValueError(f"{BLOCKING_OPS}: {', '.join(unknown)} are not OpInfo names of this torch "
                         "(accelkit.conformance.checks._opinfo.op_names())")
    bad = sorted(name for name, entry in table.items()
                 if entry.get("kind") not in KINDS or not entry.get("reason"))
    if bad:
        raise ValueError(f"{BLOCKING_OPS}: {', '.join(bad)} need a kind ({' or '.join(KINDS)}) "
                         "and a reason")
    return {name: f"{entry['kind']}: {entry['reason']}" for name, entry in table.items()}


def _held_call(op, sample, hold_type, watchdog_s: float) -> float | None:
    """Seconds the call took with the current stream held, or None if it returned only because
    the watchdog released the stream after ``watchdog_s``."""
    hold = hold_type()
    hold.wait()
    fired = threading.Event()

    def release() -> None:
        fired.set()
        hold.release()

    watchdog = threading.Timer(watchdog_s, release)
    watchdog.start()
    started = time.perf_counter()
    try:
        op(sample.input, *sample.args, **sample.kwargs)
    finally:
        took = time.perf_counter() - started
        watchdog.cancel()
        hold.release()
    return None if fired.is_set() else took


def rows(device: torch.device, rank: int, world_size: int, hold_type,
         synchronize: Callable[[], None]) -> list[dict]:
    """This rank's share of the OpInfos (every ``world_size``-th from ``rank``), by
    :func:`check_op`, stopping after :data:`MAX_BLOCKING` unlisted ops that block."""
    out = []
    ops = _opinfo.op_db()[rank::world_size]
    for done, op in enumerate(ops):
        if sum(row["status"] == "fail" for row in out) >= MAX_BLOCKING:
            out.append({"op": "*", "dtype": "*", "samples": 0, "backward": False,
                        "status": "fail", "detail": (
                            f"stopped after {MAX_BLOCKING} ops that block: the last "
                            f"{len(ops) - done} of this rank's {len(ops)} ops were not called")})
            break
        out.extend(check_op(op, device, hold_type, synchronize))
    return out


def check_op(op, device: torch.device, hold_type, synchronize: Callable[[], None],
             dtypes=_opinfo.DTYPES) -> list[dict]:
    """One row per dtype of ``dtypes`` the OpInfo declares on the CPU, with its first sample:
    ``pass`` when the held call returned, ``skip`` for a listed op that blocked (or one torch
    leaves out, or one that raises: the value checks report that), ``fail`` for an unlisted op
    that blocked, ``error`` for one that raised only while held."""
    listed = blocking_ops()
    name = _opinfo.full_name(op)
    out = []
    for dtype in dtypes:
        if dtype not in op.supported_dtypes("cpu"):
            continue
        row = {"op": name, "dtype": str(dtype).removeprefix("torch."), "samples": 0,
               "backward": False, "status": "pass", "detail": ""}
        out.append(row)
        reason, _, _ = _opinfo._torch_says(op, device.type, dtype)
        if reason is not None:
            row.update(status="skip", detail=reason)
            continue
        try:
            samples = _opinfo._samples(op, device, dtype, False, 1)
            if not samples:
                row.update(status="skip", detail="torch's OpInfo has no sample for this dtype")
                continue
            op(samples[0].input, *samples[0].args, **samples[0].kwargs)
            synchronize()
        except Exception as exc:  # noqa: BLE001 (the ops area's value checks report errors)
            row.update(status="skip", detail="raises on the device (the ops area's value "
                       f"checks report it): {_opinfo._first_line(exc)}")
            synchronize_quietly(synchronize)
            continue
        try:
            took = _held_call(op, samples[0], hold_type,
                              LISTED_WATCHDOG if name in listed else WATCHDOG)
            synchronize()
        except Exception as exc:  # noqa: BLE001 (an error while held is the row's result)
            row.update(status="error", detail=f"with the stream held: {_opinfo._first_line(exc)}")
            synchronize_quietly(synchronize)
            continue
        row["samples"] = 1
        if took is not None:
            row["detail"] = f"returned in {took * 1000:.1f} ms with the stream held"
        elif name in listed:
            row.update(status="skip", detail=f"blocks, as listed ({listed[name]})")
        else:
            row.update(status="fail", detail=(
                f"the call did not return within {WATCHDOG} s while the current stream was "
                "held (it returned once the stream was released): the host waits for the "
                "device in this op"))
    return out


def synchronize_quietly(synchronize: Callable[[], None]) -> None:
    """Synchronize, dropping the queued error a failing op left (its row already says it)."""
    try:
        synchronize()
    except Exception:  # noqa: BLE001, S110 (the row records the failure)
        pass
