"""tests/support/mock_process.py: a module marked ``mock_process`` is never imported by the pytest
process that collects it; each of its tests is an item per mode, selectable by node id, run
in a fresh interpreter with the mode's settings, and failing, skipping or erroring as itself.
The modules here stand in for the mock's (they read the mode's settings instead of
registering the mock), so each run is a plain pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import TESTS

MODULE = '''
import os

import pytest

if os.environ.get("ACCELKIT_MOCK_TEST_PROCESS") != "1":
    raise RuntimeError("imported outside the mock process")

pytestmark = pytest.mark.mock_process(modes=("default", "discrete"), env={"EXTRA": "yes"})


def test_settings():
    assert os.environ["EXTRA"] == "yes"
    assert os.environ["ACCELKIT_MOCK_HOST_ACCESSIBLE"] in ("0", "1")


@pytest.mark.parametrize("n", [1, 2])
def test_discrete_only_fails(n):
    assert os.environ["ACCELKIT_MOCK_HOST_ACCESSIBLE"] == "1", f"discrete memory, n={n}"


def test_skips():
    pytest.skip("nothing to see")
'''


def _pytest(tmp_path: Path, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from support.mock_process import pytest_configure, pytest_pycollect_makemodule, "
        "pytest_runtest_call\n")
    (tmp_path / "test_marked.py").write_text(MODULE)
    env = {**{k: v for k, v in os.environ.items() if k != "ACCELKIT_MOCK_TEST_PROCESS"},
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
                           "-o", "addopts=", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_each_test_is_an_item_per_mode_and_fails_as_itself(tmp_path):
    proc = _pytest(tmp_path, "-v", "test_marked.py")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    for name in ("test_settings[default]", "test_settings[discrete]",
                 "test_discrete_only_fails[1-default]", "test_discrete_only_fails[2-default]"):
        assert f"test_marked.py::{name} PASSED" in out, out
    for name in ("test_discrete_only_fails[1-discrete]", "test_discrete_only_fails[2-discrete]"):
        assert f"test_marked.py::{name} FAILED" in out, out
    assert "in the mock process, mode discrete:" in out
    assert "AssertionError: discrete memory, n=2" in out
    assert "SKIPPED" in out and "nothing to see" in out
    assert "2 failed, 4 passed, 2 skipped" in out


def test_a_node_id_runs_its_test_in_every_mode_or_in_the_one_named(tmp_path):
    every = _pytest(tmp_path, "-v", "test_marked.py::test_settings")
    assert every.returncode == 0, every.stdout + every.stderr
    assert "2 passed" in every.stdout
    one = _pytest(tmp_path, "-v", "test_marked.py::test_discrete_only_fails[2-discrete]")
    assert one.returncode == 1 and "1 failed in" in one.stdout, one.stdout


def test_a_module_that_fails_to_collect_is_an_error_not_an_empty_pass(tmp_path):
    (tmp_path / "test_broken.py").write_text(
        "import pytest\npytestmark = pytest.mark.mock_process(modes=('default',))\n"
        "import no_such_module_anywhere\n")
    proc = _pytest(tmp_path, "test_broken.py")
    assert proc.returncode != 0
    assert "collecting test_broken.py in a mock process (mode default) failed" in proc.stdout
    assert "no_such_module_anywhere" in proc.stdout


def test_a_mode_that_is_not_the_mocks_is_refused_naming_the_modes(tmp_path):
    (tmp_path / "test_odd.py").write_text(
        "import pytest\npytestmark = pytest.mark.mock_process(modes=('turbo',))\n")
    proc = _pytest(tmp_path, "test_odd.py")
    assert proc.returncode != 0
    assert "takes modes of default, discrete, async, discrete-async" in proc.stdout + proc.stderr


def test_a_hanging_test_ends_at_its_timeout_with_its_stack_and_the_module_runs_once(tmp_path):
    """A test that never returns in the mock process ends after ``TEST_TIMEOUT`` with the
    stack of the line it hangs on; each of the mode's items fails with it, and the module runs
    once for them all (a hang costs one timeout, not one per item)."""
    (tmp_path / "test_hangs.py").write_text(
        "import threading\nimport pytest\n"
        "pytestmark = pytest.mark.mock_process(modes=('async',))\n"
        "def test_first():\n    pass\n"
        "def test_hangs():\n    threading.Event().wait()\n"
        "def test_after():\n    pass\n")
    proc = _pytest(tmp_path, "-v", "test_hangs.py", env={"ACCELKIT_MOCK_TEST_TIMEOUT": "3"})
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "3 failed" in out, out
    assert "Timeout (0:00:03)!" in out and 'test_hangs.py", line 7 in test_hangs' in out, out
    assert out.count("in the mock process, mode async:") == 3, out
