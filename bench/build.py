"""Build times of accelkit's C++ layer and of the packages built on it.

Run: ``python bench/build.py [--keep DIR]``. In a fresh cache folder (``ACCELKIT_CACHE_DIR``)
and a fresh package, one after the other:

1. ``mock (cold)``: the mock's first build on a machine with nothing cached: accelkit's library
   (``accelkit.core.library()``) and the mock's two extensions (what a first ``accelkit
   conformance --backend mock`` or ``import accelkit.backends.mock`` pays once);
2. ``vendor (first)``: ``accelkit new benchdev`` then ``pip install --no-build-isolation`` of
   it, with the library already cached (a vendor's first build: its own files only);
3. ``vendor (one kernel touched)``: the same ``pip install`` after touching one kernel file
   (pip builds in the package folder, and only the touched file is compiled again).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Goals: the mock's first build and a vendor's rebuild after touching one kernel file.
TARGETS = {"mock (cold)": 120.0, "vendor (one kernel touched)": 40.0}


def _timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - start


def run(work: Path) -> dict[str, float]:
    env = {**os.environ, "ACCELKIT_CACHE_DIR": str(work / "cache"), "OMP_NUM_THREADS": "1",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = {"mock (cold)": _timed(
        [sys.executable, "-c", "from accelkit.backends.mock_spec import SPEC; SPEC.prepare()"], env)}
    package = work / "torch_benchdev"
    _timed([sys.executable, "-m", "accelkit", "new", "benchdev", "--dir", str(package)], env)
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
               "--no-index", "--disable-pip-version-check", "--target", str(work / "site"),
               "--upgrade", str(package)]
    out["vendor (first)"] = _timed(install, env)
    (package / "csrc" / "kernels" / "binary_ops.cpp").touch()
    out["vendor (one kernel touched)"] = _timed(install, env)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work in DIR and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = run(args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="accelkit-build-bench-") as tmp:
            results = run(Path(tmp))
    print(f"{'build':<30}{'seconds':>9}{'goal':>8}")
    for name, seconds in results.items():
        goal = TARGETS.get(name)
        verdict = "" if goal is None else (" ok" if seconds <= goal else " MISS")
        print(f"{name:<30}{seconds:>9.1f}{'' if goal is None else f'{goal:>7.0f}s'}{verdict}")
    return 0 if all(results[n] <= g for n, g in TARGETS.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
