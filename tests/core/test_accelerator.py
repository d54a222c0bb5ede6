"""register_accelerator: refusals (checked before anything changes, so they run in the test
process) and a full registration in a process of its own."""

from __future__ import annotations

import re

import pytest
import torch
from accelkit.core import AcceleratorRegistrationError, register_accelerator
from accelkit.core.accelerator import BUILTIN_DEVICE_TYPES
from support.python import json_result, run_python


def _creator(dist_backend_opts, backend_options):
    raise AssertionError("never called: these tests only register the creator")


@pytest.fixture(autouse=True)
def _privateuse1_untouched():
    yield
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"
    assert not hasattr(torch, "pydev")


@pytest.mark.parametrize("name", ["1dev", "My-Dev", "MyDev", "", "_dev", "my dev"])
def test_invalid_name(name):
    with pytest.raises(AcceleratorRegistrationError) as err:
        register_accelerator(name, object())
    assert str(err.value) == (
        f"accelerator name {name!r} is not valid: use a lowercase Python identifier (letters, "
        "digits, '_', starting with a letter), e.g. 'myaccel'; it becomes the device string "
        "'<name>:0' and the module torch.<name>")


@pytest.mark.parametrize("name", ["cuda", "xpu", "meta", "privateuseone", "mtia"])
def test_builtin_device_name(name):
    with pytest.raises(AcceleratorRegistrationError,
                       match=rf"^accelerator name '{name}' collides with torch's built-in device "
                             rf"type '{name}'; choose a name of your own \(built-in: cpu, cuda"):
        register_accelerator(name, object())


def test_builtin_list_matches_torch():
    """The list is torch's own: torch.device() names every built-in type when it fails."""
    with pytest.raises(RuntimeError) as err:
        torch.device("nosuchdevice")
    listed = re.search(r"Expected one of (.*) device type", str(err.value)).group(1)
    assert set(listed.split(", ")) == BUILTIN_DEVICE_TYPES


def test_collective_backend_and_creator_go_together():
    expected = ("collective_backend and creator go together: pass both (the c10d backend name "
                "and the function that creates it) or neither")
    with pytest.raises(AcceleratorRegistrationError) as err:
        register_accelerator("pydev", object(), collective_backend="pyccl")
    assert str(err.value) == expected
    with pytest.raises(AcceleratorRegistrationError) as err:
        register_accelerator("pydev", object(), creator=_creator)
    assert str(err.value) == expected


def test_device_module_required():
    with pytest.raises(AcceleratorRegistrationError) as err:
        register_accelerator("pydev", None)
    assert str(err.value) == ("device_module for 'pydev' is None: pass the module (or object) "
                              "that becomes torch.pydev, with the members of "
                              "accelkit.core.DeviceHandle")


def test_creator_must_be_callable():
    with pytest.raises(AcceleratorRegistrationError,
                       match=r"^creator 'nope' is not callable: pass the function"):
        register_accelerator("pydev", object(), collective_backend="pyccl", creator="nope")


def test_builtin_collective_backend_name():
    with pytest.raises(AcceleratorRegistrationError) as err:
        register_accelerator("pydev", object(), collective_backend="gloo", creator=_creator)
    assert str(err.value).startswith(
        "collective backend name 'gloo' is a c10d backend built into torch (undefined, gloo, "
        "nccl")
    assert str(err.value).endswith("choose another name for 'pydev''s backend")


def test_name_taken_by_a_torch_attribute():
    with pytest.raises(AcceleratorRegistrationError) as err:
        register_accelerator("linalg", object())
    assert str(err.value).startswith(
        "cannot register accelerator 'linalg': torch.linalg already exists (<module "
        "'torch.linalg'")
    assert str(err.value).endswith("choose a name that is not a torch attribute")


