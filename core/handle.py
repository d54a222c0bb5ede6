"""The contract of a device handle: the module ``torch.<device>`` that torch's distributed
stack calls for a cuda-like device (PR 102468 made DeviceMesh/DTensor use it instead of
``torch.cuda``; PR 103235's RNG tracker reads its RNG state).

Every member below was found by reading the torch 2.13 sources that call it; its one-line
docstring names the caller. :func:`accelkit.core.check_device_handle` probes the behaviour.
Besides these methods torch reads one attribute, ``_initialized`` (True once the device is
initialised, as ``torch.cuda._initialized``): ``torch.utils.checkpoint`` preserves the device's
RNG state across a recompute only when it is True; the checker probes it too.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

#: How a device may be named where torch passes one: ``0``, ``"mock:0"``, ``"mock"`` or
#: ``torch.device("mock:0")`` (``torch.random.fork_rng`` passes whatever it was given).
DeviceArg = Any


#: Members torch calls only on a PrivateUse1 device's module (built-in devices such as cuda
#: take another path): ``torch.autocast`` asks it for the supported dtypes.
PRIVATEUSE1_ONLY: frozenset[str] = frozenset({"get_amp_supported_dtype"})


@runtime_checkable
class DeviceHandle(Protocol):
    """What ``torch.<device>`` must provide for DeviceMesh, DTensor, the DTensor RNG tracker,
    ``torch.random.fork_rng``, ``torch.manual_seed`` and ``torch.accelerator``."""

    def is_available(self) -> bool:
        """torch.accelerator.is_available, DTensor's _RNGStateTracker.__init__, torch._utils._get_available_device_type."""

    def is_initialized(self) -> bool:
        """DeviceMesh._setup_world_group_and_device: sets the device only while this is False."""

    def device_count(self) -> int:
        """DeviceMesh device selection (rank % count), DTensor _random._resolve_device, fork_rng(devices=None), torch.accelerator.device_count."""

    def current_device(self) -> int:
        """torch._utils._get_current_device_index (DTensor/FSDP default device), FSDP _init_utils."""

    def set_device(self, device: DeviceArg) -> None:
        """DeviceMesh._setup_world_group_and_device: set_device(LOCAL_RANK or rank % device_count())."""

    def synchronize(self, device: DeviceArg = None) -> None:
        """FSDP state-dict / optimizer-state utilities (torch.distributed.fsdp._state_dict_utils)."""

    def get_rng_state(self, device: DeviceArg = None) -> Any:
        """OffsetBasedRNGTracker._get_device_state (16-byte Philox seed+offset), torch.random.fork_rng."""

    def set_rng_state(self, new_state: Any, device: DeviceArg = None) -> None:
        """OffsetBasedRNGTracker._distribute_region / _set_device_state, fork_rng; its presence is is_rng_supported_mesh."""

    def manual_seed(self, seed: int) -> None:
        """The cuda-like per-device seeding API (torch.cuda.manual_seed); seeds the current device."""

    def manual_seed_all(self, seed: int) -> None:
        """torch.manual_seed / torch.random.seed via torch.random._seed_custom_device (needs _is_in_bad_fork too)."""

    def initial_seed(self) -> int:
        """The cuda-like API (torch.cuda.initial_seed): the seed of the current device's generator."""

    def _is_in_bad_fork(self) -> bool:
        """torch.manual_seed via torch.random._seed_custom_device (skips the device when absent)."""

    def _lazy_init(self) -> None:
        """torch's C++ device_lazy_init: the first tensor on the device (Tensor.to, torch.empty(device=))."""

    def get_amp_supported_dtype(self) -> list[Any]:
        """torch.autocast(device_type=<device>) (e.g. distribute_module with a dtype cast)."""


@runtime_checkable
class StreamDeviceHandle(DeviceHandle, Protocol):
    """Stream members FSDP (``fully_shard``) and DCP's filesystem writer call on top of
    :class:`DeviceHandle`; DeviceMesh, DTensor and tensor parallelism do not need them."""

    def Stream(self, device: DeviceArg = None) -> Any:  # noqa: N802  (a class, as torch.cuda.Stream)
        """FSDP's unshard / reduce-scatter streams (_fsdp_param_group, _runtime_utils)."""

    def Event(self) -> Any:  # noqa: N802  (a class, as torch.cuda.Event)
        """FSDP's stream synchronisation (_fsdp_param_group, _runtime_utils)."""

    def current_stream(self, device: DeviceArg = None) -> Any:
        """FSDP (_fsdp_collectives, _flat_param), torch.distributed.checkpoint.filesystem."""

    def stream(self, stream: Any) -> Any:
        """FSDP (_fsdp_collectives, _runtime_utils), tensor.parallel.fsdp, DCP filesystem."""


def members(protocol: type) -> dict[str, str]:
    """``{member: one-line docstring naming its torch caller}`` declared by ``protocol`` itself
    (not its bases), in declaration order."""
    return {name: value.__doc__.strip() for name, value in vars(protocol).items()
            if callable(value) and not name.startswith("__")}
