"""The mock's driver (``backends/mock/csrc/driver/mockrt.h``) on its own, through its C API:
memory with kinds of copies, streams with priorities, events with timestamps, host-signalled
waits, sticky errors, in each of its modes. ``tests/mock/driver_tests.cpp`` is compiled once
with the host compiler (no torch) and each case runs in a process of its own, in a mode set by
the environment as the mock device's processes are."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from accelkit.backends.mock_spec import MODES
from support import ROOT, TESTS

DRIVER = ROOT / "backends" / "mock" / "csrc"

#: Modes beyond the device's four: a seeded schedule (one worker), launches that block.
EXTRA_MODES = {
    "seeded": {**MODES["async"], "ACCELKIT_MOCK_SCHEDULE": "7"},
    "launch-blocking": {**MODES["async"], "ACCELKIT_MOCK_LAUNCH_BLOCKING": "1"},
}
ALL_MODES = {**MODES, **EXTRA_MODES}
NOT_BLOCKING = [m for m in ALL_MODES if m != "launch-blocking"]

#: Each case and the modes it runs in: a case about queued work needs launches that return
#: (with launch blocking, a stream held by the host would hold the launching host too), the
#: priority case needs the seeded schedule's single worker.
CASES = {
    "device_count": list(ALL_MODES),
    "memory": list(ALL_MODES),
    "launch_returns": NOT_BLOCKING,
    "stream_order": list(ALL_MODES),
    "copy_async": list(ALL_MODES),
    "events": list(ALL_MODES),
    "wait_event": list(ALL_MODES),
    "sticky_error": NOT_BLOCKING,
    "wait_host": NOT_BLOCKING,
    "destroy_drains": list(ALL_MODES),
    "priority": ["seeded"],
    "launch_blocking": ["launch-blocking"],
}


@pytest.fixture(scope="module")
def driver_tests(tmp_path_factory) -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    assert compiler, "no C++ compiler (g++ or c++) on PATH: set CXX"
    exe = tmp_path_factory.mktemp("driver") / "driver_tests"
    subprocess.run([compiler, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread",
                    f"-I{DRIVER}", str(TESTS / "mock" / "driver_tests.cpp"),
                    str(DRIVER / "driver" / "mockrt.cpp"), "-o", str(exe)], check=True)
    return str(exe)


def run_case(exe: str, case: str, settings: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_MOCK_")}
    env.pop("LOCAL_WORLD_SIZE", None)
    return subprocess.run([exe, case], env={**env, **settings}, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("case,mode", [(c, m) for c, modes in CASES.items() for m in modes])
def test_driver_case(driver_tests, case, mode):
    proc = run_case(driver_tests, case, ALL_MODES[mode])
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stdout + proc.stderr


def test_every_case_of_the_program_runs(driver_tests):
    """The program's own list of cases is the table's, with invalid_settings (run below): a
    case added there runs here."""
    usage = subprocess.run([driver_tests], capture_output=True, text=True).stdout
    assert sorted(usage.split("cases:")[1].split()) == sorted([*CASES, "invalid_settings"])


@pytest.mark.parametrize("settings,variable", [
    ({"ACCELKIT_MOCK_MEMORY": "lots"}, "ACCELKIT_MOCK_MEMORY"),
    ({"ACCELKIT_MOCK_DEVICES": "65"}, "ACCELKIT_MOCK_DEVICES"),
    ({"ACCELKIT_MOCK_SCHEDULE": "3"}, "ACCELKIT_MOCK_SCHEDULE"),  # without ASYNC=1
    ({"ACCELKIT_MOCK_ASYNC": "1", "ACCELKIT_MOCK_SCHEDULE": "-1"}, "ACCELKIT_MOCK_SCHEDULE"),
])
def test_invalid_settings_fail_every_call_naming_the_variable(driver_tests, settings, variable):
    proc = run_case(driver_tests, "invalid_settings", settings)
    message, verdict = proc.stdout.strip().splitlines()
    assert (proc.returncode, verdict) == (0, "ok"), proc.stdout + proc.stderr
    assert message.startswith(f"{variable}={settings[variable]} is not ") or \
        "set ACCELKIT_MOCK_ASYNC=1" in message, message


def test_device_count_from_the_environment(driver_tests):
    proc = run_case(driver_tests, "device_count", {"ACCELKIT_MOCK_DEVICES": "3"})
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stdout + proc.stderr
