"""check_device_handle against deliberately broken Python device modules.

Each variant registers ``tests/support/pydevice.py``'s module, changed by a few lines, under
PrivateUse1 in its own interpreter (a rename cannot be undone), first through
``register_accelerator(strict=False)`` (the no-touch probes), then with the full checker.
The processes run four at a time.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from accelkit.core.handle import DeviceHandle, StreamDeviceHandle, members
from support.python import json_result, run_python

SCRIPT = """
import json, warnings
import torch
from support import pydevice
from accelkit.core import register_accelerator, check_device_handle
pydevice.install_hooks()
mod = pydevice.make_module("pydev")
cpu_rng = torch.get_rng_state()
{change}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    registration = register_accelerator("pydev", mod, strict=False)
after_registration = mod._state["initialized"]
full = check_device_handle("pydev")
out = {{"registration": registration.to_dict(), "full": full.to_dict(), "text": full.render(),
       "warned": [str(w.message) for w in caught], "after_registration": after_registration,
       "state": mod._state, "cpu_rng_kept": torch.equal(torch.get_rng_state(), cpu_rng),
       "cuda_seed_queued": torch.cuda._lazy_seed_tracker.manual_seed_all_cb is not None}}
{extra}
print(json.dumps(out))
"""

VARIANTS: dict[str, tuple[str, str]] = {
    "good": ("", ""),
    "initialized_early": ("mod.is_initialized = lambda: True", """
try:
    register_accelerator("pydev", mod, strict=True)
except Exception as exc:
    out["strict"] = f"{type(exc).__name__}: {exc}"
"""),
    "no_initialized_attribute": ("del mod.__getattr__", ""),
    "missing_seed_pair": ("del mod.manual_seed_all, mod._is_in_bad_fork, mod.synchronize", ""),
    "mt19937_state": ("""
mod.get_rng_state = lambda device=None: torch.zeros(5056, dtype=torch.uint8)
mod.set_rng_state = lambda new_state, device=None: None
""", ""),
    "sticky_state_device_and_seed_offset": ("""
mod.set_rng_state = lambda new_state, device=None: None
mod.set_device = lambda device: None
mod.is_initialized = lambda: False
seed_all = mod.manual_seed_all
def manual_seed(seed):
    seed_all(seed)
    mod._state["rng"][0][1] = 7
mod.manual_seed = manual_seed
""", ""),
    "int_only_device": ("""
get, put = mod.get_rng_state, mod.set_rng_state
def only_int(device):
    if device is not None and not isinstance(device, int):
        raise TypeError(f"device must be an int, got {type(device).__name__}")
    return device
mod.get_rng_state = lambda device=None: get(only_int(device))
mod.set_rng_state = lambda new_state, device=None: put(new_state, only_int(device))
""", ""),
    "no_devices": ("mod.device_count = lambda: 0", ""),
    "seed_32_bits": ("""
seed_one = mod.manual_seed
mod.manual_seed = lambda seed: seed_one(int(seed) & 0xFFFFFFFF)
""", ""),
    "no_device_here": ("mod.device_count = lambda: 0\nmod.is_available = lambda: False", """
try:
    register_accelerator("pydev", mod, strict=True)
    out["strict"] = "registered"
except Exception as exc:
    out["strict"] = f"{type(exc).__name__}: {exc}"
