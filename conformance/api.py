"""How a conformance check is written: the :func:`check` decorator and :class:`CheckContext`.

A check is a function ``fn(ctx)`` run SPMD on every rank of a worker pool whose default
process group is already initialised on the backend. ``assert`` failures are FAIL, other
exceptions ERROR, ``ctx.skip(reason)`` SKIP. Its docstring states the behaviour checked and
where it comes from (a PyTorch PR number or the torch API).

    @check("devicemesh.mesh_1d", world_size=4)
    def mesh_1d(ctx):
        \"\"\"init_device_mesh builds a 1-D mesh over all ranks (PR 102336).\"\"\"
        mesh = ctx.mesh((ctx.world_size,))
        assert mesh.get_group().size() == ctx.world_size
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from accelkit.core.spec import REQUIREMENTS

if TYPE_CHECKING:
    import torch
    from accelkit.core.spec import BackendSpec


class Skip(Exception):
    """Raised by a check (through ``ctx.skip``) when it cannot run here; carries the reason."""


@dataclass(frozen=True)
class CheckDef:
    """A registered check: its id (``area.name``), what it needs, and the function."""

    id: str
    fn: Callable[[CheckContext], Any] = field(compare=False, repr=False)
    world_size: int = 4
    requires: tuple[str, ...] = ()
    timeout: float | None = None
    doc: str = ""
    #: Other world sizes the check is written and verified for (``--world-size N`` runs it there).
    also_at: tuple[int, ...] = ()

    @property
    def world_sizes(self) -> tuple[int, ...]:
        """Every world size the check runs at; the first is its default."""
        return (self.world_size, *self.also_at)

    def at(self, world_size: int) -> CheckDef:
        """This check to be run on ``world_size`` ranks (one of :attr:`world_sizes`, which it
        keeps: the others become ``also_at``)."""
        if world_size not in self.world_sizes:
            raise ValueError(f"check {self.id!r} is written for world sizes {list(self.world_sizes)}, "
                             f"not {world_size}")
        others = tuple(n for n in self.world_sizes if n != world_size)
        return replace(self, world_size=world_size, also_at=others)

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.id.split(".", 1)[1]

    @property
    def module(self) -> str:
        return self.fn.__module__

    @property
    def qualname(self) -> str:
        return self.fn.__qualname__


#: Every check defined so far, by id (filled at import time by :func:`check`).
CHECKS: dict[str, CheckDef] = {}


def check(id: str, *, world_size: int = 4, also_at: tuple[int, ...] = (),
          requires: tuple[str, ...] | list[str] = (),
          timeout: float | None = None) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the check ``id`` (``area.name``) run on ``world_size`` ranks.

    ``also_at`` lists other world sizes the check is written for (it reads
    ``ctx.world_size``) and has been verified at: ``--world-size N`` and a torchrun launch of N
    ranks run it there, so a machine with 2 devices or a launch of 8 ranks still gets a report.
    ``requires`` names capabilities from :data:`accelkit.core.spec.REQUIREMENTS`; a backend
    lacking one gets SKIP with the reason. ``timeout`` overrides the run's per-check budget.
    """
    if id.count(".") < 1 or not all(part.isidentifier() for part in id.split(".")):
        raise ValueError(f"check id {id!r} must look like 'area.name' (identifiers joined by '.')")
    unknown = [r for r in requires if r not in REQUIREMENTS]
    if unknown:
        raise ValueError(f"check {id!r} requires unknown capabilities {unknown}; "
                         f"known: {', '.join(REQUIREMENTS)}")
    if world_size < 1 or any(n < 1 for n in also_at) or world_size in also_at:
        raise ValueError(f"check {id!r}: world sizes must be >= 1 and also_at must not repeat "
                         f"world_size, got world_size={world_size}, also_at={also_at}")

    def decorate(fn: Callable) -> Callable:
        doc = inspect.getdoc(fn) or ""
        if not doc:
            raise ValueError(f"check {id!r} ({fn.__module__}.{fn.__qualname__}) needs a docstring "
                             "stating the behaviour checked and its source")
        existing = CHECKS.get(id)
        if existing is not None and (existing.module, existing.qualname) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"check id {id!r} defined twice: {existing.module}.{existing.qualname} "
                             f"and {fn.__module__}.{fn.__qualname__}")
        CHECKS[id] = CheckDef(id=id, fn=fn, world_size=world_size, requires=tuple(requires),
                              timeout=timeout, doc=doc, also_at=tuple(also_at))
        return fn

    return decorate


class CheckContext:
    """What a check sees on one rank: its rank, the backend, its device, helpers."""

    def __init__(self, *, rank: int, world_size: int, local_rank: int, spec: BackendSpec) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.spec = spec

    @property
    def device_type(self) -> str:
        return self.spec.device_type

    @property
    def device(self) -> torch.device:
        """This rank's device (``cpu`` on the cpu backend, ``<type>:<local_rank>`` otherwise)."""
        import torch

        if self.spec.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.spec.device_type, self.local_rank)

    def mesh(self, shape: tuple[int, ...], names: tuple[str, ...] | None = None):
        """``init_device_mesh`` on this backend's device type."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.spec.device_type, tuple(shape), mesh_dim_names=names)

    def skip(self, reason: str) -> None:
        raise Skip(reason)
