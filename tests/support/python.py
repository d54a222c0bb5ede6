"""Run Python in a fresh process: PrivateUse1 can be renamed once per process, so every test
that registers a device runs its own interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import TESTS

#: How much slower than usual the code under test runs: a sanitizer build's run
#: (tests/sanitize.py) sets ACCELKIT_TIME_SCALE, and tests multiply their time bounds by it.
TIME_SCALE = float(os.environ.get("ACCELKIT_TIME_SCALE", "1"))


def run_python(code: str, *args: str, timeout: float = 120, path: tuple[str, ...] = (),
               env: dict[str, str] | None = None, cwd: Path = TESTS) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in ``cwd`` (importable first, as for any ``python -c``) with
    ``tests/`` and ``path`` importable and torch's backend autoload off unless ``env`` turns
    it on; returns the finished process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
           "PYTHONPATH": os.pathsep.join([str(TESTS), *path, os.environ.get("PYTHONPATH", "")]),
           **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


def json_result(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object a snippet printed as its last stdout line; fails with its stderr."""
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(f"snippet failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
