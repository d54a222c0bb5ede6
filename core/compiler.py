"""Registering a PrivateUse1 device with torch's compiler stack: Dynamo's ``DeviceInterface``
and an Inductor backend (or a refusal that names ``aot_eager``), so ``torch.compile(fn)(x)``
works on a device tensor with torch's default backend.

What torch 2.13 needs (read in ``torch/_dynamo/device_interface.py`` and
``torch/_inductor/codegen/common.py``):

- **Dynamo**: ``register_interface_for_device(name, interface)``, a ``DeviceInterface``
  subclass (current/set device, count, availability, synchronize, streams and events,
  ``Worker`` helpers that answer from properties recorded in the main process, capability).
  Dynamo reads the registered interfaces when it first traces (stream and event handlers are
  computed once), so the interface must be there before the first trace.
- **Inductor**: ``register_backend_for_device(name, scheduling, wrapper_codegen, ...)`` (the
  kernel codegen and the Python wrapper that calls the kernels) and
  ``register_device_op_overrides(name, overrides)`` (the snippets the wrapper writes for
  set_device / synchronize / device guards). Without the overrides Inductor stops with
  ``KeyError: '<name>'``; without a wrapper of the device's own, ``PythonWrapperCodegen`` emits
  non-Triton kernel calls only for cpu and mps (``RuntimeError: device <name> nyi``).

Importing ``torch._dynamo`` costs ~1.5 s and Inductor's codegen ~2.5 s, too much for every
``import torch`` that loads a device, so :func:`register_compiler` registers nothing eagerly:
the interface is registered right after ``torch._dynamo.device_interface`` is imported, the
Inductor backend right after ``torch._inductor.compile_fx`` is imported (Inductor imports it
before it compiles anything; by then every codegen module is loaded), or at once when they
already are. :func:`compiler_status` forces both and says what torch has.

**The seam for a vendor's codegen** is ``inductor=``: a function without arguments, called
when Inductor loads, that returns an :class:`InductorCodegen` (the classes may import
Inductor there). accelkit's :class:`HostKernels` makes Inductor's
C++ kernels run on a device whose memory the host can address (the mock, a freshly generated
vendor package); a device with its own compiler passes e.g. Triton's scheduling and a wrapper
of its own. ``inductor=None`` registers a refusal: Inductor raises ``NotImplementedError``
naming ``torch.compile(fn, backend="aot_eager")``, which needs only the Dynamo interface.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accelkit.core.after_import import after_import

#: Device-module members the Dynamo interface cannot do without.
REQUIRED_MEMBERS: tuple[str, ...] = (
    "current_device", "set_device", "device_count", "is_available", "synchronize")

#: Torch modules whose import triggers each half of the registration.
DYNAMO_MODULE = "torch._dynamo.device_interface"
INDUCTOR_MODULE = "torch._inductor.compile_fx"


class CompilerRegistrationError(RuntimeError):
    """The compiler registration of a device is refused or incomplete; the message says the fix."""


@dataclass(frozen=True)
class InductorCodegen:
    """What Inductor needs to generate code for a device.

    ``scheduling``: the kernel codegen, a ``BaseScheduling`` subclass (``CppScheduling``,
    ``TritonScheduling``, one of your own). ``wrapper_codegen``: a ``PythonWrapperCodegen``
    subclass that knows how to call those kernels on the device. ``device_op_overrides``: a
    ``DeviceOpOverrides`` instance. ``cpp_wrapper_codegen``: for ``cpp_wrapper`` mode and
    AOTInductor, or None (those modes then fail with Inductor's "Device <name> not supported").
    ``custom_pass``: a ``CustomGraphModulePass`` Inductor runs on the device's graphs; its
    ``uuid()`` is part of Inductor's FX-graph cache key.
    """

    scheduling: type
    wrapper_codegen: type
    device_op_overrides: Any
    cpp_wrapper_codegen: type | None = None
    custom_pass: Any = None


InductorFactory = Callable[[], InductorCodegen]


@dataclass(frozen=True)
class HostKernels:
    """The ``inductor=`` factory of a device whose kernels can run on the host: Inductor's C++
    kernels on the device's tensors, through the runtime when the host cannot address the
    device's memory (:mod:`accelkit.core.host_codegen`, imported when Inductor loads)."""

    name: str

    def __call__(self) -> InductorCodegen:
        from accelkit.core.host_codegen import host_codegen

        return host_codegen(self.name)


@dataclass(frozen=True)
class CompilerStatus:
    """What torch has for a device: ``interface`` (Dynamo's, by class name, or None),
    ``scheduling`` / ``wrapper`` (Inductor's, by class name, or None), ``inductor`` (True when
    Inductor can compile for the device) and ``reason`` (why not, or None)."""

    interface: str | None
    scheduling: str | None
    wrapper: str | None
    inductor: bool
    reason: str | None


@dataclass
class _Entry:
    device_module: Any
    inductor: InductorFactory | None
    missing: str | None = None  # why no Dynamo interface can be built from the module
    refusal: str | None = None  # why Inductor cannot compile for the device


_registered: dict[str, _Entry] = {}
_lock = threading.RLock()


def register_compiler(name: str, device_module: Any, inductor: InductorFactory | None = None
                      ) -> None:
    """Register device ``name`` (whose module is ``device_module``, ``torch.<name>``) with Dynamo
    and Inductor, each as soon as torch loads it (see the module docstring).

    ``inductor`` is the seam for the device's codegen: a function returning an
    :class:`InductorCodegen`, or None for a device without an Inductor backend (Inductor then
    refuses with a message naming ``aot_eager``). A module that lacks a function the Dynamo
    interface needs (:data:`REQUIRED_MEMBERS`; the device-handle check reports it too) gets no
    interface and Inductor's refusal naming what is missing. Raises
    :class:`CompilerRegistrationError` if ``inductor`` is not callable or ``name`` is
    registered with other arguments; the same arguments again do nothing.
    """
    missing = [m for m in REQUIRED_MEMBERS if not callable(getattr(device_module, m, None))]
    if inductor is not None and not callable(inductor):
        raise CompilerRegistrationError(
            f"inductor={inductor!r} for {name!r} is not callable: pass a function without "
            "arguments that returns an accelkit.core.compiler.InductorCodegen, or None for "
            "a device without an Inductor backend (aot_eager)")
    with _lock:
        previous = _registered.get(name)
        if previous is not None:
            if previous.device_module is device_module and previous.inductor == inductor:
                return
            raise CompilerRegistrationError(
                f"{name!r} is already registered with the compiler stack with another device "
                "module or codegen; register once per process")
        _registered[name] = _Entry(device_module, inductor, missing=(
            f"torch.{name} lacks {', '.join(missing)}: Dynamo's DeviceInterface for {name!r} is "
            "built from these device-module functions; add them (accelkit's "
            "build_device_module provides them)") if missing else None)
    after_import(DYNAMO_MODULE, _warning_on_failure(DYNAMO_MODULE, lambda: _register_dynamo(name)))
    after_import(INDUCTOR_MODULE,
                 _warning_on_failure(INDUCTOR_MODULE, lambda: _register_inductor(name)))


def _warning_on_failure(module: str, register: Callable[[], None]) -> Callable[[object], None]:
    """``register`` as an after-import callback of ``module`` that turns a failure into a
    warning: registering a device must not break torch's own import."""
    def callback(_module: object) -> None:
        try:
            register()
        except Exception as exc:
            warnings.warn(f"accelkit: registering a device when {module} loaded failed: "
                          f"{type(exc).__name__}: {exc}", stacklevel=2)

    return callback


def compiler_status(name: str) -> CompilerStatus:
    """Load Dynamo and Inductor (which runs the pending registrations) and say what torch has
    for device ``name``."""
    import torch._dynamo.device_interface as di
    import torch._inductor.compile_fx  # noqa: F401  (runs the Inductor registration)
    from torch._inductor.codegen import common

    common.init_backend_registration()  # torch's own devices (cpu, cuda, ...)
    di.get_registered_device_interfaces()  # same for Dynamo's
    interface = di.device_interfaces.get(name)
    codegen = common.device_codegens.get(name)
    entry = _registered.get(name)
    reason = None
    if entry is not None and entry.refusal is not None:
        reason = entry.refusal
    elif codegen is None:
        reason = f"no Inductor backend is registered for {name!r}"
    elif not _has_op_overrides(common, name):
        reason = (f"{name!r} has an Inductor backend but no device op overrides: Inductor "
                  f"stops with KeyError: {name!r}; register both (register_compiler does)")
    if interface is None and reason is None:
        reason = (f"{name!r} has an Inductor backend but no Dynamo DeviceInterface; register "
                  "both (register_compiler does)")
    if interface is None and entry is not None and entry.missing:
        reason = entry.missing
    return CompilerStatus(
        interface=interface.__name__ if interface is not None else None,
        scheduling=_class_name(codegen.scheduling) if codegen is not None else None,
        wrapper=_class_name(codegen.wrapper_codegen) if codegen is not None else None,
        inductor=reason is None, reason=reason)


def _has_op_overrides(common: Any, name: str) -> bool:
    try:
        common.get_device_op_overrides(name)  # fills torch's own devices' on first use
    except KeyError:
        return False
    return True


def _class_name(obj: Any) -> str:
    return getattr(obj, "__qualname__", type(obj).__qualname__)


# -- Dynamo --------------------------------------------------------------------------------
def _register_dynamo(name: str) -> None:
    """Register the interface unless Dynamo already has one for ``name`` (registered by other
    code: it is kept, and :func:`compiler_status` names it)."""
    from torch._dynamo import device_interface as di

    if name not in di.device_interfaces and _registered[name].missing is None:
        di.register_interface_for_device(
            name, build_device_interface(name, _registered[name].device_module))


def build_device_interface(name: str, mod: Any) -> type:
    """A ``torch._dynamo.device_interface.DeviceInterface`` subclass for device ``name``
    built from its device module ``mod``: the required functions of
    :data:`REQUIRED_MEMBERS`, and, when the module has them, ``device``, ``Stream``,
    ``Event``, ``stream``, ``current_stream``, ``set_stream``, ``memory_allocated``,
    ``is_bf16_supported``, ``get_device_capability``, ``get_device_properties`` and
    ``is_triton_capable``. ``Worker`` answers in Inductor's compile workers from properties
    recorded in the main process (as torch's CUDA interface does)."""
    import torch
    from torch._dynamo import device_interface as di

    def optional(member: str, default: Any) -> Any:
        return getattr(mod, member, None) or default

    def index(device: Any = None) -> int:
        if device is None:
            return mod.current_device()
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            return mod.current_device() if device.index is None else device.index
        return int(device)

    def exchange_device(device: int) -> int:
        previous = mod.current_device()
        if device >= 0 and device != previous:
            mod.set_device(device)
        return previous

    def maybe_exchange_device(device: int) -> int:
        return -1 if device < 0 else exchange_device(device)

    def current_stream(device: Any = None) -> torch.Stream:
        return mod.current_stream(device) if hasattr(mod, "current_stream") else \
            torch.Stream(device=torch.device(name, index(device)))

    def set_stream(stream: torch.Stream) -> None:
        if hasattr(mod, "set_stream"):
            mod.set_stream(stream)

    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                device_type=device_type))

    def get_raw_stream(device_idx: int) -> int:
        return current_stream(device_idx).stream_id

    def get_compute_capability(device: Any = None) -> Any:
        capability = getattr(mod, "get_device_capability", None)
        return capability(device) if capability is not None else ""

    def properties(i: int) -> Any:
        own = getattr(mod, "get_device_properties", None)
        if own is not None:
            return own(i)
        total = mod.mem_get_info(i)[1] if hasattr(mod, "mem_get_info") else 0
        device_name = mod.get_device_name(i) if hasattr(mod, "get_device_name") else f"{name}:{i}"
        return DeviceProperties(device_name, total, os.cpu_count() or 1)

    class Worker:
        """Device queries that work in Inductor's compile workers: properties are recorded
        in the process that registered the device, on first use."""

        @staticmethod
        def set_device(device: int) -> None:
            di.caching_worker_current_devices[name] = device

        @staticmethod
        def current_device() -> int:
            if name in di.caching_worker_current_devices:
                return di.caching_worker_current_devices[name]
            return mod.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            i = Worker.current_device() if device is None else index(device)
            if name not in di.caching_worker_device_properties:
                di.caching_worker_device_properties[name] = [
                    properties(d) for d in range(mod.device_count())]
            return di.caching_worker_device_properties[name][i]

    members = {
        "_accelkit": True,
        "__doc__": f"Dynamo's interface to the {name!r} device, built by accelkit from torch.{name}.",
        "device": optional("device", di.DeviceInterface.device),
        "Stream": optional("Stream", torch.Stream),
        "Event": optional("Event", torch.Event),
        "Worker": Worker,
        "current_device": staticmethod(mod.current_device),
        "set_device": staticmethod(mod.set_device),
        "device_count": staticmethod(mod.device_count),
        "is_available": staticmethod(mod.is_available),
        "synchronize": staticmethod(mod.synchronize),
        "exchange_device": staticmethod(exchange_device),
        "maybe_exchange_device": staticmethod(maybe_exchange_device),
        "stream": staticmethod(optional("stream", _no_stream_context)),
        "current_stream": staticmethod(current_stream),
        "set_stream": staticmethod(set_stream),
        "_set_stream_by_id": staticmethod(_set_stream_by_id),
        "get_raw_stream": staticmethod(get_raw_stream),
        "get_compute_capability": staticmethod(get_compute_capability),
        "get_device_properties": staticmethod(Worker.get_device_properties),
        "memory_allocated": staticmethod(optional("memory_allocated", lambda device=None: 0)),
        "is_bf16_supported": staticmethod(
            optional("is_bf16_supported", lambda including_emulation=False: False)),
        "is_triton_capable": staticmethod(
            optional("is_triton_capable", lambda device=None: False)),
    }
    return type(f"{name.capitalize()}Interface", (di.DeviceInterface,), members)


