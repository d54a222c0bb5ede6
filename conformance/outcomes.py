"""The vocabulary of results: a check's :class:`Outcome`, a rank's :class:`RankStatus`, and
the records they live in (:class:`RankResult`, one rank's answer; :class:`CheckResult`, the
check's). How rank results and expectations become a check's outcome is decided in one place,
:func:`accelkit.conformance.engine.verdict.verdict`.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field


class Outcome(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    SKIP = "skip"
    XFAIL = "xfail"
    XPASS = "xpass"
    UNAVAILABLE = "unavailable"

    @property
    def label(self) -> str:
        return self.name


#: Outcomes an ``xfail`` expectation covers (the check is known not to work).
FAILING: frozenset[Outcome] = frozenset({Outcome.FAIL, Outcome.ERROR, Outcome.TIMEOUT,
                                         Outcome.CRASH})
#: Column order of every summary table.
ORDER: tuple[Outcome, ...] = (Outcome.PASS, Outcome.FAIL, Outcome.ERROR, Outcome.TIMEOUT,
                              Outcome.CRASH, Outcome.SKIP, Outcome.XFAIL, Outcome.XPASS,
                              Outcome.UNAVAILABLE)

class RankStatus(str, enum.Enum):
    """How one rank ended one check: what it reported (PASS, FAIL, ERROR, SKIP), or what its
    launcher saw happen to it (CRASH: it died; TIMEOUT: no answer in the check's budget;
    ABORTED: torn down because another rank died or failed while it waited)."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"
    CRASH = "crash"
    TIMEOUT = "timeout"
    ABORTED = "aborted"

    def __str__(self) -> str:  # what reports and f-strings show, on every Python
        return self.value


@dataclass
class RankResult:
    """What one rank reported for one check (or what the pool saw happen to it)."""

    rank: int
    status: RankStatus  # a string naming one is taken too (a result read back from JSON)
    message: str = ""
    traceback: str = ""
    duration_s: float = 0.0
    peak_host_mb: float | None = None
    peak_device_mb: float | None = None
    returned: str | None = None
    exit: str | None = None  # how a dead rank ended: "exit code 3", "SIGSEGV"
    log_tail: str = ""       # the rank's stderr since the check started (crash/timeout)
    group_count: int = 0     # c10d's group counter after the check (kept in step across ranks)
    #: The check's table (``ctx.rows``): one dict per case it checked, e.g. the ``ops`` area's
    #: op x dtype rows (:mod:`accelkit.conformance.checks._opinfo`).
    rows: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.status = RankStatus(self.status)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        data.pop("group_count")
        data.pop("rows")  # the check's, merged: CheckResult.rows
        return data


@dataclass
class CheckResult:
    """The merged result of one check, as every report shows it."""

    id: str
    #: The ranks it ran on; None for a test that makes its own groups (``accelkit upstream``).
    world_size: int | None
    outcome: Outcome
    reason: str = ""
    duration_s: float = 0.0
    pool_start_s: float = 0.0         # time spent (re)starting the pool before this check
    ranks: list[RankResult] = field(default_factory=list)
    expectation: dict | None = None   # the expectation applied, if any
    actual: Outcome | None = None     # the outcome before an expectation turned it into XFAIL/XPASS
    simulated: bool = False           # ran in one process on a fake group of world_size ranks

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def rows(self) -> list[dict]:
        """Every rank's table rows (:attr:`RankResult.rows`), in rank order."""
        return [row for r in self.ranks for row in r.rows]

    @property
    def name(self) -> str:
        return self.id.split(".", 1)[1]

    @property
    def key(self) -> str:
        """``id@N``: the check on N ranks, as reports, expectations and comparisons name it
        (``id`` without a world size)."""
        return self.id if self.world_size is None else f"{self.id}@{self.world_size}"

    def peak_mb(self, which: str) -> float | None:
        """The largest per-rank peak (``"host"`` or ``"device"``), in MiB, or None."""
        values = [getattr(r, f"peak_{which}_mb") for r in self.ranks]
        values = [v for v in values if v is not None]
        return max(values) if values else None

    @property
    def first_line(self) -> str:
        return self.reason.strip().splitlines()[0] if self.reason.strip() else ""
