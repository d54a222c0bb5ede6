"""The record of a conformance run: :class:`RunReport`, what every report file, the terminal
summary and ``accelkit compare`` are made from. The engines fill it; the writers
(:mod:`~accelkit.conformance.reports.files`) only read it.
"""

from __future__ import annotations

import datetime
import platform
import traceback
from dataclasses import dataclass, field
from importlib import metadata

from accelkit.conformance.engine.options import Options
from accelkit.conformance.engine.plan import LeftOut
from accelkit.conformance.outcomes import FAILING, CheckResult, Outcome
from accelkit.core.spec import BackendSpec


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions(spec: BackendSpec) -> dict:
    """accelkit's, torch's (and what it was built for: CPU, CUDA x.y) and Python's versions,
    and the distribution that provides the backend (name and version), read from the
    installed metadata (nothing imported)."""
    from accelkit.core import registry

    dist = registry.distribution(spec.name)
    from accelkit.core.versions import torch_build

    return {"accelkit": _version("accelkit"), "torch": _version("torch"),
            "torch_build": torch_build(), "python": platform.python_version(),
            "backend_distribution": {"name": dist, "version": _version(dist)} if dist else None}


def backend_settings(spec: BackendSpec) -> dict:
    """``spec.settings()``: the backend's settings and modes that shape a run (e.g. the mock's
    ``ACCELKIT_MOCK_*`` switches); a failure is recorded, never raised."""
    if spec.settings is None:
        return {}
    try:
        return {str(k): str(v) for k, v in dict(spec.settings()).items()}
    except Exception as exc:
        return {"<settings() failed>": f"{type(exc).__name__}: {exc}"}


def describe_exception(exc: BaseException) -> str:
    """The whole exception: type, message and traceback, with every ``__cause__`` and
    ``__context__`` (e.g. the error behind torch's "Failed to load the backend extension")."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunReport:
    """A finished (or interrupted, or failed-to-start) run."""

    spec: BackendSpec
    options: Options
    results: list[CheckResult] = field(default_factory=list)
    device: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    started: str = field(default_factory=now)
    duration_s: float = 0.0
    pool_starts: list[dict] = field(default_factory=list)
    unavailable: str | None = None
    aborted: str | None = None  # why the run stopped early (Ctrl-C, torchrun TIMEOUT/CRASH)
    error: str | None = None    # why no check could run at all (the checks did not import)
    left_out: list[LeftOut] = field(default_factory=list)  # not written for --world-size
    mode: str = "pool"          # "pool" (accelkit conformance), "pytest" or "torchrun"
    host: str = field(default_factory=platform.node)  # the machine rank 0 (the engine) ran on
    #: The hosts of a launch's ranks, hostname -> ranks (torchrun mode: each rank publishes its
    #: own); empty: every rank ran on ``host`` (pool and pytest modes). See :meth:`rank_hosts`.
    hosts: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def start(cls, spec: BackendSpec, options: Options, **fields) -> RunReport:
        """A report for a run starting now, with the versions and the backend's settings."""
        return cls(spec=spec, options=options, versions=versions(spec),
                   settings=backend_settings(spec), **fields)

    @property
    def world_sizes(self) -> list[int]:
        """The world sizes checks ran at on real processes."""
        return sorted({r.world_size for r in self.results if not r.simulated})

    def rank_hosts(self) -> dict[str, list[int]]:
        """Every host the run's ranks ran on, with its ranks (sorted; hosts by their first
        rank): the launch's hosts, or ``host`` with every rank of the largest world size a
        check ran at on real processes (none when no check ran)."""
        if self.hosts:
            return dict(sorted(((h, sorted(r)) for h, r in self.hosts.items()),
                               key=lambda item: (min(item[1], default=0), item[0])))
        ran = [r.world_size for r in self.results if r.ranks and not r.simulated]
        return {self.host: list(range(max(ran, default=0)))}

    @property
    def simulated_world_sizes(self) -> list[int]:
        """The world sizes checks ran at simulated in one process on a fake process group."""
        return sorted({r.world_size for r in self.results if r.simulated})

    def counts(self, results: list[CheckResult] | None = None) -> dict[str, int]:
        chosen = self.results if results is None else results
        counts = {o.value: 0 for o in Outcome}
        for r in chosen:
            counts[r.outcome.value] += 1
        counts["total"] = len(chosen)
        return counts

    def by_area(self) -> dict[str, list[CheckResult]]:
        areas: dict[str, list[CheckResult]] = {}
        for r in self.results:
            areas.setdefault(r.area, []).append(r)
        return areas

    def failed(self) -> list[CheckResult]:
        """The results that make the run fail (and the exit code non-zero)."""
        bad = set(FAILING) | ({Outcome.XPASS} if self.options.strict else set())
        return [r for r in self.results if r.outcome in bad]

    def nothing_ran(self) -> bool:
        """Whether a run on an available backend finished without running any check (every
        one SKIPped, or none planned): it does not pass, it says so."""
        if self.unavailable is not None or self.error is not None or self.aborted is not None:
            return False
        return all(r.outcome in (Outcome.SKIP, Outcome.UNAVAILABLE) for r in self.results)

    def ok(self) -> bool:
        """Whether the run passes (exit code 0): nothing failed, and some check ran."""
        return (not self.failed() and self.aborted is None and self.error is None
                and not self.nothing_ran())
