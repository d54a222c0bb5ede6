"""The private torch internals accelkit relies on, in one place.

The conformance engine puts every rank back into a known state before each check, and the
device-handle checker restores every generator ``torch.manual_seed`` touches; torch has no
public API for either, so both reach into torch's private state here and nowhere else. Each
function names what it touches. They were verified on the torch releases in
:data:`VERIFIED_ON`; moving to another torch means re-reading each of them against its source
(``tests/test_torch_internals.py`` fails until :data:`VERIFIED_ON` names the new release).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

#: torch releases (major.minor) these functions were read against and tested on.
VERIFIED_ON: tuple[str, ...] = ("2.13",)

#: torch's built-in accelerator modules that ``torch.manual_seed`` seeds (``torch.random``).
_SEEDED_BY_MANUAL_SEED = ("cuda", "xpu", "mtia")


def privateuse1_name() -> str:
    """The name PrivateUse1 is renamed to (``privateuseone`` before any rename):
    ``torch._C._get_privateuse1_backend_name``."""
    import torch

    return torch._C._get_privateuse1_backend_name()


def default_store():
    """The default process group's store: ``distributed_c10d._get_default_store``."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def destroy_groups_but_the_default() -> int:
    """Destroy every process group but the default one (c10d keeps them in
    ``distributed_c10d._world.pg_map``); returns how many there were."""
    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()
    stale = [pg for pg in c10d._world.pg_map if pg is not default]
    for pg in stale:
        c10d.destroy_process_group(pg)
    return len(stale)


def clear_sharding_caches(device=None) -> None:
    """Clear DTensor's sharding-propagation caches
    (``torch.distributed.tensor.debug._clear_sharding_prop_cache``). DeviceMesh equality ignores
    process groups, so a cached sharding would hand a later mesh equal to a destroyed one the
    destroyed groups ("Could not resolve the process group"). The Python cache is per thread
    (``_sharding_prop.LocalLRUCache`` is a ``threading.local``): it is cleared on this thread
    and, when ``device`` (a ``torch.device``) is given, through a one-node backward on the
    autograd engine's thread for that device, where backward ops on its tensors run."""
    import torch
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    if device is None:
        return

    class ClearInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            _clear_sharding_prop_cache()
            return grad

    ClearInBackward.apply(torch.zeros((), device=device, requires_grad=True)).backward()


def group_counter() -> int:
    """c10d's counter that names the next ``new_group`` (``distributed_c10d._world.group_count``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._world.group_count


def raise_group_counter(value: int) -> None:
    """Move c10d's group counter up to ``value`` (every rank agreeing on it keeps the next
    group's name the same everywhere)."""
    from torch.distributed import distributed_c10d

    world = distributed_c10d._world
    world.group_count = max(world.group_count, value)


def leave_ambient_meshes() -> None:
    """Forget every ``with mesh:`` still entered: ``device_mesh._mesh_resources.mesh_stack``
    (PR 134247)."""
    from torch.distributed import device_mesh

    device_mesh._mesh_resources.mesh_stack.clear()


def drop_rng_tracker() -> None:
    """Drop DTensor's RNG tracker, so the next random DTensor op makes a new one:
    ``torch.distributed.tensor._random._rng_tracker`` (PR 103235)."""
    from torch.distributed.tensor import _random

    _random._rng_tracker = None


def preload_distributed() -> None:
    """Import what the first DTensor/DeviceMesh check would (``device_mesh`` and
    ``torch.distributed.tensor._random``), so its time is not charged to that check."""
    import torch.distributed.device_mesh  # noqa: F401
    import torch.distributed.tensor._random  # noqa: F401


@contextmanager
def generators_kept() -> Iterator[None]:
    """Run the block, then put back every generator ``torch.manual_seed`` reseeds besides a
    PrivateUse1 device's (the caller restores that one): the CPU's, and cuda's, xpu's and
    mtia's (their states when initialised, else the seed queued for their lazy init:
    ``<module>._lazy_seed_tracker``), and mps's when present."""
    import torch

    cpu = torch.get_rng_state()
    kept = []
    for name in _SEEDED_BY_MANUAL_SEED:
        module = getattr(torch, name)
        if module.is_initialized():
            kept.append((module, "states", module.get_rng_state_all()))
        else:
            kept.append((module, "queued", copy.copy(module._lazy_seed_tracker)))
    mps = torch.mps.get_rng_state() if torch.backends.mps.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        for module, kind, value in kept:
            if kind == "states":
                module.set_rng_state_all(value)
            else:
                module._lazy_seed_tracker = value
        if mps is not None:
            torch.mps.set_rng_state(mps)
