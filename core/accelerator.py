"""One call that registers a PrivateUse1 accelerator and its collective library with torch,
in the order torch needs, refusing the known pitfalls with a message that says the fix.

Steps (see the torch 2.13 facts note and PR 102468):

1. ``torch.utils.rename_privateuse1_backend(name)``: device strings ``"<name>:0"`` parse;
2. ``torch._register_device_module(name, device_module)``: ``torch.<name>``, the handle
   DeviceMesh, DTensor and the RNG tracker call (see :class:`accelkit.core.DeviceHandle`);
3. ``torch.utils.generate_methods_for_privateuse1_backend()``: ``Tensor.<name>()``,
   ``Tensor.is_<name>``, ``Module.<name>()``;
4. ``torch.distributed.Backend.register_backend(collective_backend, creator,
   extended_api=..., devices=[name])`` (a list: a plain string would be split into letters),
   which also makes ``collective_backend`` the default backend for ``name`` devices;
5. ``aten::_fused_sdp_choice`` for PrivateUse1 answers MATH unless the extension registered
   its own kernel: ``F.scaled_dot_product_attention`` decomposes on a device whose extension
   has no fused attention, while a boxed fallback would run the CPU kernel and answer what the
   CPU would do (flash);
6. :func:`accelkit.core.check_device_handle` without touching the device (so registering
   does not make ``is_initialized()`` True, which would stop DeviceMesh selecting each rank's
   device); errors raise when ``strict`` is True and only warn otherwise.

The C++ side (kernels, hooks, device guard, generator, allocator) must be loaded before the
call: import your extension first.

**Loading at ``import torch``.** torch calls every entry point of the ``torch.backends``
group during ``import torch`` (device-backend autoload; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
turns it off). A vendor package that wants ``torch.<name>`` without an explicit import
declares one whose function imports the package (which calls :func:`register_accelerator`)::

    [project.entry-points."torch.backends"]
    myaccel = "myaccel:_autoload"

See ``docs/registration.md``.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from accelkit.core.checker import HandleReport, check_device_handle

#: Device types torch parses natively (c10's DeviceType names, as listed by ``torch.device``'s
#: error message); a PrivateUse1 name may not be one of them.
BUILTIN_DEVICE_TYPES: frozenset[str] = frozenset({
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga",
    "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone",
})

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_lock = threading.Lock()


class AcceleratorRegistrationError(RuntimeError):
    """register_accelerator() refused; the message names what is wrong and the fix."""


@dataclass(frozen=True)
class _Registration:
    device_module: Any
    collective_backend: str | None
    creator: Callable[..., Any] | None
    extended_api: bool
    report: HandleReport


_done: dict[str, _Registration] = {}


def register_accelerator(name: str, device_module: ModuleType | Any, *,
                         collective_backend: str | None = None,
                         creator: Callable[..., Any] | None = None,
                         extended_api: bool = True, strict: bool = True) -> HandleReport:
    """Register ``device_module`` as ``torch.<name>`` under PrivateUse1 and, if
    ``collective_backend`` is given, ``creator`` as that c10d backend for ``name`` devices.

    Returns the device-handle report. Calling again with the same arguments returns the
    first report without registering anything again; other arguments for a registered name
    are an error. Raises :class:`AcceleratorRegistrationError` when PrivateUse1 already has
    another name, ``name`` is not a lowercase identifier or is a built-in device type or a
    ``torch`` attribute, the collective backend name is taken, or (``strict=True``) the
    handle check finds errors; with ``strict=False`` those errors are a warning.
    See the module docstring for the order of the steps and the ``torch.backends``
    autoload entry point.
    """
    with _lock:
        previous = _done.get(name)
        if previous is not None:
            _check_same(name, previous, device_module, collective_backend, creator, extended_api)
            return _enforce(name, previous.report, strict)
        _validate_arguments(name, device_module, collective_backend, creator)

        import torch

        # Every refusal happens before the first change: a failed call leaves torch untouched.
        register_collective = collective_backend is not None and _collective_todo(
            name, collective_backend, creator, extended_api)
        rename = _rename_todo(torch, name)
        register_module = _module_todo(torch, name, device_module)
        if rename:
            torch.utils.rename_privateuse1_backend(name)
        if register_module:
            torch._register_device_module(name, device_module)
        if not hasattr(torch.Tensor, f"is_{name}"):
            torch.utils.generate_methods_for_privateuse1_backend()
        if register_collective:
            import torch.distributed as dist

            dist.Backend.register_backend(collective_backend, creator, extended_api=extended_api,
                                          devices=[name])
        _register_sdp_choice(torch)
        report = check_device_handle(name, touch_device=False)
        _done[name] = _Registration(device_module, collective_backend, creator, extended_api, report)
        return _enforce(name, report, strict)


#: The torch.library registration of step 5, kept alive for the process.
_sdp_choice_library: Any = None


def _register_sdp_choice(torch: Any) -> None:
    """Step 5 (see the module docstring); a kernel the extension registered stays."""
    global _sdp_choice_library
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_sdp_choice", "PrivateUse1"):
        return
    from torch.nn.attention import SDPBackend

    math = int(SDPBackend.MATH.value)
    _sdp_choice_library = torch.library.Library("aten", "IMPL")
    _sdp_choice_library.impl("_fused_sdp_choice", lambda *args, **kwargs: math, "PrivateUse1")


def _validate_arguments(name: str, device_module: Any, collective_backend: str | None,
                        creator: Any) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise AcceleratorRegistrationError(
            f"accelerator name {name!r} is not valid: use a lowercase Python identifier "
            "(letters, digits, '_', starting with a letter), e.g. 'myaccel'; it becomes the "
            "device string '<name>:0' and the module torch.<name>")
    if name in BUILTIN_DEVICE_TYPES:
        raise AcceleratorRegistrationError(
            f"accelerator name {name!r} collides with torch's built-in device type {name!r}; "
            "choose a name of your own (built-in: " + ", ".join(sorted(BUILTIN_DEVICE_TYPES)) + ")")
    if device_module is None:
        raise AcceleratorRegistrationError(
            f"device_module for {name!r} is None: pass the module (or object) that becomes "
            f"torch.{name}, with the members of accelkit.core.DeviceHandle")
    if (collective_backend is None) != (creator is None):
        raise AcceleratorRegistrationError(
            "collective_backend and creator go together: pass both (the c10d backend name and "
            "the function that creates it) or neither")
    if collective_backend is not None and (not isinstance(collective_backend, str)
                                           or not _NAME.match(collective_backend)):
        raise AcceleratorRegistrationError(
            f"collective backend name {collective_backend!r} is not valid: use a lowercase "
            "Python identifier, e.g. 'myccl'")
    if creator is not None and not callable(creator):
        raise AcceleratorRegistrationError(
            f"creator {creator!r} is not callable: pass the function that creates the c10d "
            "backend")


def _rename_todo(torch: Any, name: str) -> bool:
    """True if PrivateUse1 still has to be renamed to ``name``; an error if it has another."""
    owner = torch._C._get_privateuse1_backend_name()
    if owner == name:
        return False
    if owner != "privateuseone":
        raise AcceleratorRegistrationError(
            f"cannot register accelerator {name!r}: PrivateUse1 is already renamed to "
            f"{owner!r} in this process (torch allows one PrivateUse1 device per process and a "
            f"rename cannot be undone); register {name!r} in a process that does not load "
            f"{owner!r} (check the torch.backends autoload entry points, or set "
            "TORCH_DEVICE_BACKEND_AUTOLOAD=0)")
    return True


def _module_todo(torch: Any, name: str, device_module: Any) -> bool:
    """True if ``torch.<name>`` still has to be registered; an error if it is something else."""
    existing = getattr(torch, name, None)
    if existing is device_module:
        return False
    if existing is not None:
        raise AcceleratorRegistrationError(
            f"cannot register accelerator {name!r}: torch.{name} already exists ({existing!r}); "
            "choose a name that is not a torch attribute")
    return True


def _collective_todo(name: str, backend: str, creator: Any, extended_api: bool) -> bool:
    """True if the c10d backend still has to be registered; an error if the name is taken."""
    import torch.distributed as dist

    plugin = dist.Backend._plugins.get(backend.upper())
    if plugin is not None:
        if plugin.creator_fn is creator and plugin.extended_api == extended_api \
                and name in dist.Backend.backend_capability.get(backend, []):
            return False
        raise AcceleratorRegistrationError(
            f"collective backend name {backend!r} is already registered by "
            f"{_qualname(plugin.creator_fn)}; choose another name for {name!r}'s backend")
    if backend in dist.Backend.backend_list or hasattr(dist.Backend, backend.upper()):
        raise AcceleratorRegistrationError(
            f"collective backend name {backend!r} is a c10d backend built into torch "
            f"({', '.join(dist.Backend.backend_list)}); choose another name for {name!r}'s "
            "backend")
    return True


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_same(name: str, previous: _Registration, device_module: Any,
                collective_backend: str | None, creator: Any, extended_api: bool) -> None:
    diffs = [f"{label} (first: {old!r}, now: {new!r})" for label, old, new in (
        ("device_module", previous.device_module, device_module),
        ("collective_backend", previous.collective_backend, collective_backend),
        ("creator", previous.creator, creator),
        ("extended_api", previous.extended_api, extended_api),
    ) if old is not new and old != new]
    if diffs:
        raise AcceleratorRegistrationError(
            f"accelerator {name!r} is already registered with other arguments: "
            + "; ".join(diffs) + ". Registration happens once per process; pass the same "
            "arguments (or register once, at import of your package)")


def _enforce(name: str, report: HandleReport, strict: bool) -> HandleReport:
    if report.errors:
        text = (f"torch.{name} fails the device-handle check (registration itself is done and "
                f"cannot be undone in this process):\n{report.render()}")
        if strict:
            raise AcceleratorRegistrationError(
                text + "\nFix the errors above, or pass strict=False to register with a warning")
        warnings.warn(text, stacklevel=3)
    return report
