"""`accelkit compare` on two real reports (two runs of tests/fixtures/compare_checks.py on the
cpu backend, one of them with ACCELKIT_TEST_SECOND_RUN=1), in its three formats, and its exit
status for CI gating."""

from __future__ import annotations

import json
from pathlib import Path

import engine_env  # tests/fixtures (tests/conftest.py)
import pytest

CHECKS = str(Path(engine_env.FIXTURES) / "compare_checks.py")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    paths = []
    for name, second in (("first", "0"), ("second", "1")):
        env, _ = engine_env.new_env(ACCELKIT_TEST_SECOND_RUN=second)
        proc = engine_env.accelkit("conformance", "--backend", "cpu", "--checks-module", CHECKS,
                                   "--no-builtin-checks", "--report-dir", str(out / name),
                                   env=env, timeout=300)
        assert proc.returncode == 1, proc.stdout + proc.stderr  # each run has a failure
        paths.append(str(out / name / "report.json"))
    return paths


def _compare(*args):
    env, _ = engine_env.new_env()
    return engine_env.accelkit("compare", *args, env=env, timeout=120)


def test_json_names_regressions_fixes_changes_and_time(reports):
    proc = _compare(*reports, "--format", "json")
    assert proc.returncode == 1, proc.stderr  # a regression fails CI
    data = json.loads(proc.stdout)
    assert data["regressed"] is True
    (c,) = data["comparisons"]
    assert [(ch["key"], ch["before"], ch["after"]) for ch in c["newly_failing"]] == [
        ("cmp.regresses@2", "pass", "fail")]
    assert c["newly_failing"][0]["reason"] == ("rank 0: AssertionError: broken in the second "
                                               "run")
    assert [(ch["key"], ch["before"], ch["after"]) for ch in c["newly_passing"]] == [
        ("cmp.fixed@2", "fail", "pass")]
    assert [(ch["key"], ch["before"], ch["after"]) for ch in c["changed"]] == [
        ("cmp.skipped_later@2", "pass", "skip")]
    assert c["time_changes"][0]["key"] == "cmp.slower@2"
    assert c["time_changes"][0]["delta_s"] > 0.3


def test_text_and_markdown(reports, tmp_path):
    text = _compare(*reports)
    assert text.returncode == 1
    assert "newly failing: 1\n  cmp.regresses@2: PASS -> FAIL" in text.stdout
    assert "newly passing: 1\n  cmp.fixed@2: FAIL -> PASS" in text.stdout
    assert "cmp.skipped_later@2: PASS -> SKIP" in text.stdout
    assert "REGRESSED: a check newly fails" in text.stdout
    md = _compare(*reports, "--format", "markdown", "--output", str(tmp_path / "cmp.md"))
    assert md.returncode == 1 and md.stdout == ""
    written = (tmp_path / "cmp.md").read_text()
    assert "**❌ regressed**" in written
    assert "| `cmp.regresses@2` | PASS | FAIL | newly failing |" in written


def test_no_regression_exits_0_and_bad_input_2(reports, tmp_path):
    reverse = _compare(reports[1], reports[0], "--format", "json")
    data = json.loads(reverse.stdout)  # the second run as the baseline: cmp.fixed regressed
    assert [ch["key"] for ch in data["comparisons"][0]["newly_failing"]] == ["cmp.fixed@2"]
    same = _compare(reports[0], reports[0], "--same")
    assert same.returncode == 0 and "no regression" in same.stdout
    assert "same results: every check in both, each with its outcome" in same.stdout
    (tmp_path / "x.json").write_text("{}")
    bad = _compare(reports[0], str(tmp_path / "x.json"))
    assert bad.returncode == 2
    assert "is not an accelkit conformance report of schema accelkit.conformance/2" in bad.stderr
    assert _compare(reports[0]).returncode == 2


def test_reports_of_two_torch_versions_say_what_changed_with_the_version(reports, tmp_path):
    older = json.loads(Path(reports[0]).read_text())["versions"]
    newer = json.loads(Path(reports[1]).read_text())
    newer["versions"].update(torch="2.15.0", torch_build="CUDA 13.2")
    (tmp_path / "newer.json").write_text(json.dumps(newer))
    text = _compare(reports[0], str(tmp_path / "newer.json"))
    older_torch = older["torch"]
    assert (f"changed with: torch {older_torch} -> 2.15.0, torch_build "
            f"{older['torch_build']} -> CUDA 13.2") in text.stdout
    assert "newly failing: 1\n  cmp.regresses@2: PASS -> FAIL" in text.stdout
    data = json.loads(_compare(reports[0], str(tmp_path / "newer.json"), "--format", "json").stdout)
    assert data["comparisons"][0]["versions_changed"]["torch"] == [older_torch, "2.15.0"]
    assert "changed with" not in _compare(*reports).stdout  # same versions: nothing said


def test_same_fails_on_any_change_not_only_a_regression(reports, tmp_path):
    """``--same``: a report missing one check (no regression, so exit 0 without ``--same``) and
    two runs whose outcomes differ both exit 1, the difference named."""
    first = json.loads(Path(reports[0]).read_text())
    fewer = dict(first, checks=[c for c in first["checks"] if c["key"] != "cmp.slower@2"])
    (tmp_path / "fewer.json").write_text(json.dumps(fewer))
    dropped = _compare(reports[0], str(tmp_path / "fewer.json"), "--same")
    assert dropped.returncode == 1, dropped.stdout
    assert "only in the baseline: 1: cmp.slower@2" in dropped.stdout
    assert "results differ" in dropped.stdout
    assert _compare(reports[0], str(tmp_path / "fewer.json")).returncode == 0  # no regression
    changed = _compare(*reports, "--same", "--format", "json")
    assert changed.returncode == 1 and json.loads(changed.stdout)["same"] is False
