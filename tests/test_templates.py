"""End to end: ``accelkit new demo``, build ``torch_demo`` ahead of time, and prove it works like
the mock: ``import torch`` loads it, and ``accelkit conformance --backend demo`` at world size 4
passes every check the mock passes.

The package is installed with ``pip --target`` into a folder of its own, never into the test
environment: installed there, ``import torch`` would load demo into every later test process
and take PrivateUse1 away from the mock. Every process that loads it gets that folder on
``PYTHONPATH``. One build per module (a few minutes on two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import json_result, run_python

from accelkit.cli import main

#: The generated package's collective library: a name of the vendor's own, not the default.
CCL = "demoxccl"


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """Render torch_demo and install it into ``<tmp>/site``; the paths and the build time."""
    root = tmp_path_factory.mktemp("demo")
    # A collective library name of the vendor's own (not the default "democcl"), so the build
    # proves --collective-backend renders into code that compiles and registers.
    assert main(["new", "demo", "--dir", str(root / "torch_demo"), "--collective-backend", CCL]) == 0
    site = root / "site"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(site),
         str(root / "torch_demo")],
        capture_output=True, text=True, timeout=1500,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    build_s = time.monotonic() - start
    assert proc.returncode == 0, f"building torch_demo failed:\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    print(f"\ntorch_demo built and installed in {build_s:.0f} s", file=sys.stderr)
    return {"root": root, "site": site, "build_s": build_s}


def _env(site: Path | None, **extra: str) -> dict[str, str]:
    """A process environment with ``site`` (if any) importable and accelkit's mock autoload
    off; torch's backend autoload stays on (a vendor's environment) unless ``extra`` says."""
    env = {k: v for k, v in os.environ.items() if k not in {"ACCELKIT_AUTOLOAD", "PYTHONPATH"}}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def test_import_torch_autoloads_demo(demo):
    proc = run_python("""
        import json, sys
        import torch
        x = torch.arange(6.0, device="demo:1")
        y = (x * 2 + 1).cpu()
        torch.manual_seed(7)
        a = torch.rand(4, device="demo")
        torch.manual_seed(7)
        b = torch.rand(4, device="demo")
        print(json.dumps({
            "loaded": "torch_demo" in sys.modules,
            "owner": torch._C._get_privateuse1_backend_name(),
            "count": torch.demo.device_count(),
            "device": str(x.device), "is_demo": x.is_demo,
            "parsed": str(torch.device("demo:1")),
            "y": y.tolist(), "same_seed_same_numbers": torch.equal(a, b),
            "rng_state_bytes": torch.demo.get_rng_state().numel(),
            "ccl": torch.distributed.Backend.default_device_backend_map.get("demo"),
        }))
    """, path=(str(demo["site"]),), env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
                                         "ACCELKIT_AUTOLOAD": ""})
    assert json_result(proc) == {
        "loaded": True, "owner": "demo", "count": 8, "device": "demo:1", "is_demo": True,
        "parsed": "demo:1", "y": [1.0, 3.0, 5.0, 7.0, 9.0, 11.0],
        "same_seed_same_numbers": True, "rng_state_bytes": 16, "ccl": CCL}


def test_autoload_works_from_the_package_folder(demo):
    """A vendor runs Python (and `tox -e conformance`) from their package's folder: the src/
    layout keeps the unbuilt sources there from shadowing the installed, compiled package."""
    proc = run_python("""
        import json, torch
        print(json.dumps({"count": torch.demo.device_count()}))
    """, path=(str(demo["site"]),), env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
                                         "ACCELKIT_AUTOLOAD": ""},
        cwd=demo["root"] / "torch_demo")
    assert json_result(proc)["count"] == 8


def test_spec_imports_without_registering(demo):
    """Listing backends imports torch_demo_spec, which must not claim PrivateUse1."""
    proc = run_python("""
        import json
        import torch
        from accelkit.core import registry
        spec = registry.get("demo")
        print(json.dumps({
            "owner": torch._C._get_privateuse1_backend_name(),
            "origin": spec.origin, "pg": spec.process_group_backend,
            "rng": spec.capabilities.rng, "expectations": spec.expectations.is_file(),
        }))
    """, path=(str(demo["site"]),))
    result = json_result(proc)
    assert result["owner"] == "privateuseone"
    assert result["origin"] == ("entry point 'demo' = 'torch_demo_spec:SPEC' of distribution "
                                "'torch_demo'")
    assert result["pg"] == f"demo:{CCL},cpu:gloo"
    assert result["rng"] == "offset-exact"
    assert result["expectations"] is True


def test_doctor_demo(demo):
    proc = subprocess.run([sys.executable, "-m", "accelkit", "doctor", "demo"],
                          capture_output=True, text=True, timeout=300, env=_env(demo["site"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"backend 'demo': device 'demo', collectives 'demo:{CCL},cpu:gloo'" in proc.stdout


def _conformance(backend: str, site: Path | None, report_dir: Path, *argv: str,
                 **env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "accelkit", "conformance", "--backend", backend, "--world-size",
         "4", "--report-dir", str(report_dir), *argv],
        capture_output=True, text=True, timeout=1200, env=_env(site, **env))
    report = report_dir / "report.json"
    assert report.is_file(), f"no report (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(report.read_text())


def _mock_outcomes(ids: list[str], report_dir: Path) -> dict[str, str]:
    """The mock's actual outcome of each check in ``ids`` (world size 4)."""
    selection = [arg for i in ids for arg in ("-k", i)]
    mock = _conformance("mock", None, report_dir, *selection, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    checks = {c["id"]: c for c in mock["checks"] if c["id"] in ids}
    assert set(checks) == set(ids)
    not_run = {i: c["reason"] for i, c in checks.items() if not c["ranks"]}
    assert not not_run, f"the mock did not run these checks, no reference: {not_run}"
    return {i: c["actual"] or c["outcome"] for i, c in checks.items()}


def test_conformance_demo_passes_what_mock_passes(demo, tmp_path):
    """Every check at world size 4 passes on demo, or the mock does not pass it either (the
    mock runs only the checks demo did not pass: its outcome is the reference)."""
    ours = _conformance("demo", demo["site"], tmp_path / "demo")
    assert ours["backend"]["origin"].startswith("entry point 'demo'")
    assert ours["backend"]["capabilities"]["rng"] == "offset-exact"
    outcomes = {c["id"]: c["outcome"] for c in ours["checks"]}
    assert outcomes, "no check ran on demo"
    print(f"\ndemo conformance: {ours['summary']} in {ours['duration_s']:.0f} s", file=sys.stderr)
    leaked = sorted(Path("/dev/shm").glob(f"{CCL}_*"))
    assert not leaked, f"{CCL} left shared-memory segments: {leaked}"
    others = {i: o for i, o in outcomes.items() if o != "pass"}
    if not others:
        return
    mock_outcomes = _mock_outcomes(sorted(others), tmp_path / "mock")
    regressions = {i: (mock_outcomes[i], o, next(c["reason"] for c in ours["checks"]
                                                 if c["id"] == i))
                   for i, o in others.items() if mock_outcomes[i] == "pass"}
    assert not regressions, f"pass on mock, not on demo (mock, demo, reason): {regressions}"
