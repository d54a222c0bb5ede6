"""What a run will do: :func:`make_plan` turns checks x world sizes x expectations into a
:class:`Plan`, without running or probing anything (the same inputs give the same plan). The
pool engine (:mod:`~accelkit.conformance.engine.runner`), the pytest plugin and the torchrun mode
execute plans.

Each :class:`Step` is one check on one world size, with the expectation that applies to it
(``id@N`` before ``id``). A step is *decided* when it will not run, with the outcome and the
reason, in this order: UNAVAILABLE when the backend cannot run here at all; SKIP for an
expectation with ``status = "skip"``; SKIP for a capability the backend does not declare; SKIP
when this host cannot run that many ranks (with a hint when a smaller size the check is
written for fits). Checks not written for any requested world size are *left out* and named.

A simulated check (``simulated=True``) needs one process whatever its world size: the host is
not probed for its sizes; a run that names its area (``--area scale``) runs it at every one of
them, a run of the whole catalogue at its first (the other sizes repeat the same plans, larger:
one run certifies them, not every mode and release), ``--world-size`` picks sizes; a torchrun
launch (whose processes all hold a real process group) SKIPs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from accelkit.conformance.api import CheckDef
from accelkit.conformance.engine.expectations import Expectation, lookup
from accelkit.conformance.outcomes import Outcome
from accelkit.core.spec import BackendSpec


@dataclass(frozen=True)
class Host:
    """What the plan needs to know about the backend on this host (see :func:`probe_host`)."""

    backend: str
    #: Why the backend cannot run here at all, or None.
    unavailable: str | None = None
    #: ``requires`` -> why the backend lacks one of them, or None (``Capabilities.missing``).
    missing: Callable[[tuple[str, ...]], str | None] = lambda requires: None
    #: World size -> why this host cannot run that many ranks, or None.
    problems: Mapping[int, str | None] = field(default_factory=dict)
    #: A torchrun launch: its world size (checks written for another size are SKIPped).
    launch: int | None = None


@dataclass(frozen=True)
class Step:
    """One check to run on ``check.world_size`` ranks, or the reason it does not run."""

    check: CheckDef
    expectation: Expectation | None = None
    decided: tuple[Outcome, str] | None = None

    @property
    def key(self) -> str:
        """``id@N``: the check on N ranks, as reports, expectations and comparisons name it."""
        return f"{self.check.id}@{self.check.world_size}"


@dataclass(frozen=True)
class LeftOut:
    """A selected check not written for any requested world size."""

    id: str
    world_sizes: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    left_out: tuple[LeftOut, ...] = ()


def make_plan(checks: Sequence[CheckDef], expectations: Mapping[str, Expectation], host: Host,
              world_sizes: Sequence[int] = (), areas: Sequence[str] = ()) -> Plan:
    """The plan for ``checks`` (already selected by area and pattern, in their order).

    ``world_sizes`` empty: each check at its own size (or, for a launch, at the launch's size
    when it is written for it; a simulated check of one of ``areas``, the areas the run
    names, at all of its sizes); otherwise each check
    at every one of those sizes it is written for, the others left out. Steps are ordered
    real before simulated, then by world size, then as given.
    """
    runs: list[CheckDef] = []
    left_out = []
    for check in checks:
        if world_sizes:
            sizes = [n for n in sorted(set(world_sizes)) if check.runs_at(n)]
            if not sizes:
                left_out.append(LeftOut(check.id, check.world_sizes))
            runs += [check.at(n) for n in sizes]
        elif check.simulated and check.area in areas:
            runs += [check.at(n) for n in sorted(check.world_sizes)]
        elif host.launch is not None and check.runs_at(host.launch):
            runs.append(check.at(host.launch))
        else:
            runs.append(check)
    order = {c.id: i for i, c in enumerate(checks)}
    runs.sort(key=lambda c: (c.simulated, c.world_size, order[c.id]))
    steps = []
    for check in runs:
        expectation = lookup(expectations, check.id, check.world_size)
        steps.append(Step(check, expectation, _decide(check, expectation, host)))
    return Plan(tuple(steps), tuple(left_out))


def _decide(check: CheckDef, expectation: Expectation | None,
            host: Host) -> tuple[Outcome, str] | None:
    if host.unavailable is not None:
        return Outcome.UNAVAILABLE, f"backend {host.backend!r} cannot run here: {host.unavailable}"
    if expectation is not None and expectation.status == "skip":
        return Outcome.SKIP, f"expected skip: {expectation.reason}"
    missing = host.missing(check.requires)
    if missing:
        return Outcome.SKIP, missing
    if check.simulated:
        if host.launch is not None:
            return Outcome.SKIP, ("simulated: runs in one process on a fake process group, "
                                  "not in a torchrun launch (run `accelkit conformance --area "
                                  f"{check.area}`)")
        return None
    if host.launch is not None and check.world_size != host.launch:
        return Outcome.SKIP, (f"written for {check.world_size} ranks; this launch has "
                              f"{host.launch} (set torchrun's --nnodes x --nproc-per-node to "
                              "match)")
    problem = host.problems.get(check.world_size)
    if problem:
        fits = [n for n in check.world_sizes
                if n < check.world_size and not host.problems.get(n)]
        if fits and host.launch is None:  # a machine with fewer devices: say how to run it
            problem += f"; --world-size {max(fits)} runs it on {max(fits)} ranks"
        return Outcome.SKIP, problem
    return None


def probe_host(spec: BackendSpec, checks: Sequence[CheckDef],
               world_sizes: Sequence[int] = ()) -> Host:
    """Ask ``spec`` (``probe``, ``capabilities``) what :func:`make_plan` needs for ``checks``
    on this host, for every world size they may run at."""
    probes: dict[int, tuple[bool, str]] = {}

    def probe(n: int) -> tuple[bool, str]:
        if n not in probes:
            try:
                probes[n] = spec.probe(n)
            except Exception as exc:  # a probe that raises means "cannot run here"
                probes[n] = (False, f"probe failed: {type(exc).__name__}: {exc}")
        return probes[n]

    ok, reason = probe(1)
    sizes = {n for c in checks if not c.simulated for n in c.world_sizes} | set(world_sizes)
    problems = {}
    for n in sorted(sizes):
        most = spec.capabilities.max_world_size
        if most is not None and n > most:
            problems[n] = f"{n} devices needed, {most} present"
        else:
            fits, why = probe(n) if ok else (True, "")
            problems[n] = None if fits else why
    return Host(backend=spec.name, unavailable=None if ok else reason,
                missing=lambda requires: spec.capabilities.missing(requires, spec.device_type),
                problems=problems)


def with_launch(host: Host, launch: int, problem: str | None) -> Host:
    """``host`` for a torchrun launch of ``launch`` ranks whose node cannot run them when
    ``problem`` says why."""
    return replace(host, launch=launch, problems={launch: problem})
