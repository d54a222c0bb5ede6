"""Building C++ against the installed torch, and the reusable C++ integration layer.

:func:`include_dir` is the folder of accelkit's public C++ headers (``#include
<accelkit/...>``), shipped inside the package like pybind11's ``get_include()``.
:func:`library` is the layer's code (``core/csrc/*.cpp``: allocator, guard, hooks, generator,
kernels, random kernels, fallback, autocast, registration, the c10d glue) compiled once per
torch version into a static archive that every extension links: a vendor's build compiles
only the vendor's files, and any number of them may include the headers. A static archive
rather than sources handed to each build: its objects are compiled once and cached (not once
per extension and per rebuild), and only the objects an extension uses are linked in (a
collective library's extension takes the c10d glue, not the device layer). Built with hidden
visibility, so two extensions that link it never bind to each other's copy.

:func:`load_extension` compiles a backend's sources on first use into a cache folder keyed by
the torch version, the Python ABI, the flags and the content of every source and of every
header they include from accelkit's or the backend's include folders (and links the
library), so a new torch or an edited source always rebuilds and a stale binary is never
loaded. Builds are serialised by a lock the kernel releases when its holder dies, so a killed
build never leaves others waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import re
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def include_dir() -> str:
    """The folder holding ``accelkit/*.h``: add it to a vendor extension's include path."""
    return str(_HERE / "include")


def _csrc_dir() -> Path:
    return _HERE / "csrc"


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


#: The file a vendor package's build writes beside its extensions (``accelkit new``'s
#: setup.py): when they were built, in how many seconds, of which sources, from which folder.
BUILD_RECORD = "_build.json"


def source_hash(folder: str | os.PathLike) -> str:
    """A digest of every file under ``folder`` (relative path and content): which sources a
    build is of."""
    folder = Path(folder)
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def write_build_record(package_dir: str | os.PathLike, sources: str | os.PathLike,
                       seconds: float) -> None:
    """Write :data:`BUILD_RECORD` into ``package_dir`` (where the built extensions go) for a
    build of ``sources`` (a folder) that took ``seconds``."""
    import json

    record = {"built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "seconds": round(seconds, 1), "sources": source_hash(sources),
              "source_dir": str(Path(sources).resolve())}
    Path(package_dir).mkdir(parents=True, exist_ok=True)
    (Path(package_dir) / BUILD_RECORD).write_text(json.dumps(record) + "\n")


def build_record_text(package_dir: str | os.PathLike) -> str:
    """The installed build of a vendor package in one line, for its conformance reports:
    ``<when> in <s> s, sources <hash>``, and a warning when the sources it was built from have
    changed since (a later build failed, so pip kept this one, or was not installed)."""
    import json

    path = Path(package_dir) / BUILD_RECORD
    if not path.is_file():
        return f"unknown: no {BUILD_RECORD} in {package_dir} (built by an older setup.py)"
    record = json.loads(path.read_text())
    text = f"{record['built']} in {record['seconds']} s, sources {record['sources']}"
    folder = Path(record["source_dir"])
    if folder.is_dir() and source_hash(folder) != record["sources"]:
        text += (f"; STALE: {folder} has changed since (now {source_hash(folder)}): the latest "
                 "build failed or was not installed, and this older one is what runs (pip install "
                 "-v --no-build-isolation shows the build's errors)")
    return text


_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def _included(sources: Sequence[Path], include_dirs: Sequence[str]) -> list[Path]:
    """Every header the sources include, transitively, found next to the including file or
    in ``include_dirs`` (torch's own headers are covered by the torch version)."""
    seen: dict[Path, None] = {}
    todo = list(sources)
    while todo:
        current = todo.pop()
        for match in _INCLUDE.finditer(current.read_text(errors="replace")):
            for base in (current.parent, *include_dirs):
                candidate = (Path(base) / match.group(1)).resolve()
                if candidate.is_file():
                    if candidate not in seen:
                        seen[candidate] = None
                        todo.append(candidate)
                    break
    return sorted(seen)


def _torch_cflags() -> list[str]:
    """The flags torch's extension builder compiles with (``-fPIC``, the C++ standard, torch's
    and Python's include folders), so the library's objects match the extensions they join."""
    import torch.utils.cpp_extension as cpp

    includes = [*cpp.include_paths(), sysconfig.get_path("include", scheme="posix_prefix")]
    return ["-fPIC", "-std=c++20", *(f"-isystem{path}" for path in includes)]


#: Compiler flags of the library (on top of torch's): optimised, symbols hidden.
LIBRARY_CFLAGS = ("-O2", "-fvisibility=hidden", "-fvisibility-inlines-hidden")


def _variant(name: str, defines: Sequence[str]) -> str:
    """The cache name of a build of ``name`` with preprocessor ``defines`` (and a sanitizer):
    the name itself for none, else ``name+DEFINE+...+sanitize-KIND`` (its own cache folders,
    never pruned for the other)."""
    kind = sanitizer()
    return "+".join([name, *defines, *([f"sanitize-{kind}"] if kind else [])])


#: The sanitizers ``ACCELKIT_SANITIZE`` builds with, and the runtime each one's process loads
#: before anything else (``LD_PRELOAD``).
SANITIZERS = {"address": "libasan.so", "thread": "libtsan.so"}


def sanitizer() -> str | None:
    """``ACCELKIT_SANITIZE`` (``address``: AddressSanitizer with UndefinedBehaviorSanitizer;
    ``thread``: ThreadSanitizer), or None when unset: accelkit's library and every extension
    are then built with it, cached apart. For accelkit's own sanitizer runs
    (``tests/sanitize.py``, ``tox -e sanitizers``); a process that loads such a build must
    preload the sanitizer's runtime."""
    kind = os.environ.get("ACCELKIT_SANITIZE", "")
    if kind and kind not in SANITIZERS:
        raise ValueError(f"ACCELKIT_SANITIZE={kind} is not a sanitizer accelkit builds with: "
                         f"use {' or '.join(SANITIZERS)}, or leave it unset")
    return kind or None


def _sanitize_flags() -> list[str]:
    kind = sanitizer()
    if kind is None:
        return []
    checks = "address,undefined" if kind == "address" else kind
    return [f"-fsanitize={checks}", "-fno-omit-frame-pointer", "-g"]


def _check_sanitizer_runtime() -> None:
    """A sanitized extension loads only into a process whose sanitizer runtime came first."""
    kind = sanitizer()
    if kind is None:
        return
    runtime = SANITIZERS[kind]
    if runtime.removesuffix(".so") not in Path("/proc/self/maps").read_text():
        raise RuntimeError(f"ACCELKIT_SANITIZE={kind}: extensions built with the {kind} "
                           "sanitizer load only where its runtime was loaded first: run with "
                           f"LD_PRELOAD=\"$({os.environ.get('CXX', 'c++')} -print-file-name="
                           f"{runtime}) $(c++ -print-file-name=libstdc++.so)\" (tests/sanitize.py "
                           "does), or unset ACCELKIT_SANITIZE")


@contextlib.contextmanager
def _compilers_without_preload() -> Iterator[None]:
    """The compilers this process starts do not inherit a preloaded sanitizer runtime (it is
    for the process that loads the builds, not for gcc)."""
    preload = os.environ.pop("LD_PRELOAD", None)
    try:
        yield
    finally:
        if preload is not None:
            os.environ["LD_PRELOAD"] = preload


def _define_flags(defines: Sequence[str]) -> list[str]:
    for define in defines:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(=\S*)?", define):
            raise ValueError(f"define {define!r} is not NAME or NAME=VALUE (a C preprocessor "
                             "macro, e.g. 'ACCELKIT_FAULTS')")
    return [f"-D{define}" for define in defines]


class _Library:
    """One build of ``libaccelkit.a`` for this torch, these sources and these defines."""

    def __init__(self, defines: Sequence[str] = ()) -> None:
        self.sources = sorted(_csrc_dir().rglob("*.cpp"))
        headers = sorted([*Path(include_dir()).rglob("*.h"), *_csrc_dir().rglob("*.h")])
        self.flags = [*LIBRARY_CFLAGS, *_define_flags(defines), *_sanitize_flags(),
                      f"-I{include_dir()}", f"-I{_csrc_dir()}"]
        self.defines = tuple(defines)
        self.name = _variant("libaccelkit", defines)
        # The include folders' paths stay out of the key (their headers' contents are in it):
        # every environment that installs this accelkit (tox's, a vendor's venv) shares a build.
        digest = _digest([*self.sources, *headers],
                         [*LIBRARY_CFLAGS, *_define_flags(defines), *_sanitize_flags()])
        self.dir = cache_root() / f"{self.name}-{digest}"
        self.path = self.dir / "libaccelkit.a"

    @property
    def done(self) -> bool:
        return self.path.exists() and (self.dir / "ok").exists()

    @staticmethod
    def _object(src: Path) -> str:
        return "obj/" + src.relative_to(_csrc_dir()).with_suffix(".o").as_posix()

    def _reused(self) -> dict[Path, Path]:
        """Objects of the default build (when it is built) that this build with defines takes
        as they are: those of sources that neither they nor the layer's headers they include
        mention a defined macro (they compile the same; the fault build recompiles only the
        files with fault points)."""
        if not self.defines:
            return {}
        base = _Library()
        if not base.done:
            return {}
        names = [define.split("=", 1)[0] for define in self.defines]
        reused = {}
        for src in self.sources:
            files = [src, *_included([src], [include_dir(), str(_csrc_dir())])]
            if not any(re.search(rf"\b{name}\b", f.read_text(errors="replace"))
                       for f in files for name in names):
                reused[src] = base.dir / self._object(src)
        return reused

    def build(self) -> None:
        """Compile every source (ninja, in parallel) and archive them, under the cache lock."""
        import shlex
        import shutil
        import subprocess

        cache_root().mkdir(parents=True, exist_ok=True)
        with open(cache_root() / "libaccelkit.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.done:
                return
            self.dir.mkdir(parents=True, exist_ok=True)
            cflags = " ".join(shlex.quote(f) for f in [*_torch_cflags(), *self.flags])
            lines = [f"cxx = {os.environ.get('CXX', 'c++')}", f"cflags = {cflags}",
                     "rule cxx", "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out",
                     "  depfile = $out.d", "  deps = gcc", "rule ar",
                     "  command = rm -f $out && ar rcs $out $in"]
            objects = []
            reused = self._reused()
            for src in self.sources:
                if src in reused:
                    objects.append(shlex.quote(str(reused[src])))
                    continue
                obj = self._object(src)
                objects.append(obj)
                lines.append(f"build {obj}: cxx {shlex.quote(str(src))}")
            lines += [f"build libaccelkit.a: ar {' '.join(objects)}", "default libaccelkit.a", ""]
            (self.dir / "build.ninja").write_text("\n".join(lines))
            ninja = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")
            print(f"accelkit: building the C++ layer ({self.name}, "
                  f"{len(self.sources) - len(reused)} files) "
                  f"for torch {_torch_version()} in {self.dir} (first use; ~30 s a file per "
                  "core)", file=sys.stderr, flush=True)
            start = time.monotonic()
            with _compilers_without_preload():
                proc = subprocess.Popen([ninja, "-C", str(self.dir)], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
            output = []
            for line in proc.stdout:  # ninja's "[n/m] ..." as each file is done, with the time
                output.append(line)
                if line.startswith("[") and " cxx " not in line:
                    done = line.split("]", 1)[0] + "]"
                    what = line.rsplit(" ", 1)[-1].strip()
                    print(f"accelkit:   {done} {Path(what).name} "
                          f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
            if proc.wait() != 0:
                raise RuntimeError(f"building accelkit's C++ layer failed (ninja exit "
                                   f"{proc.returncode}) in {self.dir}:\n"
                                   f"{''.join(output)[-8000:]}")
            (self.dir / "ok").write_text(f"{time.monotonic() - start:.1f}s\n")
            _prune(self.name, keep=self.dir)
            print(f"accelkit: built the C++ layer in {time.monotonic() - start:.0f} s",
                  file=sys.stderr, flush=True)


def library(defines: Sequence[str] = ()) -> str:
    """The path of ``libaccelkit.a``, accelkit's C++ layer compiled for the installed torch,
    building it first if this torch and these sources have no build yet (about a minute on
    two cores, once). Link it into every extension that includes accelkit's headers: in a
    setup.py, ``CppExtension(..., include_dirs=[include_dir()], extra_objects=[library()])``.

    ``defines`` (preprocessor macros, ``NAME`` or ``NAME=VALUE``) give another build, cached
    apart: ``defines=("ACCELKIT_FAULTS",)`` is the fault build accelkit's mutation tests run
    (``core/csrc/testing/faults.h``); a vendor's build takes the default."""
    lib = _Library(tuple(defines))
    if not lib.done:
        lib.build()
    return str(lib.path)


class _Build:
    """Where one exact build (torch + sources + headers + flags) of an extension lives."""

    def __init__(self, name: str, sources: Sequence[str | os.PathLike],
                 include_dirs: Sequence[str], cflags: Sequence[str],
                 defines: Sequence[str] = ()) -> None:
        self.name = name
        self.sources = [str(Path(s).resolve()) for s in sources]
        self.includes = [include_dir(), *map(str, include_dirs)]
        self.flags = ["-O2", *cflags, *_define_flags(defines), *_sanitize_flags()]
        self.library = library(defines)
        srcs = [Path(s) for s in self.sources]
        digest = _digest(srcs + _included(srcs, self.includes) + [Path(self.library)], self.flags)
        self.variant = _variant(name, ())  # a sanitizer's builds are cached and pruned apart
        self.dir = cache_root() / f"{self.variant}-{digest}"
        self.path = self.dir / f"{name}.so"

    @property
    def done(self) -> bool:
        return self.path.exists() and (self.dir / "ok").exists()

    def compile_and_import(self):
        """Build under an exclusive ``flock`` (released by the kernel if this process dies);
        whoever gets the lock after a finished build just imports it."""
        cache_root().mkdir(parents=True, exist_ok=True)
        with open(cache_root() / f"{self.variant}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.done:
                return _import_built(self.name, self.path)
            return self._compile()

    def _compile(self):
        import torch.utils.cpp_extension as cpp

        self.dir.mkdir(parents=True, exist_ok=True)
        # torch's own build lock in the folder is left behind by a killed build; we hold ours.
        (self.dir / "lock").unlink(missing_ok=True)
        print(f"accelkit: building C++ extension {self.name!r} for torch {_torch_version()} "
              f"(first use; about a minute) in {self.dir}", file=sys.stderr, flush=True)
        start = time.monotonic()
        _check_sanitizer_runtime()
        with _compilers_without_preload():
            module = cpp.load(name=self.name, sources=self.sources,
                              extra_include_paths=self.includes, extra_cflags=self.flags,
                              extra_ldflags=[self.library, *_sanitize_flags()],
                              build_directory=str(self.dir), verbose=False)
        (self.dir / "ok").write_text(f"{time.monotonic() - start:.1f}s\n")
        _prune(self.variant, keep=self.dir)
        print(f"accelkit: built {self.name!r} in {time.monotonic() - start:.0f} s",
              file=sys.stderr, flush=True)
        return module


def load_extension(name: str, sources: Sequence[str | os.PathLike], *,
                   include_dirs: Sequence[str] = (), cflags: Sequence[str] = (),
                   defines: Sequence[str] = ()):
    """Import the extension module ``name`` built from ``sources``, compiling it first if no
    build for this exact torch + sources + headers + flags exists. Prints one line while
    building (a first build takes about a minute on two cores). ``defines`` are preprocessor
    macros for the extension and for the build of accelkit's library it links
    (:func:`library`), part of what identifies the build."""
    build = _Build(name, sources, include_dirs, cflags, defines)
    if build.done:
        return _import_built(name, build.path)
    return build.compile_and_import()


def build_extension(name: str, sources: Sequence[str | os.PathLike], *,
                    include_dirs: Sequence[str] = (), cflags: Sequence[str] = (),
                    defines: Sequence[str] = ()) -> Path:
    """Compile the extension (same arguments as :func:`load_extension`) if needed and return the
    built file, WITHOUT loading it here: loading a device extension registers its PrivateUse1
    hooks and kernels, so the compile runs in a throwaway child process. Used by a backend's
    ``BackendSpec.prepare`` so that N rank processes do not all wait on one compile."""
    import json
    import subprocess

    build = _Build(name, sources, include_dirs, cflags, defines)
    if not build.done:
        args = json.dumps([name, build.sources, list(map(str, include_dirs)), list(cflags),
                           list(defines)])
        code = ("import json, sys; from accelkit.core.cpp import load_extension; "
                "n, s, i, c, d = json.loads(sys.argv[1]); "
                "load_extension(n, s, include_dirs=i, cflags=c, defines=d)")
        proc = subprocess.run([sys.executable, "-c", code, args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        sys.stderr.write(proc.stdout)
        if proc.returncode != 0 or not build.done:
            raise RuntimeError(f"building C++ extension {name!r} failed (exit {proc.returncode}); "
                               f"compiler output above, build folder {build.dir}")
    return build.path


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
    _check_sanitizer_runtime()
    import torch  # noqa: F401  (the extension links against libtorch)

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
