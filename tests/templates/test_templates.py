"""End to end: ``accelkit new demo``, add a kernel file of the vendor's own, build ``torch_demo``
ahead of time, and prove it works like the mock: ``import torch`` loads it, the vendor's kernels
win over accelkit's, and ``accelkit conformance --backend demo`` at world size 4 passes every
check the mock passes.

The package is installed with ``pip --target`` into a folder of its own, never into the test
environment: installed there, ``import torch`` would load demo into every later test process
and take PrivateUse1 away from the mock. Every process that loads it gets that folder on
``PYTHONPATH``. One build per module (a few minutes on two cores).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.python import json_result, run_python

from accelkit.cli import main

#: The generated package's collective library: a name of the vendor's own, not the default.
CCL = "demoxccl"


#: The vendor's second kernel file: `view` (one of accelkit's kernels) done the vendor's way.
VENDOR_KERNELS = """\
#include <accelkit/accelkit.h>

#include <ATen/native/TensorShape.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

namespace {
at::Tensor demo_view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}
}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("view", TORCH_FN(demo_view)); }
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """Render torch_demo and install it into ``<tmp>/site``; the paths and the build time."""
    root = tmp_path_factory.mktemp("demo")
    # A collective library name of the vendor's own (not the default "democcl"), so the build
    # proves --collective-backend renders into code that compiles and registers.
    assert main(["new", "demo", "--dir", str(root / "torch_demo"), "--collective-backend", CCL]) == 0
    # A kernel file of the vendor's own, beside the rendered ones: several translation units
    # include accelkit's headers, and its `view` replaces accelkit's.
    (root / "torch_demo" / "csrc" / "kernels" / "demo_views.cpp").write_text(VENDOR_KERNELS)
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
    # The vendor's kernels (the rendered binary_ops.cpp and its own demo_views.cpp) win, also
    # over accelkit's `view`; the rest is accelkit's.
    assert "PrivateUse1 kernels: 4 the vendor's" in proc.stdout, proc.stdout
    for op, file in (("aten::add.Tensor", "binary_ops.cpp"), ("aten::view", "demo_views.cpp")):
        assert re.search(rf"vendor +{re.escape(op)} +\(.*csrc/kernels/{file}:\d+\)", proc.stdout)
    assert re.search(r"accelkit +aten::uniform_", proc.stdout)
    assert not re.search(r"accelkit +aten::view\b", proc.stdout)


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
    # A check the mock leaves unrun for a capability it does not declare in this mode (a
    # seeded schedule's serial streams) is a SKIP on both: the outcome compared.
    not_run = {i: c["reason"] for i, c in checks.items()
               if not c["ranks"] and not c["reason"].startswith("backend declares ")}
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


def test_no_device_keeps_import_torch_and_is_reported_unavailable(demo, tmp_path):
    """DEMO_DEVICES=0 (a host without the card): `import torch` with torch_demo autoloaded
    works, torch.demo is unavailable, and `accelkit conformance` reports the backend
    unavailable with the runtime's reason; its report states the device mode and the build."""
    env = _env(demo["site"], DEMO_DEVICES="0", TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    proc = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps("
                           "[torch.demo.is_available(), torch.demo.device_count(), "
                           "torch.ones(2).sum().item()]))"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert json_result(proc) == [False, 0, 2.0]
    run = subprocess.run([sys.executable, "-m", "accelkit", "conformance", "--backend", "demo",
                          "--area", "registration", "--report-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "the demo runtime reports no devices (DEMO_DEVICES=0)" in run.stdout + run.stderr
    report = (tmp_path / "report.md").read_text()
    assert "`DEMO_HOST_ACCESSIBLE=1`" in report and "`DEMO_ASYNC=0`" in report
    assert re.search(r"`build=\d{4}-\d\d-\d\dT[\d:]+Z in [\d.]+ s, sources [0-9a-f]{16}`",
                     report), report


def test_the_report_marks_a_build_older_than_its_sources(demo):
    """After an edit of csrc/ that was not (or failed to be) built, the installed build is
    marked STALE in the settings every report shows."""
    env = _env(demo["site"], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    code = "from torch_demo_spec import SPEC; print(SPEC.settings()['build'])"
    kernels = demo["root"] / "torch_demo" / "csrc" / "kernels" / "demo_views.cpp"
    before = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env)
    assert before.returncode == 0 and "STALE" not in before.stdout, before.stdout + before.stderr
    original = kernels.read_text()
    try:
        kernels.write_text(original + "int broken(\n")
        after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120, env=env)
    finally:
        kernels.write_text(original)
    assert f"; STALE: {demo['root'] / 'torch_demo' / 'csrc'} has changed since" in after.stdout, \
        after.stdout + after.stderr


def test_a_broken_install_does_not_block_its_rebuild(demo):
    """An installed torch_demo that fails to load (here: a bad DEMO_DEVICES) breaks
    `import torch` in that environment, as torch's autoload does for any backend; the package's
    own setup.py still runs there (it builds with the autoload off), so `pip install` of the fix
    works, and TORCH_DEVICE_BACKEND_AUTOLOAD=0 gets torch back."""
    env = _env(demo["site"], DEMO_DEVICES="100", TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    broken = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                            text=True, timeout=300, env=env)
    assert broken.returncode != 0
    assert "Failed to load the backend extension: demo" in broken.stderr
    assert "DEMO_DEVICES=100 is not a device count" in broken.stderr
    setup = subprocess.run([sys.executable, "setup.py", "--version"], capture_output=True,
                           text=True, timeout=600, env=env, cwd=demo["root"] / "torch_demo")
    assert setup.returncode == 0, setup.stderr[-3000:]
    assert setup.stdout.strip().splitlines()[-1] == "0.1.0"
    off = subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(1).sum().item())"],
                         capture_output=True, text=True, timeout=300,
                         env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert off.returncode == 0 and off.stdout.strip() == "1.0", off.stderr[-2000:]
