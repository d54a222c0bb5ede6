"""The mock device in a fresh interpreter each: autoload only when asked, no devices as a
state, first use, the settings read from the environment and refused with their name, and
what `accelkit doctor` says of it (tests/mock/test_mock_device.py runs the rest inside the mock)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support.python import json_result, run_python


def test_autoload_only_when_asked():
    code = """
        import json, torch
        out = {"has": hasattr(torch, "mock")}
        if out["has"]:
            x = torch.ones(2, device=torch.device("mock:3"))
            out.update(dev=str(x.device), owner=torch._C._get_privateuse1_backend_name())
        print(json.dumps(out))
    """
    on = json_result(run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
                                           "ACCELKIT_AUTOLOAD": "mock"}))
    assert on == {"has": True, "dev": "mock:3", "owner": "mock"}
    off = json_result(run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
                                            "ACCELKIT_AUTOLOAD": ""}))
    assert off == {"has": False}


def test_no_devices_is_a_state_not_an_error(tmp_path):
    """ACCELKIT_MOCK_DEVICES=0 (a host without the card): `import torch` with the mock
    autoloaded works, torch.mock registers and is unavailable, a tensor on it is refused
    naming the count; `accelkit conformance` reports the backend unavailable, saying why."""
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "ACCELKIT_AUTOLOAD": "mock",
           "ACCELKIT_MOCK_DEVICES": "0"}
    out = json_result(run_python("""
        import json, torch
        try:
            torch.ones(1, device="mock")
            error = None
        except RuntimeError as exc:
            error = str(exc)
        print(json.dumps([torch._C._get_privateuse1_backend_name(), torch.mock.is_available(),
                          torch.mock.device_count(), torch.accelerator.device_count(),
                          torch.ones(2).sum().item(), error]))
    """, env=env))
    assert out[:5] == ["mock", False, 0, 0, 2.0]
    assert "mock error: no mock device is available here (device_count() is 0; " \
        "torch.mock.is_available() tells before use)" in out[5], out[5]
    proc = subprocess.run(
        [sys.executable, "-m", "accelkit", "conformance", "--backend", "mock", "--area",
         "registration", "--report-dir", str(tmp_path)], capture_output=True, text=True,
        timeout=300, env={**os.environ, **env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    text = proc.stdout + proc.stderr
    assert "the mock runtime reports no devices (ACCELKIT_MOCK_DEVICES=0)" in text, text


def test_not_initialized_before_first_use():
    out = json_result(run_python("""
        import json, torch, accelkit.backends.mock
        before = torch.mock.is_initialized()
        torch.mock.manual_seed(3)           # seeding does not initialize (as CUDA)
        seeded = torch.mock.is_initialized()
        torch.ones(1, device="mock")
        print(json.dumps([before, seeded, torch.mock.is_initialized()]))
    """))
    assert out == [False, False, True]


def test_privateuse1_taken_names_owner():
    proc = run_python("""
        import torch
        torch.utils.rename_privateuse1_backend("vendorx")
        import accelkit.backends.mock
    """)
    assert proc.returncode != 0
    assert ("cannot register accelerator 'mock': PrivateUse1 is already renamed to "
            "'vendorx' in this process") in proc.stderr


@pytest.mark.parametrize("var,value,message", [
    ("ACCELKIT_MOCK_DEVICES", "65", "ACCELKIT_MOCK_DEVICES=65 is not a device count: use an "
                                    "integer from 0 to 64, e.g. ACCELKIT_MOCK_DEVICES=8"),
    ("ACCELKIT_MOCK_MEMORY", "lots", "ACCELKIT_MOCK_MEMORY=lots is not a memory size: use bytes"
                                     " with an optional unit, e.g. 8GiB, 512MiB, 64MB or "
                                     "1000000"),
    ("ACCELKIT_MOCK_SCHEDULE", "soon", "ACCELKIT_MOCK_SCHEDULE=soon is not a seed: use a "
                                       "non-negative integer (e.g. ACCELKIT_MOCK_SCHEDULE=7), "
                                       "or off"),
    ("ACCELKIT_MOCK_SCHEDULE", "7", "ACCELKIT_MOCK_SCHEDULE=7 orders the streams of the "
                                    "asynchronous mode: set ACCELKIT_MOCK_ASYNC=1 with it"),
])
def test_bad_configuration(var, value, message):
    proc = run_python("import accelkit.backends.mock", env={var: value})
    assert proc.returncode != 0
    assert f"ValueError: {message}" in proc.stderr


#: A program with an ordering bug: a side stream reads what the default stream writes,
#: without waiting for it. Each round holds both streams until the host released them
#: (torch.mock's _Hold: a wait the host releases), so the device chooses among all of the
#: round's work at once; prints which value each round read.
MISSING_STREAM_WAIT = """
    import torch, accelkit.backends.mock
    from accelkit.backends.mock import _C
    x = torch.zeros(1 << 12, device="mock")
    side = torch.mock.Stream()
    seen = ""
    for _ in range(10):
        x.zero_()
        torch.mock.synchronize()
        hold = _C._Hold()
        hold.wait()
        x.fill_(1)
        with torch.mock.stream(side):
            hold.wait()
            y = x + 1  # no side.wait_stream(torch.mock.current_stream())
        hold.release()
        torch.mock.synchronize()
        seen += str(int(y[0].item()))
    print(seen)