@dataclass(frozen=True)
class DeviceProperties:
    """What ``Worker.get_device_properties`` answers for a device module without
    ``get_device_properties``: kernels of a host-memory device run on the host's cores."""

    name: str
    total_memory: int
    multi_processor_count: int


def _no_stream_context(stream: Any) -> Any:
    import contextlib

    return contextlib.nullcontext()


# -- Inductor ------------------------------------------------------------------------------
def _register_inductor(name: str) -> None:
    """Register the device's codegen, or a refusal carrying the reason: a failure here must
    surface when something is compiled for the device, not break ``import compile_fx``."""
    from torch._inductor.codegen import common

    entry = _registered[name]
    existing = common.device_codegens.get(name)
    if existing is not None and not getattr(existing.wrapper_codegen, "_accelkit", False):
        entry.refusal = (f"Inductor already has a backend for {name!r} "
                         f"({_class_name(existing.scheduling)}); register the device with the "
                         "compiler stack once, through one of the two")
        return
    if entry.missing is not None:
        entry.refusal = entry.missing
    elif entry.inductor is None:
        entry.refusal = (f"the {name!r} device has no Inductor backend, torch.compile's default "
                         f"backend; compile with torch.compile(fn, backend=\"aot_eager\"), or "
                         f"register the device's codegen (accelkit.core.register_accelerator("
                         f"..., inductor=...), see accelkit's docs/compile.md)")
    else:
        try:
            codegen = entry.inductor()
            _validate(name, codegen, common)
        except Exception as exc:  # reported when something is compiled for the device
            entry.refusal = (f"the Inductor codegen registered for {name!r} is unusable: "
                             f"{type(exc).__name__}: {exc}")
        else:
            common.register_backend_for_device(
                name, codegen.scheduling, codegen.wrapper_codegen, codegen.cpp_wrapper_codegen,
                device_custom_pass=codegen.custom_pass)
            common.register_device_op_overrides(name, codegen.device_op_overrides)
            return
    scheduling, wrapper, overrides = _refusal(entry.refusal, common)
    common.register_backend_for_device(name, scheduling, wrapper)
    common.register_device_op_overrides(name, overrides)


