"""accelkit.core: the interfaces every backend plugs into.

- :class:`DeviceHandle`, the contract of ``torch.<device>``; :func:`check_device_handle` probes it.
- :class:`BackendSpec` / :class:`Capabilities` and :mod:`accelkit.core.registry`.
- :func:`register_accelerator`: one call that registers a PrivateUse1 device and its
  collective library in the right order.
- :mod:`accelkit.core.compiler`: ``torch.compile`` on the device (Dynamo's interface and an
  Inductor backend, registered by ``register_accelerator(..., inductor=...)``).
- :func:`include_dir` and :func:`library`: the reusable C++ integration layer shipped with the
  package (its headers, and its code compiled once per torch version), and
  :func:`load_extension`, which builds a backend's C++ against the installed torch.

Names are imported lazily so ``import accelkit.core`` does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BackendSpec": "accelkit.core.spec",
    "Capabilities": "accelkit.core.spec",
    "RNG_CLASSES": "accelkit.core.spec",
    "registry": "accelkit.core.registry",
    "BackendRegistryError": "accelkit.core.registry",
    "DeviceHandle": "accelkit.core.handle",
    "check_device_handle": "accelkit.core.checker",
    "HandleReport": "accelkit.core.checker",
    "Finding": "accelkit.core.checker",
    "register_accelerator": "accelkit.core.accelerator",
    "AcceleratorRegistrationError": "accelkit.core.accelerator",
    "include_dir": "accelkit.core.cpp",
    "library": "accelkit.core.cpp",
    "load_extension": "accelkit.core.cpp",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accelkit.core' has no attribute {name!r}")
    mod = importlib.import_module(module)
    return mod if module.endswith("." + name) else getattr(mod, name)
