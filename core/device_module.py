"""Build the cuda-like ``torch.<name>`` module of a PrivateUse1 device from its extension.

The extension is one built on the accelkit C++ layer (``<accelkit/python.h>``'s
``bind_device``): it exposes ``device_count``, ``current_device``, ``set_device``,
``check_device``, ``is_initialized``, ``init``, ``synchronize``, ``default_generator``,
``memory_stats``, ``reset_peak_memory_stats``, ``reset_accumulated_memory_stats``,
``mem_get_info``, ``current_stream``, ``set_stream``, ``stream_priority_range``,
``external_stream``, ``host_accessible``, ``is_async`` and ``empty_cache``.
:func:`build_device_module` wraps them with the Python API of ``torch.cuda`` that torch's
distributed stack calls on a device handle (PR 102468; see :class:`accelkit.core.DeviceHandle`
for each caller): a vendor package calls it instead of writing its own module.
"""

from __future__ import annotations

import collections
import collections.abc
import os
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

#: The extension functions the module is built from (``<accelkit/python.h>``).
REQUIRED_BINDINGS: tuple[str, ...] = (
    "device_count", "current_device", "set_device", "check_device", "is_initialized", "init",
    "synchronize", "default_generator", "memory_stats", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "mem_get_info", "current_stream", "set_stream",
    "stream_priority_range", "external_stream", "host_accessible", "is_async", "empty_cache",
)


def build_device_module(name: str, ext: Any, *,
                        amp_dtypes: Iterable[torch.dtype] = (torch.float16, torch.bfloat16),
                        ) -> types.ModuleType:
    """A module ``torch.<name>`` over extension ``ext`` (not registered: pass it to
    :func:`accelkit.core.register_accelerator`). ``amp_dtypes`` is what
    ``get_amp_supported_dtype()`` answers for ``torch.autocast(device_type=name)``."""
    missing = [b for b in REQUIRED_BINDINGS if not hasattr(ext, b)]
    if missing:
        raise TypeError(
            f"extension {getattr(ext, '__name__', ext)!r} lacks {', '.join(missing)}: build it "
            "on <accelkit/python.h> and call accelkit::bind_device(m) in its PYBIND11_MODULE")
    mod = types.ModuleType(f"torch.{name}", f"The {name!r} device (accelkit), a cuda-like API.")
    ns = _namespace(name, ext, tuple(amp_dtypes))
    for key, value in ns.items():
        if isinstance(value, type) and not key.startswith("_"):
            value.__module__ = mod.__name__
            value.__qualname__ = key
        elif callable(value) and hasattr(value, "__module__"):
            value.__module__ = mod.__name__
        setattr(mod, key, value)
    mod.__all__ = sorted(k for k in ns if not k.startswith("_"))
    return mod


class _ForkState:
    """Whether this process is a fork of one in which the device was already in use."""

    def __init__(self, ext: Any) -> None:
        self.ext = ext
        self.bad = False

    def after_fork_in_child(self) -> None:
        # A synchronous host-memory device survives fork; a device with driver state or queue
        # threads does not (as CUDA).
        if self.ext.is_initialized() and (not self.ext.host_accessible() or self.ext.is_async()):
            self.bad = True


