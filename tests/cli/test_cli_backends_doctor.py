"""``accelkit backends`` and ``accelkit doctor``: output and exit codes, end to end through
``python -m accelkit`` where it matters, in-process for the error paths."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from accelkit.core import registry
from accelkit.core.spec import BackendSpec
from support.python import run_python

from accelkit.cli import main


def _accelkit(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "accelkit", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_discovered", True)  # only what the test registers
    return registry


def _spec(name, setup=lambda: None, probe=lambda world_size=1: (True, "here")):
    return BackendSpec(name=name, device_type="cpu", collective_backend="gloo", setup=setup,
                       probe=probe)


def test_backends_table():
    proc = _accelkit("backends", "--world-size", "2")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(None, 5) for line in proc.stdout.splitlines()]
    assert rows[0] == ["NAME", "DEVICE", "COLLECTIVE", "RNG", "AVAILABLE", "REASON"]
    by_name = {row[0]: row for row in rows[1:]}
    assert by_name["cpu"] == ["cpu", "cpu", "gloo", "unsupported", "yes", "gloo is available"]
    assert by_name["mock"][:5] == ["mock", "mock", "mockccl", "offset-exact", "yes"]
    if not torch.cuda.is_available():
        assert by_name["cuda"] == ["cuda", "cuda", "nccl", "offset-consistent", "no",
                                   "no CUDA device (torch.cuda.is_available() is False)"]
    # columns line up: every row starts its AVAILABLE cell where the header does
    column = proc.stdout.splitlines()[0].index("AVAILABLE")
    assert all(line[column:column + 3] in ("yes", "no ") for line in proc.stdout.splitlines()[1:])


def test_backends_registers_no_device(capsys):
    assert main(["backends"]) == 0
    assert "mock" in capsys.readouterr().out
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"
    assert "accelkit.backends.mock" not in sys.modules


def test_backends_shows_a_failing_probe_in_its_row(fresh, capsys):
    def probe(world_size=1):
        raise OSError("driver not loaded")

    fresh.register(_spec("flaky", probe=probe), origin="test")
    assert main(["backends"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split(None, 5) == [
        "flaky", "cpu", "gloo", "unsupported", "no", "probe raised OSError: driver not loaded"]


def test_backends_rejects_a_bad_world_size(capsys):
    assert main(["backends", "--world-size", "0"]) == 2
    assert capsys.readouterr().err == "accelkit backends: --world-size must be >= 1, got 0\n"


def test_doctor_cpu():
    proc = _accelkit("doctor", "cpu")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "backend 'cpu': device 'cpu', collectives 'gloo'"
    import torch
    from accelkit.core import torch_internals

    n = len(torch_internals.PRIVATE_APIS)
    assert lines[1].startswith(f"torch {torch.__version__} (") and lines[1].endswith(
        f" build): verified; {n} of {n} private torch APIs accelkit uses are present"), lines[1]
    assert lines[2] == ("torch.cpu: 2 probes; 0 ERROR, 0 WARNING, 0 info, 2 unsupported by "
                        "torch; OK")
    assert lines[3].startswith("[unsupported by torch] OffsetBasedRNGTracker: the tracker "
                               "refuses cpu meshes")


def test_doctor_unknown_backend(capsys):
    assert main(["doctor", "mokc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accelkit doctor: unknown backend 'mokc'; known backends: mock, ")


def test_doctor_backend_not_built_yet(fresh, capsys):
    def setup():
        raise NotImplementedError("the acme device is not built yet")

    fresh.register(_spec("acme", setup=setup), origin="test")
    assert main(["doctor", "acme"]) == 2
    assert capsys.readouterr().err == (
        "accelkit doctor: cannot set up backend 'acme': NotImplementedError: the acme device is "
        "not built yet\n")


def test_doctor_unavailable_backend(fresh, capsys):
    fresh.register(_spec("acme", probe=lambda world_size=1: (False, "no acme card")),
                   origin="test")
    assert main(["doctor", "acme"]) == 2
    assert capsys.readouterr().err == ("accelkit doctor: backend 'acme' is unavailable here: "
                                       "no acme card\n")


DOCTOR_BROKEN = """
import sys
from support import pydevice
from accelkit.cli import main
from accelkit.core import register_accelerator, registry
from accelkit.core.spec import BackendSpec

def setup():
    pydevice.install_hooks()
    mod = pydevice.make_module("pydev")
    mod.get_rng_state = lambda device=None: __import__("torch").zeros(8, dtype=__import__(
        "torch").uint8)
    register_accelerator("pydev", mod, strict=False)

