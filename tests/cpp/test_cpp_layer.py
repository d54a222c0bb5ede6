"""C++ unit tests of accelkit's layer (tests/cpp/layer_tests.cpp, an extension built in the
test run, linked with accelkit's library like any device extension) and the registration
contract: explicit, once per process, a clear error for a second one."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from support import TESTS
from support.python import json_result, run_python

CPP = TESTS / "cpp"
CORE_CSRC = Path(__file__).resolve().parents[2] / "core" / "csrc"

#: Loads the test extension (compiled on first use) in a fresh interpreter.
LOAD = f"""
import json, torch
from accelkit.core.cpp import load_extension
t = load_extension("accelkit_layer_tests", [{str(CPP / "layer_tests.cpp")!r}],
                   include_dirs=[{str(CORE_CSRC)!r}])
"""

#: Random123's known-answer vectors for Philox4x32-10: (counter, key) -> output.
PHILOX_KAT = [
    (([0, 0, 0, 0], [0, 0]), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    (([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2), [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]),
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.fixture(scope="module")
def unit_results() -> dict:
    """Every pure unit result in one process (the extension builds once)."""
    cases = json.dumps([list(map(list, args)) for args, _ in PHILOX_KAT])
    proc = run_python(LOAD + f"""
out = {{"kat": [t.philox_block(c, k) for c, k in json.loads({cases!r})],
       "simd": [t.philox_simd_matches(key, first, n)
                for key in (0, 1, 0xDEADBEEFCAFEF00D, 2**64 - 1)
                for first in (0, 3, 2**32 - 5, 2**64 - 9) for n in (1, 7, 8, 9, 33, 1000)]}}
print(json.dumps(out))
""", timeout=900)
    return json_result(proc)


def test_philox_known_answers(unit_results):
    assert unit_results["kat"] == [expected for _, expected in PHILOX_KAT]


def test_philox_simd_equals_scalar_reference(unit_results):
    """Every block count around the SIMD widths (4, 8) and counters that wrap 32 and 64 bits."""
    assert all(unit_results["simd"]), unit_results["simd"]


def test_allocator_statistics_and_out_of_memory():
    """The caching allocator on a 1 MiB test device: sizes rounded to 512 bytes, a freed block
    kept (reserved, not allocated) and reused, the cache released before an out-of-memory
    error, which names requested, allocated, reserved and capacity."""
    proc = run_python(LOAD + """
t.register_device("layer tests")
torch.utils.rename_privateuse1_backend("acktest")
steps, oom, reused = t.allocator_case()
print(json.dumps({"steps": steps, "oom": oom, "reused": reused}))
""", timeout=900)
    out = json_result(proc)
    full, freed, after_oom, reset = out["steps"]
    assert full == {"allocated": 6144, "peak": 6144, "reserved": 6144, "allocations": 3,
                    "num_ooms": 0, "retries": 0}
    assert freed == {"allocated": 4096, "peak": 6144, "reserved": 6144, "allocations": 2,
                     "num_ooms": 0, "retries": 0}
    assert out["reused"] is True
    assert after_oom == {"allocated": 4096, "peak": 6144, "reserved": 4096, "allocations": 2,
                         "num_ooms": 1, "retries": 1}
    assert reset == {"allocated": 0, "peak": 0, "reserved": 4096, "allocations": 0,
                     "num_ooms": 1, "retries": 1}
    assert "acktest out of memory. Tried to allocate 2.00 MiB. Device 1 has a total capacity " \
           "of 1.00 MiB of which 1020.00 KiB is free. Of the allocated memory 4.00 KiB is " \
           "allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated." \
           in out["oom"], out["oom"]
    assert "(the test runtime has 1 MiB)" in out["oom"]


def test_second_registration_names_both_origins():
    """The mock registers first; a second extension's register_device raises (RuntimeError in
    Python, never an abort) naming both, and the first registration keeps working."""
    proc = run_python(LOAD + """
import accelkit.backends.mock
try:
    t.register_device("layer tests")
    error = None
except RuntimeError as exc:
    error = str(exc).splitlines()[0]
x = torch.ones(2, device="mock") + 1
print(json.dumps({"error": error, "still_works": x.cpu().tolist()}))
""", timeout=900)
    out = json_result(proc)
    assert out["still_works"] == [2.0, 2.0]
    assert out["error"].startswith("accelkit: cannot register the PrivateUse1 device of layer "
                                   "tests ("), out["error"]
    assert "accelkit_layer_tests" in out["error"]
    assert ": the mock device (" in out["error"] and "accelkit_mock_C" in out["error"]
    assert "already registered one in this process" in out["error"]
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in out["error"]
    assert "twice" not in out["error"]


def test_registering_twice_from_one_extension_is_an_error_not_an_abort():
    proc = run_python(LOAD + """
