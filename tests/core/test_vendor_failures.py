"""What a vendor's CI sees when the vendor package is broken, reproduced with an installed
(not built) package from tests/fixtures/fake_vendor.py: the failure is blamed on the right
backend, the reports are written with the real exception, and the ranks' native output is in
the report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import engine_env  # tests/fixtures (tests/conftest.py)
import fake_vendor  # tests/fixtures (tests/conftest.py)

REFUSED = ("register_accelerator(strict=True) refused torch.npubroken: is_initialized() is "
           "True before the device was used")


def _env(path: Path) -> dict:
    env, _ = engine_env.new_env(PYTHONPATH=str(path))
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    return env


def _broken_autoload(tmp_path) -> Path:
    return fake_vendor.install(tmp_path / "site", "npubroken",
                               autoload_body=f"raise ValueError({REFUSED!r})")


def test_backends_blames_the_package_whose_extension_fails_at_import(tmp_path):
    proc = engine_env.accelkit("backends", env=_env(_broken_autoload(tmp_path)), timeout=120)
    assert proc.returncode == 1
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:]}
    broken = rows["npubroken"].split(None, 5)
    assert broken[4] == "no", rows["npubroken"]
    assert f"raised ValueError: {REFUSED}" in broken[5]
    for other in ("cpu", "cuda", "mock"):  # not blamed, and no unrelated torch error shown
        assert rows[other].split(None, 5)[4:] == [
            "?", "not probed: import torch fails here because of npubroken's extension (see "
                 "its row)"]


def test_conformance_writes_reports_when_the_backend_fails_at_import(tmp_path):
    out = tmp_path / "reports"
    proc = engine_env.accelkit("conformance", "--backend", "npubroken", "--report-dir", str(out),
                               env=_env(_broken_autoload(tmp_path)), timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    error = report["error"]
    assert error.startswith("cannot import the check catalogue")
    assert "Failed to load the backend extension: npubroken" in error
    assert f"ValueError: {REFUSED}" in error  # the real exception under torch's
    assert report["versions"]["backend_distribution"] == {"name": "npubroken",
                                                          "version": fake_vendor.VERSION}
    assert report["settings"] == {"FAKE_MODE": "strict"}
    case = ET.parse(out / "junit.xml").getroot().find(".//testcase[@name='load_checks']")
    assert f"ValueError: {REFUSED}" in case.find("error").text
    assert REFUSED in (out / "report.md").read_text()
    assert f"ValueError: {REFUSED}" in proc.stdout


def test_a_rank_that_fails_at_setup_shows_its_native_output(tmp_path):
    """The runtime prints to the C stdout (buffered when it is a file) before setup() fails:
    the check's reason carries both the Python error and that output."""
    site = fake_vendor.install(tmp_path / "site", "npunative", setup_body='''
        import ctypes
        ctypes.CDLL(None).printf(b"npunative runtime: firmware 1.2 missing on /dev/npu0\\n")
        raise RuntimeError("npunative: no usable device")
        ''')
    out = tmp_path / "reports"
    proc = engine_env.accelkit("conformance", "--backend", "npunative", "-k",
                               "collectives.all_reduce_sum", "--world-size", "2",
                               "--report-dir", str(out), env=_env(site), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (check,) = json.loads((out / "report.json").read_text())["checks"]
    assert check["outcome"] == "error"
    assert "RuntimeError: npunative: no usable device" in check["reason"]
    assert "npunative runtime: firmware 1.2 missing on /dev/npu0" in check["reason"]
