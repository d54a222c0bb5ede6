"""The pytest plugin: inert without --accelkit-backend; with it, checks are pytest items whose
outcomes and JUnit output are pytest's own, with the names `accelkit conformance` gives."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import engine_env  # tests/fixtures (tests/conftest.py)

PLUGIN_ARGS = ["--accelkit-checks-module", engine_env.CHECKS, "--accelkit-no-builtin-checks",
               "-p", "no:cacheprovider"]


def _pytest(tmp_path, *args):
    env, marker = engine_env.new_env()
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = engine_env.run([sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"),
                           "--rootdir", str(tmp_path), *args],
                          env=env, cwd=tmp_path, timeout=300)
    assert engine_env.marked_processes(marker) == []
    return proc


def test_inert_without_the_option(tmp_path):
    code = ("import sys, pytest; rc = pytest.main(['-q', '--co', '-p', 'no:cacheprovider']); "
            "print('LOADED', sorted(m for m in ('torch', 'accelkit.conformance.engine.runner') "
            "if m in sys.modules))")
    env, _ = engine_env.new_env()
    proc = engine_env.run([sys.executable, "-c", code], env=env, cwd=tmp_path, timeout=120)
    assert "LOADED []" in proc.stdout, proc.stdout + proc.stderr


def test_collect_only_lists_checks_without_starting_a_pool(tmp_path):
    proc = _pytest(tmp_path, "--accelkit-backend", "cpu", *PLUGIN_ARGS, "--co", "-q",
                   "--accelkit-world-size", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[:6] == [
        f"accelkit/conformance/fixture::{name}@2"
        for name in ("broadcast", "fail_rank1", "raises", "hangs", "exits_rank1", "segv_rank0")]
    assert "fixture::all_reduce" not in proc.stdout  # 4 ranks: not selected
    assert "6 tests collected" in proc.stdout


def test_checks_run_as_items_with_pytest_outcomes_and_junit(tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text('[checks."fixture.raises"]\nstatus = "xfail"\nreason = "raises on purpose"\n')
    junit = tmp_path / "junit.xml"
    proc = _pytest(tmp_path, "--accelkit-backend", "cpu", *PLUGIN_ARGS,
                   "--accelkit-expectations", str(exp), "-k", "broadcast or fail_rank1 or raises",
                   "--accelkit-report-dir", str(tmp_path / "reports"),
                   f"--junitxml={junit}", "-rA")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "1 failed, 1 passed, 12 deselected, 1 xfailed" in out
    assert "FAIL: fixture.fail_rank1 on 2 ranks" in out
    assert "rank 1: AssertionError: rank 1 disagrees: sum=2" in out
    cases = {c.attrib["name"]: c for c in ET.parse(junit).getroot().iter("testcase")}
    # the names accelkit conformance's own junit.xml gives the same checks
    assert set(cases) == {"broadcast@2", "fail_rank1@2", "raises@2"}
    assert {c.attrib["classname"] for c in cases.values()} == {"accelkit.conformance.fixture"}
    assert "rank 1 disagrees" in cases["fail_rank1@2"].find("failure").attrib["message"]
    assert cases["raises@2"].find("skipped").attrib["type"] == "pytest.xfail"
    assert list(cases["broadcast@2"]) == []
    own = ET.parse(tmp_path / "reports" / "junit.xml").getroot()
    assert {(c.attrib["classname"], c.attrib["name"]) for c in own.iter("testcase")} == {
        (c.attrib["classname"], c.attrib["name"]) for c in cases.values()}


def test_an_unexpected_pass_is_pytests_xpass_and_fails_under_strict(tmp_path):
    """The engine's XPASS is pytest's xpassed, or a failure naming it under
    ``--accelkit-strict``: the plugin maps the engine's verdict, it does not judge again."""
    exp = tmp_path / "exp.toml"
    exp.write_text('[checks."fixture.broadcast"]\nstatus = "xfail"\nreason = "said to fail"\n')
    args = ("--accelkit-backend", "cpu", *PLUGIN_ARGS, "--accelkit-expectations", str(exp),
            "-k", "broadcast", "--accelkit-world-size", "2")
    lenient = _pytest(tmp_path, *args)
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert "1 xpassed" in lenient.stdout
    strict = _pytest(tmp_path, *args, "--accelkit-strict")
    assert strict.returncode == 1 and "1 failed" in strict.stdout, strict.stdout
    assert "XPASS: fixture.broadcast on 2 ranks" in strict.stdout
    assert "passed, but expected to fail: said to fail" in strict.stdout


def test_bad_option_is_a_usage_error(tmp_path):
    proc = _pytest(tmp_path, "--accelkit-backend", "nope", *PLUGIN_ARGS, "--co", "-q")
    assert proc.returncode == 4
    assert "accelkit: unknown backend 'nope'; known backends:" in proc.stderr