t.register_device("first call")
try:
    t.register_device("second call")
except RuntimeError as exc:
    print(json.dumps(str(exc).splitlines()[0]))
""", timeout=900)
    error = json_result(proc)
    assert error.startswith("accelkit: cannot register the PrivateUse1 device of second call (")
    assert ": first call (" in error
    # one extension registering twice is its own mistake: the fix is calling once, not the
    # autoload switch that separates two extensions
    assert "this extension calls accelkit::register_device twice. Call it once, from the " \
           "extension's PYBIND11_MODULE" in error, error
    assert "AUTOLOAD" not in error


def test_registration_is_explicit():
    """Loading an extension built on the layer registers nothing until it asks."""
    proc = run_python(LOAD + """
print(json.dumps({
    "hooks": torch._C._get_privateuse1_backend_name(),
    "fallback": torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1),
    "kernels": len(torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
                   and [k for k in torch._C._dispatch_get_registrations_for_dispatch_key(
                        "PrivateUse1") if k.startswith("aten::")]),
}))
""", timeout=900)
    assert json_result(proc) == {"hooks": "privateuseone", "fallback": False, "kernels": 0}


def test_cpp_sources_compile_once_into_the_library():
    """The layer's code is in core/csrc/, one folder per layer (as OpenReg's csrc/runtime,
    csrc/aten and csrc/distributed): runtime/ (the glue to the device's Runtime), aten/ (the
    kernels), c10d/ (the collective glue) and testing/ (the fault build); nothing lies
    beside them. The public headers hold no registration."""
    include = Path(__file__).resolve().parents[2] / "core" / "include" / "accelkit"
    code = re.compile(r"^(?!\s*//).*(TORCH_LIBRARY\w*\(|C10_REGISTER_GUARD_IMPL|"
                      r"RegisterPrivateUse1HooksInterface|SetAllocator\()", re.MULTILINE)
    registering = [p.name for p in include.rglob("*.h") if code.search(p.read_text())]
    assert registering == []
    assert sorted(p.name for p in CORE_CSRC.iterdir()) == ["aten", "c10d", "runtime", "testing"]
    layers = {p.relative_to(CORE_CSRC).as_posix() for p in CORE_CSRC.rglob("*.cpp")}
    assert {"runtime/allocator.cpp", "runtime/register.cpp", "aten/fallback.cpp",
            "aten/kernels.cpp", "c10d/backend.cpp", "testing/faults.cpp"} <= layers
    # The public c10d header declares what a collective library calls, no class of the glue.
    public = (include / "c10d" / "backend.h").read_text()
    assert re.findall(r"^class (\w+)\s*[:{]", public, re.MULTILINE) == []
    assert "void bind_collectives(" in public and "using Connect" in public


def test_defines_give_a_build_of_their_own():
    """library(defines=...) is another cache entry (never pruned for the default one), a
    malformed macro is refused with what to write, and the objects taken from the default
    build are only those of sources that mention no defined macro."""
    from accelkit.core.cpp import _Library

    default, faults = _Library(), _Library(("ACCELKIT_FAULTS",))
    assert default.dir.name.startswith("libaccelkit-")
    assert faults.dir.name.startswith("libaccelkit+ACCELKIT_FAULTS-")
    assert "-DACCELKIT_FAULTS" in faults.flags and "-DACCELKIT_FAULTS" not in default.flags
    with pytest.raises(ValueError, match="NAME or NAME=VALUE"):
        _Library(("-O0; rm",))
    with_fault_points = {p for p in CORE_CSRC.rglob("*.cpp") if "ACCELKIT_FAULTS" in p.read_text()}
    assert {"faults.cpp", "faulty_transport.cpp", "backend.cpp"} <= {p.name for p in with_fault_points}
    assert not set(faults._reused()) & with_fault_points


MOCK_CSRC = Path(__file__).resolve().parents[2] / "backends" / "mock" / "csrc"


def _sanitized_binary(name: str, sources: list[Path], sanitize: str, torch_libs: bool) -> Path:
    """tests/cpp/<name>.cpp and `sources` built into a program with `-fsanitize=<sanitize>`
    (cached by the content of the sources and of mockccl's headers, torch's version, and, for a
    program linked to torch's libraries, the folder its rpath names: another checkout's virtual
    environment may be gone)."""
    import hashlib
    import os

    import torch
    from accelkit.core.cpp import cache_root

    include = Path(__file__).resolve().parents[2] / "core" / "include"
    torch_dir = Path(torch.__file__).parent
    main = CPP / f"{name}.cpp"
    hashed = [main, *sources, *sorted(MOCK_CSRC.glob("mockccl*.h")),
              include / "accelkit" / "c10d" / "transport.h"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in hashed) + sanitize.encode()
                            + torch.__version__.encode()
                            + (str(torch_dir).encode() if torch_libs else b"")).hexdigest()[:16]
    binary = cache_root() / f"{name}-{digest}" / name
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        libs = ([f"-L{torch_dir / 'lib'}", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}"]
                if torch_libs else [])
        cmd = [os.environ.get("CXX", "c++"), "-std=c++20", "-O1", "-g", f"-fsanitize={sanitize}",
               "-fno-sanitize-recover=all", f"-I{include}", f"-I{MOCK_CSRC}", "-isystem",
               str(torch_dir / "include"), str(main), *map(str, sources),
               "-o", str(binary) + ".tmp", *libs]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        Path(str(binary) + ".tmp").rename(binary)
    return binary


def _tsan_binary() -> Path:
    """tests/cpp/transport_stress.cpp with the shared-memory transport's parts (not the
    module, not the network), under ThreadSanitizer."""
    parts = [p for p in sorted(MOCK_CSRC.glob("mockccl_*.cpp"))
             if p.name not in ("mockccl_net.cpp", "mockccl_hosts.cpp")]
    return _sanitized_binary("transport_stress", parts, "thread", torch_libs=True)


def test_wire_format_fuzz_finds_no_crash():
    """mockccl's wire decoders (mockccl_wire.h) on 200,000 seeded random inputs, bit flips and
    cut-short encodings, under AddressSanitizer and UndefinedBehaviorSanitizer: no crash, no
    read past a buffer, nothing decodes beyond the receiver's limit or from another rank, and
    valid encodings round-trip (each sanitizer report fails the run)."""
    binary = _sanitized_binary("wire_fuzz", [], "address,undefined", torch_libs=False)
    proc = subprocess.run([str(binary), "200000", "20261203"], capture_output=True, text=True,
                          timeout=600, env={"ASAN_OPTIONS": "detect_leaks=1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert proc.stdout.splitlines() == ["round trips ok", "random bytes ok", "mutations ok"]


def test_transport_under_thread_sanitizer():
    """The shared-memory transport's rounds, receive claims, tag matching and abort, with threads
    as ranks, under ThreadSanitizer: correct results, each message taken by one receive and by
    the receive of its tag, abort within a second, and no data race reported (TSan exits 66 on
    a report)."""
    proc = subprocess.run([str(_tsan_binary())], capture_output=True, text=True, timeout=600,
                          env={"TSAN_OPTIONS": "halt_on_error=1 exitcode=66"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert proc.stdout.splitlines()[:3] == ["rounds ok", "claims ok", "tags ok"], proc.stdout
    assert proc.stdout.splitlines()[3].startswith("abort ok"), proc.stdout


def test_a_sanitizer_build_is_a_variant_of_its_own_and_needs_its_runtime(monkeypatch):
    """ACCELKIT_SANITIZE=thread builds the library and extensions with -fsanitize=thread in
    cache folders of their own; loading one into a process without the sanitizer's runtime
    preloaded is refused naming the LD_PRELOAD line; an unknown sanitizer is refused naming
    the setting and the ones there are."""
    from accelkit.core import cpp

    monkeypatch.setenv("ACCELKIT_SANITIZE", "thread")
    assert cpp._variant("libaccelkit", ("ACCELKIT_FAULTS",)) == \
        "libaccelkit+ACCELKIT_FAULTS+sanitize-thread"
    assert "-fsanitize=thread" in cpp._Library().flags
    assert cpp._Library().dir.name.startswith("libaccelkit+sanitize-thread-")
    with pytest.raises(RuntimeError, match=r"ACCELKIT_SANITIZE=thread: extensions built with the "
                                           r"thread sanitizer load only where its runtime was "
                                           r"loaded first: run with LD_PRELOAD="):
        cpp._check_sanitizer_runtime()
    monkeypatch.setenv("ACCELKIT_SANITIZE", "memory")
    with pytest.raises(ValueError, match="ACCELKIT_SANITIZE=memory is not a sanitizer accelkit "
                                         "builds with: use address or thread"):
        cpp.sanitizer()
    monkeypatch.delenv("ACCELKIT_SANITIZE")
    assert cpp._variant("libaccelkit", ()) == "libaccelkit" and cpp._sanitize_flags() == []
