"""accelkit's sanitizer run: the C++ layer and the mock (device and mockccl) built with
AddressSanitizer (and UndefinedBehaviorSanitizer), then with ThreadSanitizer
(``ACCELKIT_SANITIZE``, accelkit.core.cpp), and under each build the tests of the code that
takes input from other processes or runs threads against each other:

- tests/mockccl/test_mockccl_hostile.py: hostile peers, on one machine and across two simulated hosts;
- tests/mockccl/test_mockccl_failures.py and tests/mockccl/test_mockccl_teardown.py: mockccl's failures and
  teardown (timeouts, mismatches, dead peers, abort with operations in flight);
- the allocator stress test (tests/mock/test_mock_device.py, its in-process
  ``test_allocator_under_threads_streams_and_empty_cache``, on the asynchronous mock).

The wire-format fuzz and the shared-memory transport's stress test are sanitized programs of
their own, run by every ``tox`` (tests/cpp/test_cpp_layer.py).

Every process gets the sanitizer's runtime preloaded, then the C++ runtime (``LD_PRELOAD``;
torch and Python are not instrumented, so it must come first) and writes its reports to a folder; a report is
explained only by a suppression in tests/sanitizers/<kind>.supp, each with its reason.
``python tests/sanitize.py [address] [thread]`` (both by default; ``tox -e sanitizers``) prints,
per sanitizer, the tests' outcome and every unexplained report, and exits 1 if any test failed
or any report is unexplained. Under a sanitizer the tests' time bounds are scaled
(``ACCELKIT_TIME_SCALE``, tests/support/python.py): the checks of behaviour stay as they are.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: (pytest arguments, extra environment) of each run, in tests/.
RUNS = [
    (["mockccl/test_mockccl_hostile.py", "mockccl/test_mockccl_failures.py",
      "mockccl/test_mockccl_teardown.py"], {}),
    (["mock/test_mock_device.py", "-k", "test_allocator_under_threads_streams_and_empty_cache"],
     {"ACCELKIT_MOCK_TEST_PROCESS": "1", "ACCELKIT_MOCK_ASYNC": "1",
      "ACCELKIT_MOCK_MEMORY": "64MiB", "ACCELKIT_MOCK_HOST_ACCESSIBLE": "0"}),
]

#: How much slower each sanitizer makes the code (the factor tests' time bounds are scaled by).
SLOWDOWN = {"address": 3, "thread": 10}


def preload(kind: str) -> str:
    """LD_PRELOAD for a process that loads the `kind` builds: the sanitizer's runtime, then the
    C++ runtime (Python does not link it, and without it loaded from the start the sanitizer
    cannot intercept exceptions: "CHECK failed ... real___cxa_throw")."""
    from accelkit.core.cpp import SANITIZERS

    cxx = os.environ.get("CXX", "c++")
    paths = []
    for lib in (SANITIZERS[kind], "libstdc++.so"):
        path = subprocess.run([cxx, f"-print-file-name={lib}"], capture_output=True, text=True,
                              check=True).stdout.strip()
        if not Path(path).is_file():
            sys.exit(f"sanitize.py: {cxx} has no {lib} (install its sanitizer runtime: "
                     "Debian's libasan8 / libtsan2 come with g++)")
        paths.append(str(Path(path).resolve()))
    return " ".join(paths)


def environment(kind: str, reports: Path) -> dict[str, str]:
    supp = TESTS / "sanitizers" / f"{kind}.supp"
    common = f"log_path={reports}/{kind}:halt_on_error=0"
    env = {**os.environ, "ACCELKIT_SANITIZE": kind, "LD_PRELOAD": preload(kind),
           "ACCELKIT_TIME_SCALE": str(SLOWDOWN[kind]), "OMP_NUM_THREADS": "1",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONMALLOC": "malloc"}
    if kind == "address":
        # Python and torch free what they allocate at exit in no order a leak check could
        # judge: leaks are out of this run's scope (the allocator's counters test them).
        env["ASAN_OPTIONS"] = f"{common}:detect_leaks=0:suppressions={supp}"
        env["UBSAN_OPTIONS"] = f"log_path={reports}/ubsan:print_stacktrace=1"
    else:
        # Exit codes stay the tests': reports are judged from the logs (unexplained()).
        env["TSAN_OPTIONS"] = f"{common}:exitcode=0:suppressions={supp}:second_deadlock_stack=1"
    return env


def unexplained(reports: Path) -> list[str]:
    """The reports the sanitizers wrote (suppressed ones are never written), one text each."""
    found = []
    for path in sorted(reports.glob("*")):
        text = path.read_text(errors="replace")
        for report in re.split(r"(?m)^={10,}\n", text):
            if re.search(r"(ERROR|WARNING): (Address|Thread|UndefinedBehavior)Sanitizer|"
                         r"runtime error:", report):
                found.append(f"{path.name}:\n{report.strip()[:6000]}")
    return found


def run(kind: str) -> bool:
    reports = Path(tempfile.mkdtemp(prefix=f"accelkit-sanitize-{kind}-"))
    env = environment(kind, reports)
    began = time.monotonic()
    print(f"== {kind}: building the C++ layer, the mock and mockccl with -fsanitize={kind}",
          flush=True)
    build = subprocess.run([sys.executable, "-c", "import accelkit.backends.mock; "
                            "from accelkit.backends.mock import mockccl; mockccl.extension()"],
                           env=env, cwd=TESTS)
    if build.returncode != 0:
        print(f"== {kind}: the build failed (exit {build.returncode})")
        return False
    ok = True
    for args, extra in RUNS:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *args], env={**env, **extra}, cwd=TESTS)
        ok = ok and proc.returncode == 0
        print(f"== {kind}: pytest {' '.join(args)}: exit {proc.returncode}", flush=True)
    found = unexplained(reports)
    for report in found:
        print(f"-- unexplained {kind} report in {report}\n")
    print(f"== {kind}: tests {'passed' if ok else 'FAILED'}, {len(found)} unexplained report(s) "
          f"in {time.monotonic() - began:.0f} s (reports in {reports})", flush=True)
    return ok and not found


def main(argv: list[str]) -> int:
    kinds = argv or ["address", "thread"]
    for kind in kinds:
        if kind not in SLOWDOWN:
            sys.exit(f"sanitize.py: {kind!r} is not a sanitizer here: use address and/or thread")
    results = {kind: run(kind) for kind in kinds}
    print("== " + ", ".join(f"{k}: {'clean' if v else 'FAILED'}" for k, v in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
