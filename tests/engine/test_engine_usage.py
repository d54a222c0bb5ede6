"""`accelkit conformance` options, usage errors, UNAVAILABLE, SKIP for too many ranks, and
pool start-up failures. All but the last ones run in one interpreter and start no pool."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import engine_env  # tests/fixtures (tests/conftest.py)
import pytest

FIXTURE_ARGS = ("--checks-module", engine_env.CHECKS, "--no-builtin-checks")


CASES = {
    "list": ["--backend", "cpu", *FIXTURE_ARGS, "--list", "-k", "fail", "-k", "fixture.a*",
             "--world-size", "2"],
    "list_expectations": ["--backend", "cpu", *FIXTURE_ARGS, "--list", "--area", "fixture",
                          "--expectations", engine_env.EXPECTATIONS],
    "unknown_backend": ["--backend", "cpuu", *FIXTURE_ARGS],
    "unknown_area": ["--backend", "cpu", *FIXTURE_ARGS, "--area", "meshes"],
    "nothing_selected": ["--backend", "cpu", *FIXTURE_ARGS, "-k", "zzz"],
    "bad_timeout": ["--backend", "cpu", *FIXTURE_ARGS, "--timeout", "0"],
    "bad_module": ["--backend", "cpu", "--checks-module", "no_such_checks_module",
                   "--no-builtin-checks"],
    "unavailable": ["--backend", "cuda", *FIXTURE_ARGS, "-k", "fixture.broadcast", "-k",
                    "fixture.all_reduce", "--report-dir", "{tmp}"],
    "unavailable_required": ["--backend", "cuda", *FIXTURE_ARGS, "-k", "fixture.broadcast",
                             "--require-available"],
    "too_many_ranks": ["--backend", "mock", *FIXTURE_ARGS, "-k", "fixture.all_reduce"],
    "unknown_expectation": ["--backend", "cpu", *FIXTURE_ARGS, "--expectations",
                            "{tmp}/exp.toml"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case above, in one interpreter; none of them may start a worker pool."""
    tmp = tmp_path_factory.mktemp("usage")
    (tmp / "exp.toml").write_text('[checks."fixture.know_bug"]\nstatus = "xfail"\n'
                                  'reason = "x"\n')
    argvs = [["conformance", *(a.replace("{tmp}", str(tmp)) for a in argv)]
             for argv in CASES.values()]
    env, marker = engine_env.new_env(ACCELKIT_MOCK_DEVICES="2")
    proc = engine_env.run([sys.executable, str(Path(engine_env.FIXTURES) / "engine_cli_driver.py"),
                           json.dumps(argvs)], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert engine_env.marked_processes(marker) == []
    results = dict(zip(CASES, json.loads(proc.stdout), strict=True))
    for r in results.values():
        r["tmp"] = tmp
    return results


def test_list_selects_by_area_k_and_world_size(runs):
    r = runs["list"]
    assert r["code"] == 0, r["err"]
    assert r["out"].splitlines() == [
        "fixture.fail_rank1  ws=2  Every rank joins the collective, then rank 1 alone asserts: "
        "FAIL with rank 1's message.",
        "1 check(s)",
        "left out: fixture.all_reduce (written for 4)"]


def test_list_shows_requirements_and_expectations(runs):
    r = runs["list_expectations"]
    assert r["code"] == 0, r["err"]
    assert "fixture.needs_accelerator  ws=4 requires=accelerator  Needs an accelerator" in r["out"]
    assert "[expected skip: hangs on this backend]" in r["out"]
    assert r["out"].splitlines()[-1] == "15 check(s)"


def test_unknown_backend_lists_known_ones(runs):
    r = runs["unknown_backend"]
    assert r["code"] == 2
    assert "accelkit conformance: error: unknown backend 'cpuu'; known backends: cpu, " in r["err"]


def test_unknown_area_lists_known_ones(runs):
    assert runs["unknown_area"]["code"] == 2
    assert "error: unknown area(s) meshes; known: fixture" in runs["unknown_area"]["err"]


def test_nothing_selected_is_an_error(runs):
    r = runs["nothing_selected"]
    assert r["code"] == 2
    assert "error: no check matches -k zzz (15 checks known, world sizes [2, 4])" in r["err"]


def test_bad_timeout(runs):
    assert runs["bad_timeout"]["code"] == 2
    assert "error: --timeout must be positive, got 0" in runs["bad_timeout"]["err"]


def test_bad_check_module_is_an_error(runs):
    r = runs["bad_module"]
    assert r["code"] == 2
    assert ("error: cannot import check module 'no_such_checks_module': ModuleNotFoundError"
            in r["err"])


def test_expectation_with_unknown_id_is_an_error(runs):
    r = runs["unknown_expectation"]
    assert r["code"] == 2
    assert (f"error: {r['tmp']}/exp.toml:1: unknown check id 'fixture.know_bug'; did you mean "
            "fixture.known_bug") in r["err"]


def test_unavailable_backend_reports_every_check_and_exits_0(runs):
    # this host has no CUDA: the cuda backend cannot run here
    r = runs["unavailable"]
    assert r["code"] == 0, r["out"] + r["err"]
    assert "UNAVAILABLE: backend 'cuda' cannot run here: no CUDA device" in r["out"]
    report = json.loads((r["tmp"] / "report.json").read_text())
    assert report["unavailable"].startswith("no CUDA device")
    assert [c["outcome"] for c in report["checks"]] == ["unavailable", "unavailable"]
    assert report["pool_starts"] == []
    assert runs["unavailable_required"]["code"] == 3


def test_more_ranks_than_devices_is_a_skip(runs):
    """The check SKIPs; it was the only one, so nothing ran and the run fails saying so."""
    r = runs["too_many_ranks"]
    assert r["code"] == 1, r["out"] + r["err"]
    assert "FAILED: no check ran (1 planned, all skipped" in r["out"]
    first = r["out"].splitlines()[:2]
    assert first[0].startswith("[1/1] SKIP") and "fixture.all_reduce@4" in first[0]
    assert first[1].strip() == "4 devices needed, 2 present"


def test_pool_that_cannot_start_makes_its_checks_error_without_retrying():
    broken = str(Path(engine_env.FIXTURES) / "engine_broken_worker.py")
    env, marker = engine_env.new_env()
    proc = engine_env.accelkit("conformance", "--backend", "cpu", "--checks-module", broken, "--checks-module",
                engine_env.CHECKS, "--no-builtin-checks", "-k", "broken.never_runs", "-k",
                "fixture.broadcast", env=env, timeout=300)
    assert engine_env.marked_processes(marker) == []
    assert proc.returncode == 1
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert lines[0].startswith("[1/2] ERROR") and "broken.never_runs" in lines[0]
    assert "worker pool of 2 ranks failed to start: " in proc.stdout
    assert "engine_broken_worker refuses to load in a worker" in proc.stdout
    assert lines[1].startswith("[2/2] ERROR") and "fixture.broadcast" in lines[1]
    assert "pool start-ups" not in proc.stdout  # no pool ever came up, and no retry


def test_list_into_a_closed_pipe_exits_quietly():
    """`accelkit conformance --list | head`: the reader going away is no error worth a
    traceback; the command ends like a Unix tool killed by SIGPIPE (exit 141)."""
    import subprocess

    env, _ = engine_env.new_env()
    proc = subprocess.Popen([sys.executable, "-m", "accelkit", "conformance", "--backend", "cpu",
                             *FIXTURE_ARGS, "--list"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert err == ""