REGISTER = """
import json, torch
from support import pydevice
import torch.distributed as dist
from accelkit.core import register_accelerator

def pyccl_creator(dist_backend_opts, backend_options):
    raise AssertionError("not called in this test")

def other_creator(dist_backend_opts, backend_options):
    raise AssertionError("not called in this test")

def error(**kwargs):
    try:
        register_accelerator(**kwargs)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

pydevice.install_hooks()
mod = pydevice.make_module("pydev")
out = {}
report = register_accelerator("pydev", mod, collective_backend="pyccl", creator=pyccl_creator)
out["ok"] = report.ok
out["errors"] = [f.problem for f in report.errors]
out["again_same_report"] = register_accelerator(
    "pydev", mod, collective_backend="pyccl", creator=pyccl_creator) is report
out["other_args"] = error(name="pydev", device_module=mod, collective_backend="pyccl",
                          creator=other_creator)
out["other_device"] = error(name="otherdev", device_module=pydevice.make_module("otherdev"))
out["taken_collective"] = error(name="otherdev", device_module=mod,
                                collective_backend="pyccl", creator=other_creator)
out["default_backend"] = dist.Backend.default_device_backend_map.get("pydev")
out["capability"] = dist.Backend.backend_capability.get("pyccl")
out["tensor_methods"] = hasattr(torch.Tensor, "is_pydev") and hasattr(torch.nn.Module, "pydev")
out["device"] = str(torch.device("pydev:1"))
out["initialized"] = mod._state["initialized"]
print(json.dumps(out))
"""


def test_register_once_idempotent_and_conflicts():
    r = json_result(run_python(REGISTER))
    assert r["ok"] and r["errors"] == []
    assert r["again_same_report"] is True
    assert r["other_args"].startswith(
        "AcceleratorRegistrationError: accelerator 'pydev' is already registered with other "
        "arguments: creator (first: <function pyccl_creator at ")
    assert "now: <function other_creator at " in r["other_args"]
    assert r["other_args"].endswith(
        "Registration happens once per process; pass the same arguments (or register once, at "
        "import of your package)")
    assert r["other_device"] == (
        "AcceleratorRegistrationError: cannot register accelerator 'otherdev': PrivateUse1 is "
        "already renamed to 'pydev' in this process (torch allows one PrivateUse1 device per "
        "process and a rename cannot be undone); register 'otherdev' in a process that does "
        "not load 'pydev' (check the torch.backends autoload entry points, or set "
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0)")
    assert r["taken_collective"] == (
        "AcceleratorRegistrationError: collective backend name 'pyccl' is already registered "
        "by __main__.pyccl_creator; choose another name for 'otherdev''s backend")
    assert r["default_backend"] == "pyccl"
    assert r["capability"] == ["pydev"]  # devices=[name]: a list, not the letters of the name
    assert r["tensor_methods"] is True
    assert r["device"] == "pydev:1"
    assert r["initialized"] is False  # registration leaves DeviceMesh free to pick the device


AUTOLOAD_MODULE = '''
def _creator(dist_backend_opts, backend_options):
    raise AssertionError("not called in this test")

def autoload():
    from support import pydevice
    from accelkit.core import register_accelerator
    pydevice.install_hooks()
    register_accelerator("pydev", pydevice.make_module("pydev"), collective_backend="pyccl",
                         creator=_creator)
'''


def test_torch_backends_entry_point_registers_at_import_torch(tmp_path):
    """The autoload documented in docs/registration.md: a ``torch.backends`` entry point
    whose function calls register_accelerator runs inside ``import torch``."""
    info = tmp_path / "pydev_autoload-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pydev_autoload\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\npydev = pydev_autoload:autoload\n")
    (tmp_path / "pydev_autoload.py").write_text(AUTOLOAD_MODULE)
    code = ("import torch, torch.distributed as dist\n"
            "print(torch._C._get_privateuse1_backend_name(), torch.device('pydev:1'),"
            " dist.Backend.default_device_backend_map['pydev'])")
    on = run_python(code, path=(str(tmp_path),), env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert (on.returncode, on.stdout) == (0, "pydev pydev:1 pyccl\n"), on.stderr
    off = run_python("import torch; print(torch._C._get_privateuse1_backend_name())",
                     path=(str(tmp_path),), env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert (off.returncode, off.stdout) == (0, "privateuseone\n"), off.stderr
