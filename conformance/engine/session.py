"""What a run needs before it is planned: the backend, the checks, the expectations.

:func:`resolve` turns :class:`~accelkit.conformance.engine.options.Options` into a :class:`Session`,
or raises :class:`UsageError` (bad input, printed by the entry points; exit 2). A backend whose
own code cannot be imported (the catalogue imports torch, and torch imports the vendor package
through its ``torch.backends`` entry point) is :class:`LoadError`, which carries the real
exception so that the report can say what failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from accelkit.conformance.api import CheckDef
from accelkit.conformance.engine import expectations as expectations_mod
from accelkit.conformance.engine import loader
from accelkit.conformance.engine.expectations import Expectation, OpExpectation
from accelkit.conformance.engine.options import Options
from accelkit.core.spec import BackendSpec
from accelkit.core.versions import torch_version


class UsageError(Exception):
    """Bad input (options, expectations file, check module); printed, exit code 2."""


class LoadError(UsageError):
    """The checks cannot be imported (often: the backend's extension fails when torch loads
    it); the reports are still written, with ``cause``, the real exception."""

    def __init__(self, message: str, spec: BackendSpec, cause: BaseException) -> None:
        super().__init__(message)
        self.spec = spec
        self.cause = cause


@dataclass
class Session:
    spec: BackendSpec
    options: Options                       # the run's, ``expectations`` naming the file used
    checks: dict[str, CheckDef]            # every check known (for expectations and ids)
    selected: list[CheckDef]               # after --area and -k, each at its default size
    expectations: dict[str, Expectation] = field(default_factory=dict)
    ops: dict[str, OpExpectation] = field(default_factory=dict)  # the file's [ops] entries


def backend_spec(name: str) -> BackendSpec:
    from accelkit.core import registry

    try:
        return registry.get(name)
    except registry.BackendRegistryError as exc:
        raise UsageError(str(exc)) from None


def resolve(options: Options) -> Session:
    """The session for ``options`` (which it leaves as they are: the session's own name the
    expectations file used), its expectations file read once; UsageError on bad input,
    LoadError when the checks (or the backend they import) cannot be imported."""
    problem = options.problem()
    if problem:
        raise UsageError(problem)
    spec = backend_spec(options.backend)
    try:
        checks = loader.load(options.modules, builtin=options.builtin)
    except loader.CheckLoadError as exc:
        raise LoadError(str(exc), spec, exc.__cause__ or exc) from exc
    areas = sorted({c.area for c in checks.values()})
    unknown = [a for a in options.areas if a not in areas]
    if unknown:
        raise UsageError(f"unknown area(s) {', '.join(unknown)}; known: "
                         f"{', '.join(areas) or '(none)'}")
    selected = loader.select(checks, areas=options.areas, patterns=options.patterns)
    sizes = set(options.world_sizes)
    if sizes and not any(c.runs_at(n) for c in selected for n in sizes):
        selected = []  # every selected check would be left out
    if not selected:
        raise UsageError(_nothing_selected(options, checks))
    path = options.expectations or (str(spec.expectations) if spec.expectations and options.builtin
                                    else None)
    expectations, ops = {}, {}
    if path:
        try:
            expectations = expectations_mod.load(path, checks, torch_version())
            # [ops] names are checked against torch's op_db (when the run has the ops area)
            ops = expectations_mod.load_ops(
                path, _op_names if any(c.area == "ops" for c in selected) else None,
                torch_version())
        except expectations_mod.ExpectationsError as exc:
            raise UsageError(str(exc)) from None
    return Session(spec, replace(options, expectations=path), checks, selected, expectations, ops)


def _op_names() -> set[str]:
    from accelkit.conformance.checks._opinfo import op_names

    return op_names()


def _nothing_selected(options: Options, checks: dict[str, CheckDef]) -> str:
    parts = [f"area {a}" for a in options.areas] + [f"-k {p}" for p in options.patterns]
    parts += [f"world size {n}" for n in options.world_sizes]
    sizes = sorted({n for c in checks.values() for n in c.world_sizes})
    return (f"no check matches {', '.join(parts) or 'anything'} "
            f"({len(checks)} checks known, world sizes {sizes}); try --list without filters")
