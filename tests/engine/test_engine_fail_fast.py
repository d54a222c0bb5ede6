"""Fail fast: a crash storm in one area stops that area (one message naming the crashes, the
first one's output and ``--keep-going``) and the run goes on with the next area; a check's time
leaves out the backend's build (``spec.prepare()``) and the pool start before it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import engine_env  # tests/fixtures (tests/conftest.py)
from accelkit.conformance.engine import loader
from accelkit.conformance.engine.options import Options
from accelkit.conformance.engine.plan import Host, make_plan
from accelkit.conformance.engine.runner import CRASH_STORM, Runner
from accelkit.conformance.outcomes import Outcome
from accelkit.core import registry

STORM = str(Path(engine_env.FIXTURES) / "crash_storm_checks.py")
BUILD_S = 2.0


def test_a_crash_storm_stops_its_area_and_builds_are_not_check_time():
    modules = [STORM, engine_env.CHECKS]
    checks = loader.select(loader.load(modules, builtin=False),
                           patterns=["storm.*", "fixture.broadcast"])
    plan = make_plan(checks, {}, Host(backend="cpu"))
    # the cpu backend (gloo) with a build that takes BUILD_S, as a first-use C++ build does
    spec = replace(registry.get("cpu"), prepare=lambda: time.sleep(BUILD_S))
    report = Runner(spec, Options(modules=modules, builtin=False)).run(plan)
    outcomes = {r.id: r for r in report.results}
    assert [outcomes[f"storm.{n}"].outcome for n in ("first", "second", "third")] \
        == [Outcome.CRASH] * CRASH_STORM
    for name in ("fourth", "fifth"):
        stopped = outcomes[f"storm.{name}"]
        assert stopped.outcome is Outcome.ERROR and stopped.ranks == []
        assert stopped.reason.startswith(
            "not run: the rank pool crashed on 3 consecutive checks of area 'storm' "
            "(storm.first@2, storm.second@2, storm.third@2)"), stopped.reason
        assert "--keep-going" in stopped.reason
        assert "The first crash, storm.first@2:" in stopped.reason
        assert "exit code 3" in stopped.reason
    assert outcomes["fixture.broadcast"].outcome is Outcome.PASS
    # one pool start, and one after each crash that a later check needed; none for the
    # stopped checks (5 crashing checks would otherwise give 5 restarts)
    order = [r.id for r in report.results]
    after_storm = order.index("fixture.broadcast") > order.index("storm.third")
    assert [s["why"] for s in report.pool_starts] == (
        ["first start", "after crash in storm.first", "after crash in storm.second"]
        + (["after crash in storm.third"] if after_storm else []))
    first = report.results[0]
    assert report.pool_starts[0]["prepare_s"] >= BUILD_S
    assert first.pool_start_s >= BUILD_S + report.pool_starts[0]["seconds"] - 0.01
    assert first.duration_s < BUILD_S, first.duration_s
    assert all(s["prepare_s"] == 0.0 for s in report.pool_starts[1:])