registry.register(BackendSpec(name="pybroken", device_type="pydev", collective_backend="pyccl",
                              setup=setup, probe=lambda world_size=1: (True, "python device")),
                  origin="test")
sys.exit(main(["doctor", "pybroken"]))
"""


def test_doctor_exit_code_1_on_errors():
    proc = run_python(DOCTOR_BROKEN)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "backend 'pybroken': device 'pydev', collectives 'pydev:pyccl,cpu:gloo'"
    assert lines[2].startswith("torch.pydev: ") and lines[2].endswith("; FAILED")
    assert ("[ERROR] get_rng_state: get_rng_state() is a 8-element torch.uint8 tensor on cpu, "
            "not 16 uint8 bytes on cpu (uint64 seed + int64 offset)") in lines
    assert "Traceback" not in proc.stderr


DOCTOR_RANDOM_OP = """
import sys, torch
import accelkit.backends.mock  # noqa: F401
from accelkit.cli import main

if sys.argv[1] == "cpu-generator":  # a uniform_ kernel that draws from the CPU generator
    lib = torch.library.Library("aten", "IMPL")

    def uniform_(self, low=0.0, high=1.0, generator=None):
        return self.copy_(torch.empty(self.shape, dtype=self.dtype).uniform_(low, high))

    lib.impl("uniform_", uniform_, "PrivateUse1")
sys.exit(main(["doctor", "mock"]))
"""


@pytest.mark.parametrize("kernel", ["accelkit", "cpu-generator"])
def test_doctor_probes_that_a_device_random_op_advances_the_offset(kernel):
    proc = run_python(DOCTOR_RANDOM_OP, kernel, timeout=300)
    if kernel == "accelkit":
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "<random op>" not in proc.stdout
        return
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("[ERROR] <random op>: torch.rand(64, device='mock:0') left the generator at (seed, "
            "offset) (") in proc.stdout
    assert "expected seed" in proc.stdout and "and an offset above" in proc.stdout


def _doctor_on_fault_build(fault: str, **mode: str) -> subprocess.CompletedProcess:
    """``accelkit doctor mock`` on the mock's fault build (tests/catalogue/test_mutants.py) with
    ACCELKIT_FAULT=fault in the mock's mode ``mode`` (its environment switches)."""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1",
           "ACCELKIT_MOCK_FAULTS": "1", "ACCELKIT_FAULT": fault, **mode}
    return subprocess.run([sys.executable, "-m", "accelkit", "doctor", "mock"],
                          capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.parametrize("mode", [{}, {"ACCELKIT_MOCK_ASYNC": "1"},
                                  {"ACCELKIT_MOCK_HOST_ACCESSIBLE": "0"}],
                         ids=["default", "async", "discrete"])
def test_doctor_names_a_runtime_copy_that_drops_half_of_large_transfers(mode):
    """The runtime's copy loses half of each device-to-host transfer above 1 MiB: in the
    default mode the layer never calls it (host memory is copied by the host) and only the
    doctor's own probe of Runtime::copy sees it; in the discrete and asynchronous modes torch's
    copies take it too. Each finding names the function, direction and size."""
    proc = _doctor_on_fault_build("copy_drops_half_above_1mib", **mode)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("[ERROR] Runtime::copy: Runtime::copy device→pageable host of 1048583 bytes (offset "
            "0): ") in proc.stdout, proc.stdout
    assert "Runtime::copy device→pinned host of 67108865 bytes" in proc.stdout
    assert "of 1048576 bytes" not in proc.stdout  # 1 MiB itself is copied whole
    if mode:  # discrete or asynchronous: torch's copies go through the runtime's too
        assert "[ERROR] Tensor.copy_: Tensor.copy_ device→pageable host of 1048583" in proc.stdout
    else:  # synchronous host memory: only the doctor's probe of the runtime reaches it
        assert "Tensor.copy_" not in proc.stdout and "host→device" not in proc.stdout


def test_doctor_names_a_synchronize_that_does_not_wait():
    """An asynchronous runtime whose synchronize() returns at once: the doctor says so, naming
    synchronize; the same build without the fault is OK (the control)."""
    proc = _doctor_on_fault_build("synchronize_noop", ACCELKIT_MOCK_ASYNC="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("[ERROR] synchronize: synchronize() returned while the current stream still had "
            "queued work") in proc.stdout, proc.stdout
    control = _doctor_on_fault_build("", ACCELKIT_MOCK_ASYNC="1")
    assert control.returncode == 0, control.stdout + control.stderr
    assert "0 ERROR" in control.stdout
