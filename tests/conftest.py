"""accelkit's tests: ``tests/`` (the ``support`` package) and ``tests/fixtures/`` (the check
modules and stand-ins the tests import by name: engine_env, mutant_faults, ...) importable here
and in every process the tests start; the ``mock_process`` and selection markers' hooks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS), str(TESTS / "fixtures")]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(TESTS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])

from support import markers, mock_process  # noqa: E402 (after the path it is imported from)
from support.mock_process import pytest_pycollect_makemodule, pytest_runtest_call  # noqa: E402,F401 (hooks)

#: Test files in the style of PyTorch's, run by `accelkit upstream` in
#: tests/upstream/test_upstream.py, never collected by accelkit's own test run.
collect_ignore = ["fixtures/upstream", "fixtures/upstream_failures"]


def pytest_configure(config) -> None:
    mock_process.pytest_configure(config)
    markers.pytest_configure(config)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by them
def pytest_collection_modifyitems(config, items) -> None:
    markers.pytest_collection_modifyitems(config, items)
