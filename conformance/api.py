"""How a conformance check is written: the :func:`check` decorator and :class:`CheckContext`.

A check is a function ``fn(ctx)`` run SPMD on every rank of a worker pool whose default
process group is already initialised on the backend. ``assert`` failures are FAIL, other
exceptions ERROR, ``ctx.skip(reason)`` SKIP. Its docstring states the behaviour checked and
where it comes from (a PyTorch PR number or the torch API).

Its id is ``area.name``: the area is the module's name (``conformance/checks/devicemesh.py``
holds the ``devicemesh`` checks), the name the function's. What a module's checks share (the
world sizes they are written for, the capabilities they need) is said once, in a module-level
``CHECK_DEFAULTS`` before the first check, as pytest modules say it in ``pytestmark``; a
check's own arguments replace a default::

    from accelkit.conformance.api import Defaults, check

    CHECK_DEFAULTS = Defaults(also_at=(2, 8))

    @check
    def mesh_1d(ctx):
        \"\"\"init_device_mesh builds a 1-D mesh over all ranks (PR 102336).\"\"\"
        mesh = ctx.mesh((ctx.world_size,))
        assert mesh.get_group().size() == ctx.world_size

    @check(world_size=8, also_at=())
    def mesh_3d(ctx):
        ...
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from accelkit.conformance.reports.coverage import CONTRACT
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
    #: Runs in one process on torch's fake process group of ``world_size`` ranks (see
    #: :mod:`accelkit.conformance.launchers.simulate`), not on ``world_size`` real processes.
    simulated: bool = False
    #: Written against ``ctx.world_size`` for any number of ranks from 2 up (verified at 3
    #: besides its sizes): ``--world-size N`` and a launch of N ranks run it at any N.
    any_world_size: bool = False
    #: The module's defaults it was declared under.
    defaults: Defaults | None = field(default=None, compare=False, repr=False)
    #: Contract items (:data:`accelkit.conformance.reports.coverage.CONTRACT`) the check fails on when a
    #: backend ignores them.
    covers: tuple[str, ...] = ()

    @property
    def world_sizes(self) -> tuple[int, ...]:
        """Every world size the check runs at; the first is its default."""
        return (self.world_size, *self.also_at)

    def runs_at(self, world_size: int) -> bool:
        """Whether the check is written for ``world_size`` ranks (one of :attr:`world_sizes`,
        or any from 2 up for an ``any_world_size`` check)."""
        return world_size in self.world_sizes or (self.any_world_size and world_size >= 2)

    def at(self, world_size: int) -> CheckDef:
        """This check to be run on ``world_size`` ranks (one it :meth:`runs_at`); it keeps
        the sizes it is written for: the others become ``also_at``."""
        if world_size == self.world_size:
            return self
        if not self.runs_at(world_size):
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

#: The module-level name a check module gives its :class:`Defaults`.
DEFAULTS_NAME = "CHECK_DEFAULTS"


@dataclass(frozen=True)
class Defaults:
    """What the checks of one module share (the module-level ``CHECK_DEFAULTS``): ``area``
    (default: the module's name), ``world_size`` (default 4), ``also_at``, ``requires`` and
    ``timeout``, ``simulated`` and ``any_world_size`` as in :func:`check`, whose arguments replace them for one check."""

    area: str | None = None
    world_size: int = 4
    also_at: tuple[int, ...] = ()
    requires: tuple[str, ...] = ()
    timeout: float | None = None
    simulated: bool = False
    any_world_size: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "also_at", tuple(self.also_at))
        object.__setattr__(self, "requires", tuple(self.requires))
        if self.area is not None and not self.area.isidentifier():
            raise ValueError(f"Defaults(area={self.area!r}): an area is a Python identifier")


_SETTINGS = tuple(f.name for f in fields(Defaults) if f.name != "area")
_MISSING: Any = object()


def check(fn: Callable | None = None, *, world_size: int = _MISSING, also_at: tuple[int, ...] = _MISSING,
          requires: tuple[str, ...] | list[str] = _MISSING,
          timeout: float | None = _MISSING, simulated: bool = _MISSING,
          any_world_size: bool = _MISSING, covers: tuple[str, ...] | list[str] = ()) -> Callable:
    """Register ``fn`` as the check ``<area>.<fn name>``: ``@check`` or ``@check(...)``.

    ``world_size`` is the number of ranks it runs on by default (4). ``also_at`` lists other
    world sizes the check is written for (it reads ``ctx.world_size``) and has been verified
    at: ``--world-size N`` and a torchrun launch of N ranks run it there, so a machine with 2
    devices or a launch of 8 ranks still gets a report. ``requires`` names capabilities from
    :data:`accelkit.core.spec.REQUIREMENTS`; a backend lacking one gets SKIP with the reason.
    ``timeout`` overrides the run's per-check budget. ``simulated=True`` runs it in one
    process on torch's fake process group of each of its world sizes (all of them by
    default), as rank 0 of that many (:mod:`accelkit.conformance.launchers.simulate`): reports show
    those results apart from the real ones. ``any_world_size=True`` says it is written
    against ``ctx.world_size`` for any number of ranks from 2 up (and verified at an odd
    size): ``--world-size N`` and a torchrun launch of N ranks run it at every N. Each
    argument given replaces the module's ``CHECK_DEFAULTS`` for this check. ``covers`` names
    the items of the device-handle and c10d contract
    (:data:`accelkit.conformance.reports.coverage.CONTRACT`) the check fails on when a backend ignores
    them; ``docs/coverage.md`` is the table they make.
    """
    if isinstance(fn, str):
        raise TypeError(
            f"@check({fn!r}): a check's id is <module name>.<function name>; write @check (or "
            "@check(world_size=..., ...)) in the module of its area, e.g. "
            "conformance/checks/<area>.py")
    given = {k: v for k, v in (("world_size", world_size), ("also_at", also_at),
                               ("requires", requires), ("timeout", timeout),
                               ("simulated", simulated), ("any_world_size", any_world_size))
             if v is not _MISSING}

    def decorate(fn: Callable) -> Callable:
        _register(fn, given, tuple(covers))
        return fn

    return decorate if fn is None else decorate(fn)


def _module_defaults(fn: Callable) -> Defaults:
    defaults = fn.__globals__.get(DEFAULTS_NAME, Defaults())
    if not isinstance(defaults, Defaults):
        raise TypeError(f"{fn.__module__}.{DEFAULTS_NAME} is a {type(defaults).__name__}; "
                        "make it accelkit.conformance.api.Defaults(...)")
    return defaults


def _register(fn: Callable, given: dict[str, Any], covers: tuple[str, ...] = ()) -> None:
    defaults = _module_defaults(fn)
    settings = {name: getattr(defaults, name) for name in _SETTINGS} | given
    area = defaults.area or fn.__module__.rsplit(".", 1)[-1]
    check_id = f"{area}.{fn.__name__}"
    where = f"{fn.__module__}.{fn.__qualname__}"
    requires, also_at = tuple(settings["requires"]), tuple(settings["also_at"])
    world_size = settings["world_size"]
    if not area.isidentifier():
        raise ValueError(f"check {where}: its area {area!r} (the module's name) is not an "
                         f"identifier; set {DEFAULTS_NAME} = Defaults(area=...)")
    unknown = [r for r in requires if r not in REQUIREMENTS]
    if unknown:
        raise ValueError(f"check {check_id!r} requires unknown capabilities {unknown}; "
                         f"known: {', '.join(REQUIREMENTS)}")
    if world_size < 1 or any(n < 1 for n in also_at) or world_size in also_at:
        raise ValueError(f"check {check_id!r}: world sizes must be >= 1 and also_at must not "
                         f"repeat world_size, got world_size={world_size}, also_at={also_at}")
    unknown = [item for item in covers if item not in CONTRACT]
    if unknown:
        raise ValueError(f"check {check_id!r} covers unknown contract items {unknown}; known: "
                         "accelkit.conformance.reports.coverage.CONTRACT")
    doc = inspect.getdoc(fn) or ""
    if not doc:
        raise ValueError(f"check {check_id!r} ({where}) needs a docstring stating the behaviour "
                         "checked and its source")
    existing = CHECKS.get(check_id)
    if existing is not None and (existing.module, existing.qualname) != (fn.__module__, fn.__qualname__):
        raise ValueError(f"check id {check_id!r} defined twice: {existing.module}.{existing.qualname} "
                         f"and {where}")
    CHECKS[check_id] = CheckDef(id=check_id, fn=fn, world_size=world_size, requires=requires,
                                timeout=settings["timeout"], doc=doc, also_at=also_at,
                                simulated=bool(settings["simulated"]),
                                any_world_size=bool(settings["any_world_size"]), defaults=defaults,
                                covers=covers)


def forget(module_name: str) -> None:
    """Drop the checks of ``module_name`` (a module that failed to import)."""
    for check_id in [cid for cid, c in CHECKS.items() if c.module == module_name]:
        del CHECKS[check_id]


def verify_defaults(module_name: str) -> None:
    """After importing ``module_name``: its ``CHECK_DEFAULTS`` is the one its checks were
    registered with (it must come before the first ``@check``, not after)."""
    module = sys.modules[module_name]
    final = getattr(module, DEFAULTS_NAME, None)
    for c in CHECKS.values():
        if c.module == module_name and final is not None and c.defaults is not final:
            raise ValueError(f"{module_name}: {DEFAULTS_NAME} is set after @check {c.id!r}; "
                             "set it before the first check of the module")


class CheckContext:
    """What a check sees on one rank: its rank, the backend, its device, helpers."""

    def __init__(self, *, rank: int, world_size: int, local_rank: int, spec: BackendSpec) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.spec = spec
        #: The check's table: dicts it appends (one per case checked, e.g. an op and a dtype)
        #: travel with its result to the reports; the engine judges rows whose ``status`` is
        #: ``fail`` or ``error`` against the expectations' ``[ops]`` table.
        self.rows: list[dict] = []

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
