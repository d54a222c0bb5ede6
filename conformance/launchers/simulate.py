"""Simulated ranks: a check declared ``simulated=True`` runs in one process, as rank 0 of a
world of ``world_size`` ranks, on torch's fake process group
(``torch.testing._internal.distributed.fake_pg``, backend ``"fake"``: groups of any size whose
collectives return without communicating). What scales with the world size without moving
data (DeviceMesh layouts and sub-groups, DTensor placements and redistribute plans,
``parallelize_module`` and ``fully_shard`` plans, the RNG tracker's offsets) is checked at
sizes no host has processes for.

torch 2.13 registers the fake backend for cpu, cuda, hpu and xpu only
(``fake_pg.py``, ``Backend.register_backend(..., devices=[...])``): :func:`fake_world` adds
the device under test to its devices, so meshes on that device type get fake groups.

The engine runs a simulated check on a pool of one worker (:class:`~accelkit.conformance.launchers.pool.Pool`
with ``simulate=N``) that has no real process group; :func:`fake_world` gives the check its
fake default group for the duration of the check.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from accelkit.core import torch_internals

#: The backend name torch registers the fake process group under (``dist.Backend.FAKE``).
FAKE = "fake"


def register_fake_backend(device_type: str) -> None:
    """Make torch's fake process group serve ``device_type`` (besides the devices torch
    registers it for); idempotent."""
    import torch.distributed as dist

    devices = list(dist.Backend.backend_capability.get(FAKE, []))
    if device_type not in devices:
        dist.Backend.register_backend(FAKE, torch_internals.fake_group_creator(),
                                      extended_api=True, devices=[*devices, device_type])


@contextmanager
def fake_world(device_type: str, world_size: int, rank: int = 0) -> Iterator[None]:
    """The default process group is a fake one of ``world_size`` ranks (this process is
    ``rank``) for the block, on ``device_type`` and cpu; destroyed afterwards with every
    group made from it, and DTensor's sharding caches cleared (a cached sharding would hand
    the next world's equal mesh these destroyed groups:
    :func:`accelkit.core.torch_internals.clear_sharding_caches`). Refuses to replace a real
    default group."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(
            "a simulated check needs a process without a default process group; this one has "
            f"{dist.get_backend()!r} of {dist.get_world_size()} ranks (run simulated checks "
            "through `accelkit conformance`, which gives them their own worker)")
    register_fake_backend(device_type)
    dist.init_process_group(FAKE, store=torch_internals.fake_store(), rank=rank,
                            world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        torch_internals.clear_sharding_caches(_device(device_type))


def _device(device_type: str):
    """This process's current device of ``device_type`` (None for cpu)."""
    import torch

    if device_type == "cpu":
        return None
    return torch.device(device_type, getattr(torch, device_type).current_device())
