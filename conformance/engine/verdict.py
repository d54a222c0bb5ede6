"""The one place a check's result is decided: :func:`verdict` turns what its ranks answered
(or why it did not run) and what the backend expects of it into the :class:`CheckResult` every
report shows. It is pure: the engines (the pool runner, the torchrun runner) only gather rank
results, and the pytest plugin maps results to pytest's outcomes without judging them again.

1. The ranks' answers merge into one outcome (:func:`merge`): a dead rank makes it CRASH, a
   missing answer TIMEOUT, then ERROR (an unexpected exception on any rank) beats FAIL (an
   ``AssertionError`` on any rank), which beats SKIP; PASS needs every rank to pass.
2. A check with a table (the ``ops`` area's op x dtype rows) fails on a wrong row that the
   expectations' ``[ops]`` entries do not cover (:func:`judge_rows`).
3. An ``xfail`` expectation turns a failing outcome into XFAIL and a pass into XPASS
   (:func:`apply_expectation`), keeping the actual outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from accelkit.conformance.outcomes import FAILING, CheckResult, Outcome, RankResult, RankStatus

if TYPE_CHECKING:
    from accelkit.conformance.api import CheckDef
    from accelkit.conformance.engine.expectations import Expectation, OpExpectation

#: Rank statuses that decide a check's outcome, worst first.
_WORST_FIRST = ((RankStatus.CRASH, Outcome.CRASH), (RankStatus.TIMEOUT, Outcome.TIMEOUT),
                (RankStatus.ERROR, Outcome.ERROR), (RankStatus.FAIL, Outcome.FAIL))
#: Row statuses that fail a check unless an ``[ops]`` expectation covers them.
WRONG_ROWS = ("fail", "error")


def verdict(check: CheckDef, ranks: Sequence[RankResult] | None,
            expectation: Expectation | None, *, decided: tuple[Outcome, str] | None = None,
            ops: Mapping[str, OpExpectation] | None = None, strict: bool = False) -> CheckResult:
    """The result of ``check`` from its ranks' answers (``ranks``), or from why it did not run
    (``decided``: the plan's SKIP or UNAVAILABLE, a pool that could not start), judged against
    its ``expectation`` and the ``[ops]`` entries (``ops``); ``strict``: a covered row that
    passed (a stale entry) fails the check."""
    if decided is not None:
        result = CheckResult(check.id, check.world_size, decided[0], decided[1],
                             simulated=check.simulated)
    else:
        outcome, reason = merge(ranks or [])
        result = CheckResult(check.id, check.world_size, outcome, reason, ranks=list(ranks or []),
                             simulated=check.simulated)
    if result.rows:
        judge_rows(result, ops or {}, strict=strict)
    apply_expectation(result, expectation)
    return result


def _rank_line(r: RankResult) -> str:
    text = r.message.strip().splitlines()[0] if r.message.strip() else str(r.status)
    return f"rank {r.rank}: {text}"


def merge(ranks: Sequence[RankResult]) -> tuple[Outcome, str]:
    """The outcome of a check from its per-rank results, and the reason (one line per rank
    that did not pass, worst first)."""
    by_status: dict[RankStatus, list[RankResult]] = {}
    for r in ranks:
        by_status.setdefault(RankStatus(r.status), []).append(r)
    for status, outcome in _WORST_FIRST:
        if status in by_status:
            return outcome, "\n".join(_rank_line(r) for r in by_status[status])
    if RankStatus.SKIP in by_status:
        return Outcome.SKIP, "; ".join(sorted({r.message for r in by_status[RankStatus.SKIP]}))
    if ranks and set(by_status) == {RankStatus.PASS}:
        return Outcome.PASS, ""
    return Outcome.ERROR, "no result from any rank"


def judge_rows(result: CheckResult, expected: Mapping[str, OpExpectation],
               strict: bool = False) -> None:
    """A check with a table (the ``ops`` area's op x dtype rows) fails on its wrong rows: a
    covered row becomes ``xfail`` (``xpass`` when it matched: a wrong row under ``--strict``,
    the entry is stale), and a PASS with any other wrong row becomes FAIL naming the first ones."""
    rows = result.rows
    for row in rows:
        entry = expected.get(row.get("op", ""))
        if entry is None or not entry.covers(row):
            continue
        row["expectation"] = entry.reason
        if row["status"] in WRONG_ROWS:
            row["status"] = "xfail"
        elif row["status"] == "pass":
            row["status"] = "xpass"
    wrong = [row for row in rows if row["status"] in WRONG_ROWS or (strict and row["status"] == "xpass")]
    if wrong and result.outcome is Outcome.PASS:
        result.outcome = Outcome.FAIL
        shown = "\n".join(f"{row['op']} {row['dtype']}: {row['detail']}" for row in wrong[:10])
        more = f"\n... and {len(wrong) - 10} more (the report's op table)" if len(wrong) > 10 else ""
        result.reason = (f"{len(wrong)} of {len(rows)} cases differ from the CPU or raise; list "
                         f"known ones under [ops] in the expectations file:\n{shown}{more}")


def apply_expectation(result: CheckResult, expectation: Expectation | None) -> None:
    """An ``xfail`` expectation turns a failing outcome into XFAIL (the actual one kept in
    ``result.actual`` and the reason) and a pass into XPASS."""
    if expectation is None:
        return
    result.expectation = expectation.to_dict()
    if expectation.status != "xfail":
        return
    if result.outcome in FAILING:
        result.actual = result.outcome
        result.outcome = Outcome.XFAIL
        result.reason = (f"expected failure: {expectation.reason}\n"
                         f"actual {result.actual.label}: {result.reason}")
    elif result.outcome is Outcome.PASS:
        result.actual = result.outcome
        result.outcome = Outcome.XPASS
        result.reason = (f"passed, but expected to fail: {expectation.reason} "
                         "(remove the expectation)")
