"""Simulated checks (the ``scale`` area) in the engine: how they are planned, how a run of
them is reported apart from real ones, and one real run of the area on a fake process group;
and the rule that a run in which no check ran does not pass."""

from __future__ import annotations

import json

import pytest
from accelkit.conformance.api import CheckDef
from accelkit.conformance.engine.options import Options
from accelkit.conformance.engine.plan import Host, make_plan
from accelkit.conformance.model import RunReport
from accelkit.conformance.outcomes import CheckResult, Outcome, RankResult
from accelkit.conformance.reports import files as reports
from accelkit.conformance.reports import terminal
from accelkit.core import registry
from support.python import run_python

SIZES = (16, 64, 256, 1024)


def _sim(cid):
    return CheckDef(id=cid, fn=lambda ctx: None, world_size=16, also_at=SIZES[1:], doc="d",
                    simulated=True)


def _real(cid):
    return CheckDef(id=cid, fn=lambda ctx: None, world_size=4, doc="d")


def test_a_simulated_check_runs_at_every_size_after_the_real_ones_without_probing_them():
    """At every size when the run names its area; in a run of the whole catalogue, at its
    first size."""
    plan = make_plan([_sim("scale.a"), _real("b.c")], {},
                     Host(backend="b", problems={4: None}), areas=["scale", "b"])
    assert [s.key for s in plan.steps] == ["b.c@4", "scale.a@16", "scale.a@64", "scale.a@256",
                                           "scale.a@1024"]
    assert all(s.decided is None for s in plan.steps)  # no "16 devices needed"
    whole = make_plan([_sim("scale.a"), _real("b.c")], {}, Host(backend="b", problems={4: None}))
    assert [s.key for s in whole.steps] == ["b.c@4", "scale.a@16"]


def test_world_size_picks_simulated_sizes_and_a_launch_skips_them():
    picked = make_plan([_sim("scale.a"), _real("b.c")], {}, Host(backend="b"), [64])
    assert [s.key for s in picked.steps] == ["scale.a@64"]
    assert [c.id for c in picked.left_out] == ["b.c"]
    launch = make_plan([_sim("scale.a")], {}, Host(backend="b", launch=3, problems={3: None}))
    assert {s.decided[0] for s in launch.steps} == {Outcome.SKIP}
    assert "not in a torchrun launch" in launch.steps[0].decided[1]


def test_an_any_size_check_runs_at_any_requested_size_and_launch():
    anywhere = CheckDef(id="a.any", fn=lambda ctx: None, doc="d", also_at=(2, 8),
                        any_world_size=True)
    fixed = _real("a.fixed")
    plan = make_plan([anywhere, fixed], {}, Host(backend="b", launch=3, problems={3: None}))
    assert [(s.key, s.decided and s.decided[0]) for s in plan.steps] == [
        ("a.any@3", None), ("a.fixed@4", Outcome.SKIP)]
    assert plan.steps[0].check.world_sizes == (3, 4, 2, 8)
    picked = make_plan([anywhere, fixed], {}, Host(backend="b"), [6, 16])
    assert [s.key for s in picked.steps] == ["a.any@6", "a.any@16"]
    assert not anywhere.runs_at(1) and not fixed.runs_at(3)


def _report(*results, **extra):
    return RunReport(spec=registry.get("cpu"), options=Options(), results=list(results), **extra)


def test_a_run_where_no_check_ran_fails_and_says_so():
    skipped = _report(CheckResult("a.x", 3, Outcome.SKIP, "written for 4 ranks"))
    assert skipped.nothing_ran() and not skipped.ok()
    assert terminal.summary(skipped).endswith("FAILED: no check ran (1 planned, all skipped: "
                                              "see the reasons above)")
    assert not _report().ok()  # nothing planned either
    assert _report(unavailable="no driver").ok()  # an unavailable backend stays exit 0
    ran = _report(CheckResult("a.x", 4, Outcome.PASS), CheckResult("a.y", 4, Outcome.SKIP))
    assert ran.ok() and not ran.nothing_ran()


def test_reports_keep_simulated_results_apart(tmp_path):
    report = _report(CheckResult("a.x", 4, Outcome.PASS, ranks=[RankResult(0, "pass")]),
                     CheckResult("scale.m", 1024, Outcome.PASS, simulated=True,
                                 ranks=[RankResult(0, "pass", peak_host_mb=512.0)]))
    assert (report.world_sizes, report.simulated_world_sizes) == ([4], [1024])
    data = reports.to_json(report)
    assert data["world_sizes"] == [4] and data["simulated_world_sizes"] == [1024]
    assert [c["simulated"] for c in data["checks"]] == [False, True]
    assert data["checks"][1]["peak_host_mb"] == 512.0
    md = reports.to_markdown(report)
    assert "| simulated world sizes | 1024 (one process" in md
    assert "| `scale.m` | 1024 simulated |" in md
    assert "1 check(s) at 1024 ranks; real processes: 4" in terminal.summary(report)


@pytest.mark.parametrize("world_size,ndim,shape", [(16, 4, (2, 2, 2, 2)), (1024, 4, (4, 4, 8, 8)),
                                                   (64, 3, (4, 4, 4)), (16, 1, (16,))])
def test_mesh_shape(world_size, ndim, shape):
    from accelkit.conformance.checks.scale import mesh_shape

    assert mesh_shape(world_size, ndim) == shape


def test_scale_area_runs_on_one_worker_on_cpu(tmp_path):
    """The real engine: the scale area on cpu at 16 simulated ranks, one worker process, the
    report marking every result simulated (the RNG checks SKIP: no tracker on cpu; FSDP2
    under LocalTensorMode SKIPs where torch cannot run it)."""
    proc = run_python(
        "import sys; from accelkit.cli import main; sys.exit(main(["
        "'conformance', '--backend', 'cpu', '--area', 'scale', '--world-size', '16', "
        f"'--report-dir', {str(tmp_path)!r}]))", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["simulated_world_sizes"] == [16] and data["world_sizes"] == []
    outcomes = {c["id"]: c["outcome"] for c in data["checks"]}
    for rng in ("rng_offsets_partition", "rng_offsets_double_shard", "local_random_numerics"):
        assert outcomes.pop(f"scale.{rng}") == "skip"
    assert outcomes.pop("scale.local_fsdp2_numerics") in ("pass", "skip")  # skip: torch 2.13
    assert set(outcomes.values()) == {"pass"} and len(outcomes) >= 8
    assert [(s["world_size"], len(s["pids"]), s["simulated"]) for s in data["pool_starts"]] == [
        (16, 1, True)]
