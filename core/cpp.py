"""Building C++ against the installed torch, and the reusable C++ integration layer.

:func:`include_dir` is the folder of accelkit's C++ headers (``#include <accelkit/...>``),
shipped inside the package like pybind11's ``get_include()``. :func:`load_extension`
compiles a backend's sources on first use into a cache folder keyed by the torch version,
the Python ABI, the flags and the content of every source and header, so a new torch or
an edited source always rebuilds and a stale binary is never loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def include_dir() -> str:
    """The folder holding ``accelkit/*.h``: add it to a vendor extension's include path."""
    return str(_HERE / "include")


def cache_root() -> Path:
    """Where built extensions live: ``$ACCELKIT_CACHE_DIR`` or ``~/.cache/accelkit``."""
    env = os.environ.get("ACCELKIT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "accelkit"


def _digest(paths: Sequence[Path], flags: Sequence[str]) -> str:
    import torch

    h = hashlib.sha256()
    for part in (torch.__version__, torch.version.git_version, sys.version,
                 sysconfig.get_config_var("EXT_SUFFIX") or "", *flags):
        h.update(str(part).encode())
        h.update(b"\0")
    for path in paths:
        h.update(str(path.name).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _headers(dirs: Sequence[str]) -> list[Path]:
    found: list[Path] = []
    for d in dirs:
        found += sorted(p for p in Path(d).rglob("*") if p.suffix in {".h", ".hpp"})
    return found


def load_extension(name: str, sources: Sequence[str | os.PathLike], *,
                   include_dirs: Sequence[str] = (), cflags: Sequence[str] = ()):
    """Import the extension module ``name`` built from ``sources``, compiling it first if no
    build for this exact torch + sources + headers + flags exists. Prints one line while
    building (a first build takes about a minute on two cores)."""
    import torch.utils.cpp_extension as cpp

    srcs = [Path(s).resolve() for s in sources]
    includes = [include_dir(), *map(str, include_dirs)]
    flags = ["-O2", "-std=c++17", *cflags]
    digest = _digest(srcs + _headers(includes), flags)
    build_dir = cache_root() / f"{name}-{digest}"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    built = build_dir / f"{name}.so"
    if built.exists() and (build_dir / "ok").exists():
        return _import_built(name, built)
    build_dir.mkdir(parents=True, exist_ok=True)
    print(f"accelkit: building C++ extension {name!r} for torch {_torch_version()} "
          f"(first use; about a minute) in {build_dir}", file=sys.stderr, flush=True)
    start = time.monotonic()
    module = cpp.load(name=name, sources=[str(s) for s in srcs], extra_include_paths=includes,
                      extra_cflags=flags, build_directory=str(build_dir), verbose=False)
    (build_dir / "ok").write_text(f"{time.monotonic() - start:.1f}s {suffix}\n")
    _prune(name, keep=build_dir)
    print(f"accelkit: built {name!r} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return module


def _prune(name: str, keep: Path, retain: int = 3) -> None:
    """Remove all but the ``retain`` newest other builds of ``name`` (edited sources or an
    upgraded torch leave old ones behind). A process still using one keeps its mapping."""
    import shutil

    others = sorted((p for p in cache_root().glob(f"{name}-*") if p.is_dir() and p != keep),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[retain - 1:]:
        shutil.rmtree(old, ignore_errors=True)


def _torch_version() -> str:
    import torch

    return torch.__version__


def _import_built(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    import torch  # noqa: F401  (the extension links against libtorch)

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