#: The fork state of every device module built in this process (one fork hook serves all).
_FORK_STATES: weakref.WeakSet[_ForkState] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for state in list(_FORK_STATES):
        state.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _namespace(name: str, ext: Any, amp_dtypes: tuple[torch.dtype, ...]) -> dict[str, Any]:
    fork_state = _ForkState(ext)
    _FORK_STATES.add(fork_state)

    def _index(device: Any = None) -> int:
        """The device index of an int, str, torch.device, or None / a negative int (the
        current device); an index out of range raises the device's invalid-ordinal error."""
        if device is None:
            return ext.current_device()
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != name:
                raise ValueError(f"expected a {name!r} device, got {device}")
            if device.index is None:
                return ext.current_device()
            device = device.index
        if isinstance(device, int) and not isinstance(device, bool):
            if device < 0:
                return ext.current_device()
            ext.check_device(device)
            return device
        raise TypeError(f"expected a {name} device as an int, str or torch.device, got {device!r}")

    def is_available() -> bool:
        """True when at least one device is present (does not initialize the device)."""
        return ext.device_count() > 0

    def is_initialized() -> bool:
        """False until the device is first used (DeviceMesh sets the device only then)."""
        return bool(ext.is_initialized())

    def _lazy_init() -> None:
        """Called by torch before the first tensor on the device; with no device here (a host
        without the card: ``is_available()`` False) it refuses, as torch.cuda does."""
        if ext.device_count() == 0:
            raise RuntimeError(
                f"{name} error: no {name} device is available here (device_count() is 0; "
                f"torch.{name}.is_available() tells before use)")
        if fork_state.bad:
            raise RuntimeError(
                f"Cannot re-initialize {name} in forked subprocess. To use {name} with "
                "multiprocessing, you must use the 'spawn' start method")
        ext.init()

    def __getattr__(attr: str) -> Any:
        """``_initialized``, read like ``torch.cuda._initialized``: torch.utils.checkpoint saves
        and restores the device's RNG state around a recompute only when it is True."""
        if attr == "_initialized":
            return bool(ext.is_initialized())
        raise AttributeError(f"module 'torch.{name}' has no attribute {attr!r}")

    def _is_in_bad_fork() -> bool:
        """True in a child forked after the device was initialized (if it cannot survive it)."""
        return fork_state.bad

    def init() -> None:
        """Initialize the device state now (torch.cuda.init)."""
        _lazy_init()

    def device_count() -> int:
        """The number of devices."""
        return ext.device_count()

    def current_device() -> int:
        """The calling thread's current device index."""
        return ext.current_device()

    def set_device(device: Any) -> None:
        """Make ``device`` current for the calling thread (negative: no-op, as torch.cuda)."""
        if isinstance(device, int) and device < 0:
            return
        ext.set_device(_index(device))

    class device:  # noqa: N801  (torch.cuda.device's name)
        """Context manager that makes ``idx`` the current device inside the block."""

        def __init__(self, idx: Any) -> None:
            self.idx = -1 if idx is None else _index(idx)
            self.prev = -1

        def __enter__(self) -> None:
            self.prev = ext.current_device()
            if self.idx >= 0 and self.idx != self.prev:
                ext.set_device(self.idx)

        def __exit__(self, *exc: object) -> bool:
            if self.idx >= 0 and self.idx != self.prev:
                ext.set_device(self.prev)
            return False

    class device_of(device):  # noqa: N801
        """Context manager making the device of tensor ``obj`` current (no-op for others)."""

        def __init__(self, obj: torch.Tensor) -> None:
            super().__init__(obj.get_device() if obj.device.type == name else -1)

    def synchronize(device: Any = None) -> None:
        """Wait for all work on ``device`` (default: current)."""
        ext.synchronize(_index(device))

    # Random number generators: one Philox generator per device, state = 16 bytes.
    def _generator(device: Any = None) -> torch.Generator:
        return ext.default_generator(_index(device))

    def get_rng_state(device: Any = name) -> torch.Tensor:
        """The 16-byte state (uint64 seed, int64 offset) of the device's default generator."""
        return _generator(device).get_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = name) -> None:
        """Restore a state from get_rng_state. Under FakeTensorMode / LocalTensor torch passes
        fake states, which carry no data: they are ignored."""
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(new_state):
            return
        if not isinstance(new_state, torch.Tensor) or new_state.device.type != "cpu":
            raise TypeError(f"set_rng_state expects a CPU torch.ByteTensor, got {new_state!r}")
        _generator(device).set_state(new_state.contiguous())

    def get_rng_state_all() -> list[torch.Tensor]:
        """The states of every device's default generator."""
        return [get_rng_state(i) for i in range(ext.device_count())]

    def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
        """Restore the states of every device from get_rng_state_all."""
        for i, state in enumerate(new_states):
            set_rng_state(state, i)

    def manual_seed(seed: int) -> None:
        """Seed the current device's generator (its offset restarts at 0)."""
        _generator().manual_seed(int(seed))

    def manual_seed_all(seed: int) -> None:
        """Seed every device's generator (torch.manual_seed calls this)."""
        for i in range(ext.device_count()):
            ext.default_generator(i).manual_seed(int(seed))

    def seed() -> None:
        """Seed the current device's generator with a non-deterministic number."""
        _generator().seed()

    def seed_all() -> None:
        """Seed every device's generator with one non-deterministic number."""
        value = _generator().seed()
        manual_seed_all(value)

    def initial_seed() -> int:
        """The current device generator's seed."""
        return _generator().initial_seed()

    # Memory: the allocator's statistics, with torch.cuda's keys.
    def memory_stats(device: Any = None) -> collections.OrderedDict[str, int]:
        """Allocator statistics ("allocated_bytes.all.current", ...) of ``device``."""
        return collections.OrderedDict(sorted(ext.memory_stats(_index(device)).items()))

    def _stat(key: str) -> Callable[[Any], int]:
        def read(device: Any = None) -> int:
            return int(ext.memory_stats(_index(device))[key])
        read.__doc__ = f"memory_stats()[{key!r}] of ``device`` (default: current)."
        return read

    def reset_peak_memory_stats(device: Any = None) -> None:
        """Reset the peaks of the memory statistics to their current values."""
        ext.reset_peak_memory_stats(_index(device))

    def reset_accumulated_memory_stats(device: Any = None) -> None:
        """Reset the allocated / freed counters of the memory statistics."""
        ext.reset_accumulated_memory_stats(_index(device))

    def reset_max_memory_allocated(device: Any = None) -> None:
        """Same as reset_peak_memory_stats (torch.cuda's older name)."""
        reset_peak_memory_stats(device)

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        """(free, total) bytes of ``device``."""
        return tuple(ext.mem_get_info(_index(device)))

    def empty_cache() -> None:
        """Give the allocator's cached blocks back to the device (memory_reserved drops to
        memory_allocated), after the queued work that may still use them."""
        ext.empty_cache()

    # Streams and events: plain torch.Stream / torch.Event objects on this device (torch's C
    # code checks their exact type, so no subclass instances); isinstance() still works.
    class _OnDevice(type):
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, cls._base) and torch.device(obj.device).type == name

    class Stream(metaclass=_OnDevice):
        """``Stream(device=None, priority=0)``: a torch.Stream on ``device`` (default:
        current), from the device's pool of streams at ``priority`` (lower numbers run first;
        clamped into ``Stream.priority_range()``)."""

        _base = torch.Stream

        def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:
            if kwargs:
                return torch.Stream(priority=priority, **kwargs)
            return torch.Stream(device=torch.device(name, _index(device)), priority=priority)

        @staticmethod
        def priority_range(device: Any = None) -> tuple[int, int]:
            """(least, greatest) stream priority of ``device``: the driver's range, lower
            numbers first (torch.cuda.Stream.priority_range)."""
            return tuple(ext.stream_priority_range(_index(device)))

    def ExternalStream(stream_ptr: int, device: Any = None) -> torch.Stream:  # noqa: N802
        """A torch.Stream over a stream the caller created with the device's driver
        (``stream_ptr``, its handle as an integer; torch.cuda.ExternalStream): work issued on it
        is queued there. The caller keeps the driver stream alive while it is used."""
        index = _index(device)
        return Stream(stream_id=ext.external_stream(int(stream_ptr), index), device_index=index,
                      device_type=_device_type_id())

    class Event(metaclass=_OnDevice):
        """``Event(enable_timing=False, blocking=False, interprocess=False)``: a torch.Event on
        the current device (record/wait/query/synchronize/elapsed_time)."""

        _base = torch.Event

        def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                    interprocess: bool = False) -> torch.Event:
            return torch.Event(device=torch.device(name, ext.current_device()),
                               enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def current_stream(device: Any = None) -> torch.Stream:
        """The calling thread's current stream on ``device``."""
        sid, index, dtype = ext.current_stream(_index(device))
        return Stream(stream_id=sid, device_index=index, device_type=dtype)

    def default_stream(device: Any = None) -> torch.Stream:
        """The default stream (id 0) of ``device``."""
        index = _index(device)
        return Stream(stream_id=0, device_index=index, device_type=_device_type_id())

    def set_stream(stream: torch.Stream) -> None:
        """Make ``stream`` current on its device for the calling thread."""
        if stream is None:
            return
        ext.set_stream(stream.stream_id, stream.device_index)

    class StreamContext:
        """Context manager selecting ``stream`` (torch.cuda.StreamContext)."""

        def __init__(self, stream: torch.Stream | None) -> None:
            self.stream = stream
            self.prev: torch.Stream | None = None

        def __enter__(self) -> None:
            if self.stream is not None:
                self.prev = current_stream(self.stream.device_index)
                set_stream(self.stream)

        def __exit__(self, *exc: object) -> bool:
            if self.prev is not None:
                set_stream(self.prev)
            return False

    def stream(stream: torch.Stream | None) -> StreamContext:
        """``with torch.<name>.stream(s):`` runs the block with ``s`` current."""
        return StreamContext(stream)

    def _device_type_id() -> int:
        return ext.current_stream(ext.current_device())[2]

    def get_amp_supported_dtype() -> list[torch.dtype]:
        """Dtypes torch.autocast accepts on this device."""
        return list(amp_dtypes)

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        """bfloat16 tensors work (as in every CPU kernel)."""
        return torch.bfloat16 in amp_dtypes

    def host_accessible() -> bool:
        """True when the host can address the device's memory (``Runtime::host_accessible``):
        the zero-copy paths; False takes the copying paths a discrete device takes."""
        return bool(ext.host_accessible())

    def is_async() -> bool:
        """True when the device runs work in queues (``Runtime::async``): ops return before
        they finish, and the host waits only when it reads results or synchronizes."""
        return bool(ext.is_async())

    def _runtime_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy the bytes of ``src`` over those of ``dst`` (contiguous, the same size, on this
        device or the host) with the runtime's own copy, ``Runtime::copy``: what ``accelkit
        doctor`` and the conformance checks probe, since the layer's copies may never call it
        (host-accessible memory is copied by the host)."""
        for t in (dst, src):
            if not t.is_contiguous() or t.device.type not in (name, "cpu"):
                raise ValueError(f"_runtime_copy takes contiguous {name} or cpu tensors, got "
                                 f"{t.device} (contiguous: {t.is_contiguous()})")
        nbytes = src.numel() * src.element_size()
        if dst.numel() * dst.element_size() != nbytes:
            raise ValueError(f"_runtime_copy: {dst.numel() * dst.element_size()} bytes of dst, "
                             f"{nbytes} of src")

        def where(t: torch.Tensor) -> int:
            return -1 if t.device.type == "cpu" else t.device.index

        ext.runtime_copy(dst.data_ptr(), where(dst), src.data_ptr(), where(src), nbytes)

    def _is_compiled() -> bool:
        """The extension is built (it is imported)."""
        return True

    def get_device_name(device: Any = None) -> str:
        """``"<name>:<index>"``."""
        return f"{name}:{_index(device)}"

    # What the module exports, named here (a helper defined above stays private).
    public = (
        is_available, is_initialized, init, device_count, current_device, set_device, device,
        device_of, synchronize, get_rng_state, set_rng_state, get_rng_state_all,
        set_rng_state_all, manual_seed, manual_seed_all, seed, seed_all, initial_seed,
        memory_stats, reset_peak_memory_stats, reset_accumulated_memory_stats,
        reset_max_memory_allocated, mem_get_info, empty_cache, Stream, ExternalStream, Event,
        current_stream,
        default_stream, set_stream, StreamContext, stream, get_amp_supported_dtype,
        is_bf16_supported, host_accessible, is_async, get_device_name,
    )
    # The private names torch reads on a device module (torch.cuda's): _lazy_init before the
    # first tensor, _is_in_bad_fork from DataLoader workers, _initialized through __getattr__,
    # _is_compiled; and accelkit's _runtime_copy, where the extension has it, and the
    # extension's _Hold (a wait in stream order the host releases, which ops.async_launch holds
    # the current stream with), where it has one.
    private = (_lazy_init, _is_in_bad_fork, __getattr__, _is_compiled,
               *((_runtime_copy,) if hasattr(ext, "runtime_copy") else ()))
    names = {f.__name__: f for f in (*public, *private)}
    if hasattr(ext, "_Hold"):
        names["_Hold"] = ext._Hold
    names.update(
        memory_allocated=_stat("allocated_bytes.all.current"),
        max_memory_allocated=_stat("allocated_bytes.all.peak"),
        memory_reserved=_stat("reserved_bytes.all.current"),
        max_memory_reserved=_stat("reserved_bytes.all.peak"),
        default_generators=_LazyGenerators(ext),
    )
    return names


class _LazyGenerators(collections.abc.Sequence):
    """``torch.<name>.default_generators``: each device's default generator."""

    def __init__(self, ext: Any) -> None:
        self._ext = ext

    def __len__(self) -> int:
        return self._ext.device_count()

    def __getitem__(self, i: int) -> torch.Generator:
        if not 0 <= i < len(self):
            raise IndexError(f"device index {i} out of range")
        return self._ext.default_generator(i)
