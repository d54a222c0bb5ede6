"""Shared test helpers: run Python in a fresh process (PrivateUse1 can be renamed once per
process, so every test that registers a device runs its own interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def run_python(code: str, *args: str, timeout: float = 120, path: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) with ``tests/`` and ``path`` importable and torch's backend
    autoload off unless ``env`` turns it on; returns the finished process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
           "PYTHONPATH": os.pathsep.join([str(TESTS), *path, os.environ.get("PYTHONPATH", "")]),
           **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=TESTS)


def json_result(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object a snippet printed as its last stdout line; fails with its stderr."""
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(f"snippet failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
