"""bench/suite_time.py reads a `.ci/run` output: the stages' times, each tox environment's
status and time, pytest's counts, and says whether the targets are met; a log that did not
finish is refused, naming what is missing. (Running `.ci/run` is the benchmark's job.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "suite_time.py"
sys.path.insert(0, str(SCRIPT.parent))

import suite_time  # noqa: E402  (bench/)

LOG = """== lint: 0 s into CI
lint: commands[0]> ruff check /tmp/ci
All checks passed!
  lint: OK (3.76=setup[3.64]+cmd[0.11] seconds)
  congratulations :) (3.86 seconds)
== tests: 4 s into CI
tests: commands[0]> pytest -q --durations=25
....
============================= slowest 25 durations =============================
181.59s call     tests/test_conformance_world_sizes.py::test_mock[8]
107.39s setup    tests/test_templates.py::test_import_torch_autoloads_demo
1030 passed, 2 skipped in 1869.17s (0:31:09)
  tests: OK (1911.37=setup[40.12]+cmd[1871.25] seconds)
== conformance: 1915 s into CI
conformance: commands[0]> accelkit conformance --backend mock
  conformance: OK (240.0=setup[20.0]+cmd[200.0,20.0] seconds)
== releases: 2155 s into CI
torch214: commands[0]> pytest -q -m torch_version
40 passed, 990 deselected in 60.00s
  torch214: FAIL code 1 (400.0=setup[300.0]+cmd[100.0] seconds)
== done: 2555 s into CI
"""


def test_a_log_gives_stages_environments_and_counts():
    parsed = suite_time.parse(LOG)
    assert [s["stage"] for s in parsed["stages"]] == ["lint", "tests", "conformance", "releases",
                                                     "done"]
    assert [(e["env"], e["status"]) for e in parsed["envs"]] == [
        ("lint", "OK"), ("tests", "OK"), ("conformance", "OK"), ("torch214", "FAIL code 1")]
    # an environment of several commands: tox lists each one's seconds
    assert parsed["envs"][2]["commands_s"] == 220.0
    assert parsed["pytest"] == [
        {"env": "tests", "counts": {"passed": 1030, "skipped": 2}, "seconds": 1869.17},
        {"env": "torch214", "counts": {"passed": 40, "deselected": 990}, "seconds": 60.0}]
    assert parsed["slowest"][0]["item"] == "tests/test_conformance_world_sizes.py::test_mock[8]"
    raw = {"commit": "abc1234", "date": "2026-12-03 18:00 UTC", "cpus": 2,
           "load_before": [1.0], "load_after": [2.0], "caches": "warm", "total_s": 2555, **parsed}
    text = suite_time.markdown(raw)
    assert "| tests | 31.9 |" in text and "| **all of `.ci/run`** | **42.6** |" in text
    assert "`tox` (the tests): 31.9 min; target ≤ 10 min from warm C++ caches: **not met**." in text
    assert "CI: 42.6 min; budget ≤ 45 min: met, goal ≤ 30 min: **not met**." in text


def test_the_run_is_dated_and_its_load_read_from_its_own_stage_lines():
    """Stage lines with the load and the time (today's `.ci/run`) date the record by the run;
    a log recorded later keeps the run's date and load, not those of the recording."""
    log = LOG.replace("== lint: 0 s into CI", "== lint: 0 s into CI, load 0.25, 2026-12-05 08:00 UTC")
    log = log.replace("== done: 2555 s into CI", "== done: 2555 s into CI, load 7.50, 2026-12-05 08:42 UTC")
    stages = suite_time.parse(log)["stages"]
    assert stages[0] == {"stage": "lint", "at_s": 0, "load": 0.25, "date": "2026-12-05 08:00 UTC"}
    assert "load" not in stages[1]
    assert suite_time._when(stages) == {"date": "2026-12-05 08:00 UTC", "load_before": [0.25],
                                        "load_after": [7.5]}
    assert suite_time._when(suite_time.parse(LOG)["stages"]) == {}
    raw = {"commit": "abc1234", "cpus": 2, "caches": "warm", "total_s": 2555,
           **suite_time.parse(log), **suite_time._when(stages)}
    assert "abc1234, 2026-12-05 08:00 UTC, 2 CPUs, load 0.2 before and 7.5 after" in \
        suite_time.markdown(raw)


def test_a_log_that_did_not_finish_is_refused(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text(LOG.split("== done")[0])
    proc = subprocess.run([sys.executable, str(SCRIPT), "--log", str(log)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert "the log ends before .ci/run's 'done' stage" in proc.stderr
    proc = subprocess.run([sys.executable, str(SCRIPT), "--log", str(tmp_path / "none.log")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no such file" in proc.stderr