def _validate(name: str, codegen: Any, common: Any) -> None:
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.scheduler import BaseScheduling

    if not isinstance(codegen, InductorCodegen):
        raise TypeError(f"the inductor factory returned {codegen!r}, not an InductorCodegen")
    problems = []
    if not (isinstance(codegen.scheduling, type) and issubclass(codegen.scheduling, BaseScheduling)):
        problems.append(f"scheduling={codegen.scheduling!r} is not a BaseScheduling subclass "
                        "(e.g. CppScheduling, TritonScheduling)")
    if not (isinstance(codegen.wrapper_codegen, type)
            and issubclass(codegen.wrapper_codegen, PythonWrapperCodegen)):
        problems.append(f"wrapper_codegen={codegen.wrapper_codegen!r} is not a "
                        "PythonWrapperCodegen subclass")
    if not isinstance(codegen.device_op_overrides, common.DeviceOpOverrides):
        problems.append(f"device_op_overrides={codegen.device_op_overrides!r} is not a "
                        "DeviceOpOverrides instance (without it Inductor stops with "
                        f"KeyError: {name!r})")
    if problems:
        raise TypeError("; ".join(problems))


def _refusal(reason: str, common: Any) -> tuple[type, type, Any]:
    """Scheduling, wrapper and op overrides that raise ``NotImplementedError(reason)`` when
    Inductor uses them for the device."""
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.scheduler import BaseScheduling

    class RefusedScheduling(BaseScheduling):
        def __init__(self, scheduler: Any) -> None:
            raise NotImplementedError(reason)

    class RefusedWrapper(PythonWrapperCodegen):
        _accelkit = True

        @staticmethod
        def create(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(reason)

    return RefusedScheduling, RefusedWrapper, common.DeviceOpOverrides()
