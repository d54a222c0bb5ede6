"""accelkit beside each supported torch release: installing it keeps the installed torch (no
silent downgrade or upgrade), and the range it declares holds the release. Run on each
release by ``tox -e torch213,torch214,torch215``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from accelkit.core import torch_internals, versions
from packaging.requirements import Requirement

pytestmark = pytest.mark.torch_version

ROOT = Path(__file__).resolve().parents[2]


def _torch_requirement() -> Requirement:
    (req,) = [Requirement(r) for r in metadata.requires("accelkit") or []
              if Requirement(r).name == "torch"]
    return req


def test_the_declared_torch_range_holds_the_installed_release():
    req = _torch_requirement()
    installed = torch.__version__.split("+")[0]
    assert installed in req.specifier, f"accelkit requires {req}, torch {installed} is installed"
    assert torch_internals.torch_release() in torch_internals.VERIFIED_ON


def test_installing_accelkit_leaves_the_installed_torch_alone(tmp_path):
    """``pip install`` of this checkout, resolved against this environment (dry run, no
    index): nothing but accelkit would be installed. The constraint file is emptied because
    this machine's pip configuration caps torch; a user's pip has no such cap."""
    empty = tmp_path / "no-constraints.txt"
    empty.write_text("")
    report = tmp_path / "report.json"
    env = {**os.environ, "PIP_CONSTRAINT": str(empty)}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
                           "--no-build-isolation", "--quiet", "--report", str(report), str(ROOT)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    planned = {i["metadata"]["name"]: i["metadata"]["version"]
               for i in json.loads(report.read_text())["install"]}
    assert planned == {"accelkit": metadata.version("accelkit")}, (
        f"pip install of accelkit beside torch {torch.__version__} would install {planned}")


def test_the_build_is_read_without_importing_torch():
    expected = (f"CUDA {torch.version.cuda}" if torch.version.cuda else
                f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else "CPU")
    assert versions.torch_build() == expected
    assert versions.release(versions.torch_version()) == versions.release(torch.__version__)