"""),
    "unavailable_with_devices": ("mod.is_available = lambda: False", ""),
}


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    def one(item):
        name, (change, extra) = item
        return name, run_python(SCRIPT.format(change=change, extra=extra))

    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = dict(pool.map(one, VARIANTS.items()))
    return procs


def _findings(result: dict, which: str = "full") -> list[dict]:
    return result[which]["findings"]


def _one(result: dict, member: str, pattern: str, which: str = "full") -> dict:
    hits = [f for f in _findings(result, which)
            if f["member"] == member and re.search(pattern, f["problem"])]
    assert len(hits) == 1, (member, pattern, _findings(result, which))
    return hits[0]


def _expected_warnings_only(findings: list[dict]) -> None:
    """The good module lacks the stream API, and these tests register no c10d backend."""
    assert sorted(f["member"] for f in findings) == sorted(
        [*members(StreamDeviceHandle), "<collective backend>"])
    assert all(f["severity"] == "warning" for f in findings)
    (f,) = [f for f in findings if f["member"] == "<collective backend>"]
    assert f["problem"] == "no c10d backend is registered for 'pydev' devices"


def test_good_module_passes_and_probing_restores_state(results):
    r = json_result(results["good"])
    assert r["registration"]["ok"] and r["full"]["ok"], r["text"]
    _expected_warnings_only(_findings(r, "registration"))
    _expected_warnings_only(_findings(r))
    assert r["full"]["probes"] >= 20
    assert r["registration"]["touched_device"] is False
    assert r["after_registration"] is False  # registering must not initialise the device
    assert r["state"]["current"] == 0
    assert r["state"]["rng"] == [[0, 0], [0, 0]]  # every device's RNG state was restored
    # torch.manual_seed (probed) reseeds every device: the CPU's and CUDA's seeds are kept too
    assert r["cpu_rng_kept"] and not r["cuda_seed_queued"]
    assert r["warned"] == []
    assert "torch.pydev: " in r["text"] and r["text"].splitlines()[0].endswith("OK")


def test_initialized_before_use_is_an_error_and_strict_raises(results):
    r = json_result(results["initialized_early"])
    for which in ("registration", "full"):
        f = _one(r, "is_initialized", r"^is_initialized\(\) is True before the device was used$",
                 which)
        assert f["severity"] == "error"
        assert "DeviceMesh never selects a device" in f["breaks"]
        assert f["fix"].startswith("return False until the runtime is initialised")
    assert not r["full"]["ok"] and r["text"].splitlines()[0].endswith("FAILED")
    assert len(r["warned"]) == 1 and r["warned"][0].startswith(
        "torch.pydev fails the device-handle check (registration itself is done")
    assert r["strict"].startswith("AcceleratorRegistrationError: torch.pydev fails the "
                                  "device-handle check")
    assert "is_initialized() is True before the device was used" in r["strict"]
    assert r["strict"].endswith("Fix the errors above, or pass strict=False to register "
                                "with a warning")


def test_missing_seed_pair_means_torch_manual_seed_skips_the_device(results):
    r = json_result(results["missing_seed_pair"])
    for member, other in (("manual_seed_all", "_is_in_bad_fork"),
                          ("_is_in_bad_fork", "manual_seed_all")):
        f = _one(r, member, rf"^torch\.pydev\.{member} is missing$")
        assert f["severity"] == "error"
        assert f["breaks"] == (f"torch.manual_seed() skips the device (it needs both {member} "
                               f"and {other}; torch.random._seed_custom_device only warns)")
        assert f["fix"] == f"add {member}() to the device module"
    f = _one(r, "synchronize", r"^torch\.pydev\.synchronize is missing$")
    assert f["breaks"] == members(DeviceHandle)["synchronize"]


def test_mt19937_sized_state_breaks_the_tracker(results):
    r = json_result(results["mt19937_state"])
    f = _one(r, "get_rng_state", r"^get_rng_state\(\) is a 5056-element torch\.uint8 tensor on "
             r"cpu, not 16 uint8 bytes on cpu \(uint64 seed \+ int64 offset\)$")
    assert f["severity"] == "error"
    assert "asserts in the offset setter" in f["breaks"]
    assert f["fix"].startswith("use a Philox-style generator")
    assert not [x for x in _findings(r) if x["member"] == "set_rng_state"]  # no 16-byte probes


def test_state_that_does_not_round_trip_and_a_seed_that_keeps_an_offset(results):
    r = json_result(results["sticky_state_device_and_seed_offset"])
    trips = [f for f in _findings(r) if f["member"] == "set_rng_state"]
    assert [re.sub(r" then get_rng_state.*", "", f["problem"]) for f in trips] == [
        "set_rng_state(state)", "set_rng_state(state, 0)", "set_rng_state(state, 'pydev:0')",
        "set_rng_state(state, device(type='pydev', index=0))"]
    assert "gives [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], not [0, 0, 0, 0, 0, 0, 0, 0, " \
           "4, 0, 0, 0, 0, 0, 0, 0]" in trips[0]["problem"]
    assert all("random DTensor ops repeat or diverge across ranks" in f["breaks"] for f in trips)
    f = _one(r, "manual_seed", r"^after manual_seed\(1234\) the state's \(seed, offset\) is "
             r"\(1234, 7\), not \(1234, 0\)$")
    assert f["fix"] == "make manual_seed(seed) set seed bytes [0:8] to seed and offset to 0"


def test_a_seed_kept_to_32_bits_is_an_error(results):
    r = json_result(results["seed_32_bits"])
    f = _one(r, "initial_seed", r"^initial_seed\(\) is 5 after manual_seed\(4294967301\) \(its "
             r"low 32 bits: the seed is truncated\)$")
    assert f["fix"].startswith("keep the seed as a uint64")
    _one(r, "manual_seed", r"^after manual_seed\(4294967301\) the state's seed bytes hold 5$")


def test_device_argument_must_accept_str_and_torch_device(results):
    r = json_result(results["int_only_device"])
    gets = [f["problem"] for f in _findings(r) if f["member"] == "get_rng_state"]
    assert gets == [
        "get_rng_state('pydev:0') raised TypeError: device must be an int, got str",
        "get_rng_state(device(type='pydev', index=0)) raised TypeError: device must be an int, "
        "got device"]
    sets = [f["problem"] for f in _findings(r) if f["member"] == "set_rng_state"]
    assert sets == [
        "set_rng_state(state, 'pydev:0') raised TypeError: device must be an int, got str",
        "set_rng_state(state, device(type='pydev', index=0)) raised TypeError: device must be "
        "an int, got device"]
    for f in _findings(r):
        if f["severity"] == "error":
            assert f["fix"] == "accept the device as an int, a '<name>:<i>' str and a torch.device"
            assert f["breaks"] == ("torch.random.fork_rng(devices=[torch.device('pydev:i')]), "
                                   "which DTensor's OffsetBasedRNGTracker runs every random op in")


def test_zero_devices_is_an_error_and_stops_the_device_probes(results):
    r = json_result(results["no_devices"])
    for which in ("registration", "full"):
        f = _one(r, "device_count", r"^device_count\(\) returned 0, not an int > 0$", which)
        assert "DeviceMesh skips device selection" in f["breaks"]
    f = _one(r, "<probes>", r"^RNG and device probes skipped: no usable device$")
    assert f["severity"] == "info"
    assert r["state"]["initialized"] is False


def test_no_device_here_is_a_state_and_registration_succeeds(results):
    """is_available() False with device_count() 0 (a host without the card): no error, so
    registering at `import torch` works there; the device probes are skipped."""
    r = json_result(results["no_device_here"])
    assert r["strict"] == "registered"
    for which in ("registration", "full"):
        assert r[which]["ok"], r[which]
        f = _one(r, "is_available", r"^no device here: is_available\(\) is False and "
                 r"device_count\(\) is 0$", which)
        assert f["severity"] == "info"
    _one(r, "<probes>", r"^RNG and device probes skipped: no usable device$")
    assert r["state"]["initialized"] is False


def test_unavailable_with_devices_present_is_an_error(results):
    r = json_result(results["unavailable_with_devices"])
    f = _one(r, "is_available", r"^is_available\(\) returned False, not True$")
    assert f["severity"] == "error"


def test_missing_initialized_attribute_breaks_activation_checkpointing(results):
    r = json_result(results["no_initialized_attribute"])
    f = _one(r, "_initialized", r"^torch\.pydev\._initialized is not True after the device was used$")
    assert f["severity"] == "error" and "torch.utils.checkpoint" in f["breaks"]
    assert not r["full"]["ok"] and r["registration"]["ok"]  # probed only once the device is used


def test_set_device_without_effect_and_is_initialized_never_true(results):
    r = json_result(results["sticky_state_device_and_seed_offset"])
    f = _one(r, "set_device", r"^after set_device\(1\) current_device\(\) is 0$")
    assert f["severity"] == "error" and "ranks share one device" in f["breaks"]
    f = _one(r, "is_initialized",
             r"^is_initialized\(\) is still False after set_device/get_rng_state were used$")
    assert f["severity"] == "warning"
    assert "DeviceMesh calls set_device(rank % device_count())" in f["breaks"]


def test_cpu_reports_torch_limits_not_errors():
    from accelkit.core import check_device_handle

    report = check_device_handle("cpu")
    assert report.ok and report.errors == []
    assert {f.severity for f in report.findings} == {"unsupported"}
    tracker = next(f for f in report.findings if f.member == "OffsetBasedRNGTracker")
    assert "the tracker refuses cpu meshes" in tracker.problem
    assert "[unsupported by torch] OffsetBasedRNGTracker" in report.render()


def test_unknown_device_type_names_the_fix():
    from accelkit.core import check_device_handle

    report = check_device_handle("nosuchdev")
    (f,) = report.errors
    assert f.problem.startswith("torch does not know the device type 'nosuchdev'")
    assert f.fix.startswith("register the device first with accelkit.core.register_accelerator")


def test_finding_rejects_unknown_severity():
    from accelkit.core import Finding

    with pytest.raises(ValueError, match=r"Finding.severity='fatal': expected one of"):
        Finding("fatal", "x", "p", "b", "f")


#: Members torch calls only for another device type (``if self._device.type == "hpu"``).
HPU_ONLY = {"set_rng_ctx", "unset_rng_ctx"}


def test_protocol_covers_what_installed_torch_calls():
    """Read the installed torch's DeviceMesh, DTensor RNG, fork_rng/manual_seed and
    torch.accelerator sources: every member they call on the handle is in the protocol."""
    from pathlib import Path

    import torch

    root = Path(torch.__file__).parent
    sources = ["distributed/device_mesh.py", "distributed/tensor/_random.py", "random.py",
               "accelerator/__init__.py"]
    pattern = re.compile(r"\b(?:device_handle|_device_handle|device_mod|custom_device_mod|mod)"
                         r"\.([A-Za-z_]\w*)\(")
    called = {m for src in sources for m in pattern.findall((root / src).read_text())}
    assert {"is_initialized", "set_device", "get_rng_state", "set_rng_state"} <= called
    declared = set(members(DeviceHandle)) | set(members(StreamDeviceHandle))
    assert called - declared - HPU_ONLY == set()
    seeding = (root / "random.py").read_text()
    assert '_bad_fork_name = "_is_in_bad_fork"' in seeding
    assert '_seed_all_name = "manual_seed_all"' in seeding
