"""A cuda-like device module written in Python, for the checker and registration tests.

It keeps a Philox-style (seed, offset) state per device on the host, initialises lazily like
torch.cuda, and accepts the device as an int, a str and a torch.device, so it passes
:func:`accelkit.core.check_device_handle` (with warnings for the stream API it leaves out).
``make_module(name, **changes)`` returns a fresh module; each change replaces a member
(``None`` deletes it), which is how the tests build deliberately broken handles.
"""

from __future__ import annotations

import types

import torch

DEVICES = 2


def make_module(name: str, **changes) -> types.ModuleType:
    mod = types.ModuleType(f"pydevice_{name}")
    state = {"initialized": False, "current": 0,
             "rng": [[0, 0] for _ in range(DEVICES)], "initial": [0] * DEVICES}

    def index(device=None) -> int:
        if device is None:
            return state["current"]
        if isinstance(device, int):
            return device
        device = torch.device(device)
        if device.type != name:
            raise ValueError(f"expected a {name!r} device, got {device}")
        return state["current"] if device.index is None else device.index

    def _lazy_init():
        state["initialized"] = True

    def current_device():
        _lazy_init()
        return state["current"]

    def set_device(device):
        _lazy_init()
        state["current"] = index(device)

    def synchronize(device=None):
        _lazy_init()

    def get_rng_state(device=name):
        _lazy_init()
        seed, offset = state["rng"][index(device)]
        raw = seed.to_bytes(8, "little") + offset.to_bytes(8, "little", signed=True)
        return torch.tensor(list(raw), dtype=torch.uint8)

    def set_rng_state(new_state, device=name):
        _lazy_init()
        if new_state.dtype != torch.uint8 or new_state.numel() != 16:
            raise ValueError("expected a 16-byte uint8 state")
        raw = bytes(new_state.tolist())
        state["rng"][index(device)] = [int.from_bytes(raw[:8], "little"),
                                       int.from_bytes(raw[8:], "little", signed=True)]

    def __getattr__(attr):
        """``_initialized``, as torch.cuda's (torch.utils.checkpoint reads it)."""
        if attr == "_initialized":
            return state["initialized"]
        raise AttributeError(f"module {mod.__name__!r} has no attribute {attr!r}")

    def manual_seed(seed):
        i = index()
        state["rng"][i] = [int(seed), 0]
        state["initial"][i] = int(seed)

    def manual_seed_all(seed):
        for i in range(DEVICES):
            state["rng"][i] = [int(seed), 0]
            state["initial"][i] = int(seed)

    members = {
        "is_available": lambda: True,
        "is_initialized": lambda: state["initialized"],
        "device_count": lambda: DEVICES,
        "current_device": current_device,
        "set_device": set_device,
        "synchronize": synchronize,
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed_all,
        "initial_seed": lambda: state["initial"][index()],
        "_is_in_bad_fork": lambda: False,
        "_lazy_init": _lazy_init,
        "__getattr__": __getattr__,
        "get_amp_supported_dtype": lambda: [torch.float16, torch.bfloat16],
    }
    members.update(changes)
    for key, value in members.items():
        if value is not None:
            setattr(mod, key, value)
    mod._state = state
    return mod


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """Python PrivateUse1 hooks, so torch.accelerator knows the device (the C++ hooks'
    stand-in for a Python-only device)."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def install_hooks() -> None:
    """Register the Python hooks and device guard (what a C++ extension does at load)."""
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
