"""End to end: one `accelkit conformance` run on cpu over every fixture check.

One run (2- and 4-rank pools, ~30 s here) covers every outcome; the tests below read its
output, report files and what it left behind."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import engine_env  # tests/fixtures (tests/conftest.py)
import pytest

EXPECTED = {
    "fixture.broadcast": "pass",
    "fixture.fail_rank1": "fail",
    "fixture.raises": "error",
    "fixture.hangs": "timeout",
    "fixture.exits_rank1": "crash",
    "fixture.segv_rank0": "crash",
    "fixture.all_reduce": "pass",
    "fixture.out_of_memory": "error",
    "fixture.skips": "skip",
    "fixture.needs_accelerator": "skip",
    "fixture.known_bug": "xfail",
    "fixture.fixed_bug": "xpass",
    "fixture.would_hang": "skip",
    "fixture.mesh_2d": "pass",
    "fixture.clean_state": "pass",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("engine-run")
    env, marker = engine_env.new_env()
    shm_before = engine_env.shm_segments()
    proc = engine_env.accelkit(
        "conformance", "--backend", "cpu", "--checks-module", engine_env.CHECKS,
        "--no-builtin-checks", "--memory-limit", "512", "--expectations",
        engine_env.EXPECTATIONS, "--report-dir", str(out), env=env)
    leftover = engine_env.marked_processes(marker)
    report = json.loads((out / "report.json").read_text())
    pids = {str(p) for s in report["pool_starts"] for p in s["pids"]}
    new_shm = [n for n in engine_env.shm_segments() - shm_before
               if pids & set(n.split("_"))]
    return SimpleNamespace(proc=proc, out=out, report=report, leftover=leftover, new_shm=new_shm,
                           checks={c["id"]: c for c in report["checks"]})


def test_every_fixture_gets_its_own_outcome(run):
    got = {cid: c["outcome"] for cid, c in run.checks.items()}
    assert got == EXPECTED, run.proc.stdout + run.proc.stderr


def test_exit_code_is_1_when_something_failed(run):
    assert run.proc.returncode == 1, run.proc.stderr


def test_fail_names_the_rank_and_its_message(run):
    check = run.checks["fixture.fail_rank1"]
    assert check["reason"] == "rank 1: AssertionError: rank 1 disagrees: sum=2"
    assert [r["status"] for r in check["ranks"]] == ["pass", "fail"]
    assert "assert ctx.rank != 1" in check["ranks"][1]["traceback"]


def test_error_keeps_each_ranks_traceback(run):
    ranks = run.checks["fixture.raises"]["ranks"]
    for r in ranks:
        assert r["status"] == "error"
        assert f"RuntimeError: boom on rank {r['rank']}" in r["traceback"]
        assert "engine_checks.py" in r["traceback"]
        assert "execute.py" not in r["traceback"]  # the engine's own frame is left out


def test_timeout_uses_the_checks_budget_and_shows_where_it_hung(run):
    check = run.checks["fixture.hangs"]
    assert check["reason"] == "rank 1: no answer within 3 s"
    assert 3.0 <= check["duration_s"] < 15
    hung = check["ranks"][1]
    assert hung["status"] == "timeout"
    assert "in hangs" in hung["log_tail"] and "in barrier" in hung["log_tail"]


def test_crash_names_exit_code_and_signal(run):
    exited = run.checks["fixture.exits_rank1"]
    assert exited["reason"].splitlines()[0] == "rank 1: died: exit code 3"
    assert exited["ranks"][1]["exit"] == "exit code 3"
    segv = run.checks["fixture.segv_rank0"]
    assert segv["reason"].splitlines()[0] == "rank 0: died: SIGSEGV"
    assert "Segmentation fault" in segv["ranks"][0]["log_tail"]


def test_memory_limit_turns_an_oversized_allocation_into_error(run):
    check = run.checks["fixture.out_of_memory"]
    assert check["reason"].startswith("rank 0: out of memory: ")
    assert [r["status"] for r in check["ranks"]] == ["error", "pass", "pass", "pass"]
    peaks = [r["peak_host_mb"] for r in check["ranks"]]
    assert peaks[0] > peaks[1] + 300  # rank 0 filled ~512 MiB before failing
    # the high-water mark is reset per check: the next check's peak is back to normal
    assert run.checks["fixture.skips"]["ranks"][0]["peak_host_mb"] < peaks[0] - 300


def test_skip_reasons(run):
    assert run.checks["fixture.skips"]["reason"] == "fixture skip reason"
    assert run.checks["fixture.needs_accelerator"]["reason"] == \
        "needs an accelerator device; cpu has no device handle"
    assert run.checks["fixture.needs_accelerator"]["ranks"] == []  # never ran
    assert run.checks["fixture.would_hang"]["reason"] == "expected skip: hangs on this backend"


def test_expectations_xfail_and_xpass(run):
    known = run.checks["fixture.known_bug"]
    assert known["actual"] == "fail"
    assert known["reason"].startswith("expected failure: the fixture fails on purpose\n"
                                      "actual FAIL: rank 0: AssertionError: known bug")
    assert known["expectation"]["link"] == "https://example.invalid/issues/1"
    fixed = run.checks["fixture.fixed_bug"]
    assert fixed["actual"] == "pass"
    assert "expected to fail: was broken once" in fixed["reason"]
    # an expectation for another torch version range does not apply
    assert run.checks["fixture.broadcast"]["expectation"] is None


def test_pool_is_reused_and_rebuilt_only_after_timeout_or_crash(run):
    whys = [(s["world_size"], s["why"]) for s in run.report["pool_starts"]]
    assert whys == [(2, "first start"), (2, "after timeout in fixture.hangs"),
                    (2, "after crash in fixture.exits_rank1"), (4, "first start")]


def test_each_check_starts_from_a_clean_state(run):
    # fixture.clean_state runs after fixture.mesh_2d left groups, an ambient mesh and used RNG
    assert run.checks["fixture.clean_state"]["outcome"] == "pass", \
        run.checks["fixture.clean_state"]["reason"]


def test_nothing_left_behind(run):
    assert run.leftover == []
    assert run.new_shm == []


def test_per_rank_details(run):
    ranks = run.checks["fixture.all_reduce"]["ranks"]
    assert [r["returned"] for r in ranks] == ["10.0"] * 4
    for r in ranks:
        assert r["peak_host_mb"] > 50
        assert 0 <= r["duration_s"] < 5
    check = run.checks["fixture.all_reduce"]
    assert check["peak_host_mb"] == max(r["peak_host_mb"] for r in ranks)
    assert check["peak_device_mb"] is None  # cpu has no device handle


def test_progress_and_summary(run):
    out = run.proc.stdout
    lines = out.splitlines()
    assert lines[0].startswith("[ 1/15] PASS") and "fixture.broadcast@2" in lines[0]
    assert "[pass=1]" in lines[0] and "pool start)" in lines[0]
    assert any(line.startswith("[ 4/15] TIMEOUT") for line in lines)
    row = next(line for line in lines if line.startswith("fixture "))
    assert row.split()[1:11] == ["4", "1", "2", "1", "2", "3", "1", "1", "0", "15"]
    assert "  CRASH       fixture.segv_rank0@2: rank 0: died: SIGSEGV" in out
    assert "  FAIL        fixture.fail_rank1@2: rank 1: AssertionError: rank 1 disagrees: sum=2" \
        in out
    # an XFAIL's reason keeps what actually failed, on its own line
    assert ("  XFAIL       fixture.known_bug@4: expected failure: the fixture fails on purpose\n"
            "              actual FAIL: rank 0: AssertionError: known bug") in out
    assert "versions: " not in out and ", torch 2." in lines[lines.index("") + 1]
    assert "FAILED: 6 check(s) did not pass" in out


def test_report_json_schema(run):
    r = run.report
    assert r["schema"] == "accelkit.conformance/2"
    assert r["backend"]["name"] == "cpu" and r["backend"]["process_group_backend"] == "gloo"
    assert r["device"]["type"] == "cpu"
    assert r["versions"]["torch"].startswith("2.")
    assert r["versions"]["accelkit"] and r["versions"]["python"].startswith("3.")
    assert r["versions"]["backend_distribution"]["name"] == "accelkit"
    assert r["error"] is None and r["left_out"] == [] and r["mode"] == "pool"
    assert r["world_sizes"] == [2, 4]
    assert r["summary"]["total"] == 15 and r["summary"]["crash"] == 2
    assert r["areas"]["fixture"]["pass"] == 4
    assert r["expectations"] == engine_env.EXPECTATIONS
    assert r["options"]["memory_limit_mb"] == 512
    check = run.checks["fixture.all_reduce"]
    assert check["key"] == "fixture.all_reduce@4"
    assert set(check) >= {"id", "area", "world_size", "requires", "doc", "outcome", "actual",
                          "reason", "duration_s", "expectation", "ranks"}


def test_junit_xml(run):
    root = ET.parse(run.out / "junit.xml").getroot()
    suite = root.find("testsuite[@name='fixture']")
    assert suite.attrib["tests"] == "15"
    assert suite.attrib["failures"] == "1"   # FAIL (XPASS counts only under --strict)
    assert suite.attrib["errors"] == "5"     # ERROR x2, TIMEOUT, CRASH x2
    assert suite.attrib["skipped"] == "4"    # SKIP x3, XFAIL
    cases = {c.attrib["name"]: c for c in suite.findall("testcase")}
    assert {c.attrib["classname"] for c in cases.values()} == {"accelkit.conformance.fixture"}
    assert cases["segv_rank0@2"].find("error").attrib["type"] == "CRASH"
    assert cases["hangs@2"].find("error").attrib["type"] == "TIMEOUT"
    assert cases["fail_rank1@2"].find("failure").attrib["message"].startswith("rank 1:")
    known = cases["known_bug@4"]
    assert known.find("skipped").attrib["type"] == "XFAIL"
    assert "actual FAIL: rank 0: AssertionError: known bug" in known.find("skipped").text
    assert cases["broadcast@2"].find("failure") is None
    assert cases["broadcast@2"].find("error") is None
    props = {p.attrib["name"]: p.attrib["value"] for p in suite.find("properties")}
    assert props["backend"] == "cpu" and ", torch 2." in props["versions"]


def test_report_md(run):
    md = (run.out / "report.md").read_text()
    assert md.startswith("# PyTorch distributed conformance: `cpu`")
    assert "**Result: ❌ not conformant**" in md
    assert "| `fixture.segv_rank0` | 2 | 💥 CRASH |" in md
    assert "| `fixture.known_bug` | 4 | ⚠️ known failure |" in md
    # every line of a reason: what actually failed under the known failure
    assert ("expected failure: the fixture fails on purpose<br>actual FAIL: rank 0: "
            "AssertionError: known bug") in md
    assert "| versions | accelkit " in md
    assert "([link](https://example.invalid/issues/1))" in md