"""


def test_a_seeded_schedule_reproduces_an_ordering_bug():
    """ACCELKIT_MOCK_SCHEDULE=<seed>: one worker runs every stream in an order drawn from
    the seed. A program missing a stream wait reads the old value in some rounds and the
    new one in others, different seeds in different rounds, and a seed gives the same
    rounds run after run: a race found under a seed is reproduced with it."""
    def rounds(seed: int) -> str:
        proc = run_python(MISSING_STREAM_WAIT, env={"ACCELKIT_MOCK_ASYNC": "1",
                                                    "ACCELKIT_MOCK_SCHEDULE": str(seed)})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    first, again, other = rounds(3), rounds(3), rounds(4)
    assert "1" in first and "1" in other, "the missing wait never showed"
    assert first == again, "the same seed interleaved the streams differently"
    assert first != other


def test_a_hold_on_a_synchronous_device_is_refused_not_a_hang():
    """On a synchronous mock a held stream would block the host before it could release
    it: wait() refuses, naming the asynchronous mode."""
    proc = run_python("""
        import torch, accelkit.backends.mock
        from accelkit.backends.mock import _C
        _C._Hold().wait()
    """, timeout=120)
    assert proc.returncode != 0
    assert "RuntimeError: _Hold.wait() holds a stream until the host releases it: it needs " \
           "the asynchronous mock (ACCELKIT_MOCK_ASYNC=1)" in proc.stderr


def test_a_hold_under_launch_blocking_is_refused_not_a_hang():
    """With ACCELKIT_MOCK_LAUNCH_BLOCKING=1 every launch waits on the host for its stream: a
    held stream would block the next launch before the host could release it."""
    proc = run_python("""
        import torch, accelkit.backends.mock
        from accelkit.backends.mock import _C
        _C._Hold().wait()
        torch.ones(4, device="mock")
    """, env={"ACCELKIT_MOCK_ASYNC": "1", "ACCELKIT_MOCK_LAUNCH_BLOCKING": "1"}, timeout=60)
    assert proc.returncode != 0
    assert "RuntimeError: _Hold.wait() holds a stream until the host releases it: it needs " \
           "the asynchronous mock (ACCELKIT_MOCK_ASYNC=1) without " \
           "ACCELKIT_MOCK_LAUNCH_BLOCKING=1" in proc.stderr


def test_a_dropped_hold_lets_go_and_elapsed_time_never_waits():
    """A _Hold dropped without release() lets its stream go (nobody could release it any
    more, and synchronize() would hang); Event.elapsed_time on an event still queued behind
    a hold raises at once, as cudaEventElapsedTime does, rather than wait, holding the GIL,
    for work only a Python thread can release; once the events completed it measures the
    time between them."""
    out = json_result(run_python("""
        import json, threading, time, torch, accelkit.backends.mock
        from accelkit.backends.mock import _C
        start, end = torch.mock.Event(enable_timing=True), torch.mock.Event(enable_timing=True)
        hold = _C._Hold()
        start.record()
        hold.wait()
        end.record()
        releaser = threading.Thread(target=lambda: (time.sleep(0.5), hold.release()))
        releaser.start()
        began = time.monotonic()
        try:
            start.elapsed_time(end)
            early = None
        except RuntimeError as exc:
            early = str(exc)
        raised_s = time.monotonic() - began
        releaser.join()
        end.synchronize()
        ms = start.elapsed_time(end)
        dropped = _C._Hold()
        dropped.wait()
        x = torch.ones(4, device="mock") * 2
        del dropped
        torch.mock.synchronize()
        print(json.dumps({"early": early, "raised_s": raised_s, "ms": ms,
                          "sum": x.sum().item()}))
    """, env={"ACCELKIT_MOCK_ASYNC": "1"}, timeout=60))
    assert "Both events must be completed" in out["early"], out
    assert out["raised_s"] < 0.4 and out["ms"] > 300, out
    assert out["sum"] == 8.0


def test_device_count_and_capacity_from_environment():
    out = json_result(run_python("""
        import json, torch, accelkit.backends.mock
        print(json.dumps([torch.mock.device_count(), torch.accelerator.device_count(),
                          torch.mock.mem_get_info(1)]))
    """, env={"ACCELKIT_MOCK_DEVICES": "3", "ACCELKIT_MOCK_MEMORY": "1.5GiB"}))
    assert out == [3, 3, [3 * 2**29, 3 * 2**29]]


def test_doctor_reports_no_findings():
    proc = subprocess.run([sys.executable, "-m", "accelkit", "doctor", "mock"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 ERROR, 0 WARNING" in proc.stdout
    # whose kernel each op has: the mock's own (csrc/kernels/), accelkit's, the fallback's
    assert re.search(r"PrivateUse1 kernels: 3 the vendor's, \d+ accelkit's, \d+ torch's; "
                     r"other ops run through accelkit's boxed fallback", proc.stdout)
    assert re.search(r"vendor +aten::add\.Tensor +\(.*kernels/binary_ops\.cpp:\d+\)",
                     proc.stdout)
    assert re.search(r"accelkit +aten::_has_compatible_shallow_copy_type", proc.stdout)
