"""Render a vendor backend package ``torch_<name>`` (``accelkit new``).

The package is made of three kinds of files, so nothing accelkit already has is copied:

1. **Referenced, not copied**: accelkit's C++ integration layer (``accelkit.core.include_dir()``,
   ``#include <accelkit/...>``) and its Python device-module builder
   (:mod:`accelkit.core.device_module`) stay in accelkit; the package builds against them.
2. **Rendered from the mock** (:data:`MOCK_SOURCES`): the parts a vendor replaces — the
   runtime adapter (``csrc/mock_runtime.h``, the seam's functions as calls into the driver), the
   driver skeleton (``csrc/driver/``: the fake driver's C API, each function naming the CUDA,
   ACL and Level Zero call it stands for, and its implementation, which the package runs on
   until the vendor's driver replaces it), the collectives transport in ``backends/mock/csrc/`` and mockccl's
   Python creator (``backends/mock/mockccl.py``) — with the names substituted by
   :data:`TOKENS` (explicit ``str.replace`` in order). So the mock and a new package cannot drift
   apart: every ``mock``/``mockccl`` in those files must be covered by a token, else rendering
   stops with an error naming the file and line. In Python modules, the top-level definitions
   listed in :data:`PY_OVERRIDES` are replaced by the template's own (how the C++ is loaded:
   built ahead of time in a vendor package, JIT-built in accelkit).
3. **Template** (``device_templates/cuda_like/``): packaging, the package ``__init__``, the
   ``BackendSpec`` module, tox.ini, README, the empty expectations file. Files ending in
   ``.tmpl`` (and every path) are :class:`string.Template` texts (``${name}``, ``${cname}``, ...,
   see :meth:`Names.mapping`; setup.py also gets the mock's extension sources and compiler
   flags, :func:`_extension_mapping`); ``$$`` is a literal ``$``. Other files are copied as
   they are.

Everything is rendered in memory and validated before the first file is written: bad input
writes nothing.
"""

from __future__ import annotations

import ast
import json
import keyword
import os
import re
import string
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from accelkit.core.accelerator import BUILTIN_DEVICE_TYPES

_HERE = Path(__file__).resolve().parent
#: The template folder.
TEMPLATE_DIR = _HERE / "cuda_like"
#: The mock device package whose vendor-replaceable sources are rendered.
MOCK_DIR = _HERE.parent / "backends" / "mock"

#: The reference device and collective library the renderer takes sources from; a new package
#: may not reuse these names (the mock ships with accelkit, beside every vendor package).
MOCK_NAME = "mock"
MOCK_CCL = "mockccl"

#: c10d backends torch or accelkit already register (``torch.distributed.Backend.backend_list``
#: in torch 2.13, plus the mock's).
#: ``mccl`` is Moore Threads' (torch_musa), and was the mock's old name.
TAKEN_COLLECTIVE_NAMES = frozenset({"undefined", "gloo", "nccl", "mpi", "ucc", "xccl", "fake",
                                    "mccl", MOCK_CCL})

#: The collective name becomes a C++ namespace in the generated code: names that would clash
#: with one the code uses, or with a C++ keyword.
_CPP_RESERVED = frozenset("""
    accelkit at c10 c10d caffe2 detail py pybind11 std torch
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not
    not_eq nullptr operator or or_eq private protected public register reinterpret_cast requires
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
    wchar_t while xor xor_eq
""".split())

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_CPP_SUFFIXES = {".h", ".hpp", ".cpp", ".cc"}


class TemplateError(ValueError):
    """Bad input to ``accelkit new`` or a template that cannot render; nothing was written."""


@dataclass(frozen=True)
class Names:
    """The names of a new device package, derived from the device and collective names."""

    name: str  #: device type and ``torch.<name>`` module, e.g. ``demo``
    cname: str  #: c10d backend name, e.g. ``democcl``

    @classmethod
    def create(cls, name: str, cname: str | None = None) -> Names:
        """Validated names; ``cname`` defaults to ``f"{name}ccl"``. Raises TemplateError."""
        _check_device_name(name)
        cname = f"{name}ccl" if cname is None else cname
        _check_collective_name(cname, name)
        return cls(name, cname)

    @property
    def package(self) -> str:
        return f"torch_{self.name}"

    def mapping(self) -> dict[str, str]:
        """The ``string.Template`` variables of ``cuda_like/`` files and paths."""
        return {
            "name": self.name,  # demo
            "Name": _camel(self.name),  # Demo
            "NAME": self.name.upper(),  # DEMO: environment variables DEMO_DEVICES, ...
            "cname": self.cname,  # democcl
            "CNAME": self.cname.upper(),  # DEMOCCL
            "package": self.package,  # torch_demo
            "dot": ".",  # file names: ${dot}gitignore.tmpl -> .gitignore
        }

    def tokens(self) -> list[tuple[str, str]]:
        """The (mock text, replacement) pairs applied, in order, to the mock's sources (each
        occurrence once: a replacement is never replaced again)."""
        m = self.mapping()
        return [
            ("ACCELKIT_MOCK_", f"{m['NAME']}_"),  # env vars: ACCELKIT_MOCK_DEVICES -> DEMO_DEVICES
            ("ACCELKIT_MOCKCCL_", f"{m['CNAME']}_"),  # ACCELKIT_MOCKCCL_CHUNK_BYTES -> DEMOCCL_CHUNK_BYTES
            ("accelkit_mockccl_", f"{self.cname}_"),  # /dev/shm segment prefix
            ("accelkit_mock", self.package),  # C++ namespace
            ("MockRuntime", f"{m['Name']}Runtime"),
            ("MOCKCCL", m["CNAME"]),
            ("mockccl", self.cname),
            ("MOCK", m["NAME"]),
            ("Mock", m["Name"]),
            ("mock", self.name),
        ]


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _check_device_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise TemplateError(
            f"device name {name!r} is not valid: use a lower-case Python identifier (a-z, "
            "digits and '_', starting with a letter), e.g. 'myaccel'; it becomes the device "
            "string 'myaccel:0', the module torch.myaccel and the package torch_myaccel")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise TemplateError(
            f"device name {name!r} is a Python keyword: torch.{name} could not be written in "
            "code; choose another name")
    if name in BUILTIN_DEVICE_TYPES:
        raise TemplateError(
            f"device name {name!r} is a device type built into torch; choose a name of your "
            "own (built-in: " + ", ".join(sorted(BUILTIN_DEVICE_TYPES)) + ")")
    if name == MOCK_NAME:
        raise TemplateError(
            f"device name {name!r} is accelkit's own reference device (accelkit.backends.mock), "
            "installed beside every vendor package; choose a name of your own")
    import torch

    if hasattr(torch, name):
        raise TemplateError(
            f"device name {name!r} is already an attribute of torch (torch.{name}); the device "
            "module becomes torch.<name>, so choose a name torch does not use")
    from torch.nn.utils.rnn import PackedSequence

    taken = [f"{owner}.{attr}" for owner, cls in (("torch.Tensor", torch.Tensor),
                                                  ("torch.nn.Module", torch.nn.Module),
                                                  ("PackedSequence", PackedSequence))
             for attr in (name, f"is_{name}") if hasattr(cls, attr)]
    if taken:
        raise TemplateError(
            f"device name {name!r} clashes with {', '.join(taken)}: torch adds Tensor.{name}(), "
            f"Tensor.is_{name} and Module.{name}() for the device, so choose a name they do not "
            "have")


def _check_collective_name(cname: str, name: str) -> None:
    if not isinstance(cname, str) or not _NAME.match(cname):
        raise TemplateError(
            f"collective backend name {cname!r} is not valid: use a lower-case Python "
            f"identifier (a-z, digits and '_', starting with a letter), e.g. '{name}ccl'")
    if cname in TAKEN_COLLECTIVE_NAMES:
        raise TemplateError(
            f"collective backend name {cname!r} is taken by torch or accelkit (taken: "
            + ", ".join(sorted(TAKEN_COLLECTIVE_NAMES)) + f"); choose another, e.g. '{name}ccl' "
            "(the default)")
    if cname == name:
        raise TemplateError(
            f"collective backend name {cname!r} equals the device name: the collective library "
            f"needs a name of its own, e.g. '{name}ccl' (the default)")
    if cname in _CPP_RESERVED or cname == f"torch_{name}" or keyword.iskeyword(cname):
        raise TemplateError(
            f"collective backend name {cname!r} is reserved: it becomes a C++ namespace and a "
            f"Python module in the package, and {cname!r} is a keyword or a namespace the code "
            f"uses; choose another, e.g. '{name}ccl' (the default)")


# ---------------------------------------------------------------------------------------------
# Sources rendered from the mock.

#: Mock files rendered into the package: (path under backends/mock/, folder in the package).
#: Every C++ file of ``csrc/`` is taken, so a file the mock adds comes along.
MOCK_SOURCES: tuple[tuple[str, str], ...] = (
    ("csrc/*", "csrc"),
    ("csrc/driver/*", "csrc/driver"),
    ("csrc/kernels/*", "csrc/kernels"),
    ("mockccl.py", "src/${package}"),
)

#: Top-level functions (and the docstring, ``__doc__``) of rendered Python modules replaced by
#: the template's version: file name -> {function name -> source}; a decorator stays. mockccl.py
#: JIT-builds its extension from csrc/ (the mock ships sources); a vendor package imports the
#: one built by setup.py.
PY_OVERRIDES: dict[str, dict[str, str]] = {
    "mockccl.py": {
        "__doc__": '''"""${cname}, the ${name} device's collective library: a C++ ``c10d::Backend``.

Rendered by ``accelkit new`` from accelkit's mockccl (``accelkit/backends/mock/mockccl.py``). The
transport is ``csrc/${cname}_shm.h`` with ``csrc/${cname}_*.cpp`` (shared memory within a host,
TCP between hosts, ``csrc/${cname}_hosts.h``): replace it with calls into your collective library; the glue between c10d
and a transport, ``<accelkit/c10d/backend.h>``, stays in accelkit. ``create_backend`` is the creator
``torch_${name}`` registers for ``${name}`` devices (``extended_api=True``).
"""''',
        "extension": '''def extension():
    """The ``torch_${name}._${cname}`` extension, built ahead of time by setup.py."""
    import torch.distributed  # noqa: F401  (registers c10d.Backend, the bound base class)

    from torch_${name} import _${cname}

    return _${cname}''',
    },
}


def _substitute(text: str, names: Names, where: str) -> str:
    """``text`` with the mock's names replaced; an occurrence no token covers is an error."""
    sentinels = []
    for i, (old, new) in enumerate(names.tokens()):
        sentinel = f"\0{i}\0"
        text = text.replace(old, sentinel)
        sentinels.append((sentinel, new))
    left = re.search(f"(?i){MOCK_NAME}|{MOCK_CCL}", text)
    if left:
        line = text.count("\n", 0, left.start()) + 1
        raise TemplateError(
            f"{where}:{line}: {left.group(0)!r} is not covered by the renderer's tokens "
            "(accelkit.device_templates.render.Names.tokens); add a token for it")
    for sentinel, new in sentinels:
        text = text.replace(sentinel, new)
    return text


def _override(source: str, overrides: dict[str, str], where: str) -> str:
    """Replace top-level functions and the docstring of a module (see :data:`PY_OVERRIDES`)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    spans: dict[str, tuple[int, int]] = {}
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        spans["__doc__"] = (body[0].lineno, body[0].end_lineno)
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans[node.name] = (node.lineno, node.end_lineno)
    missing = sorted(set(overrides) - set(spans))
    if missing:
        raise TemplateError(
            f"{where} has no top-level {', '.join(missing)}, which the renderer replaces "
            "(accelkit.device_templates.render.PY_OVERRIDES); update the table")
    for key in sorted(overrides, key=lambda k: spans[k][0], reverse=True):
        first, last = spans[key]
        lines[first - 1:last] = [overrides[key] + "\n"]
    return "".join(lines)


def _mock_files(names: Names) -> dict[str, str]:
    files: dict[str, str] = {}
    mapping = names.mapping()
    for pattern, folder in MOCK_SOURCES:
        matches = sorted(p for p in MOCK_DIR.glob(pattern)
                         if p.is_file() and (p.suffix in _CPP_SUFFIXES or p.suffix == ".py"))
        if not matches:
            raise TemplateError(f"no mock source matches {MOCK_DIR / pattern}")
        for path in matches:
            where = str(path.relative_to(MOCK_DIR.parent.parent))
            text = _substitute(path.read_text(), names, where)
            if path.name in PY_OVERRIDES:
                overrides = {k: string.Template(v).substitute(mapping)
                             for k, v in PY_OVERRIDES[path.name].items()}
                text = _override(text, overrides, where)
            folder_name = string.Template(folder).substitute(mapping)
            files[f"{folder_name}/{_substitute(path.name, names, where)}"] = text
    return files


def _under_csrc(source) -> str:
    """A mock source's path under ``csrc/`` (``mock_device.cpp``, ``driver/mockrt.cpp``)."""
    return Path(source).relative_to(MOCK_DIR / "csrc").as_posix()


def _extension_mapping(names: Names) -> dict[str, str]:
    """The sources and compiler flags of the two extensions, as the mock builds them
    (``accelkit.backends.mock_spec.EXTENSIONS``), for setup.py: ``${device_sources}``,
    ``${device_cflags}``, ``${ccl_sources}``, ``${ccl_cflags}`` (JSON lists)."""
    from accelkit.backends.mock_spec import EXTENSIONS

    mapping = {}
    for key, prefix in (("device", "device"), (MOCK_CCL, "ccl")):
        if key not in EXTENSIONS:
            raise TemplateError(
                f"accelkit.backends.mock_spec.EXTENSIONS has no {key!r} entry (it has "
                f"{', '.join(EXTENSIONS)}); the renderer takes the {prefix} extension from it")
        ext = EXTENSIONS[key]
        sources = [f"csrc/{_substitute(_under_csrc(src), names, 'mock_spec.EXTENSIONS')}"
                   for src in ext["sources"] if Path(src).parent.name != "kernels"]
        mapping[f"{prefix}_sources"] = json.dumps(sources)
        mapping[f"{prefix}_cflags"] = json.dumps(list(ext.get("cflags", [])))
    return mapping


def _settings_mapping(names: Names) -> dict[str, str]:
    """``${settings_defaults}``: the runtime's and the transport's switches with their defaults,
    as the mock lists them (``accelkit.backends.mock_spec.SETTINGS_DEFAULTS``, renamed; the
    mock's fault build has no counterpart), for the spec's ``_settings()``: every report then
    states the device mode, set or not."""
    from accelkit.backends.mock_spec import FAULT_BUILD_SWITCH, SETTINGS_DEFAULTS

    pairs = [f'    "{_substitute(k, names, "mock_spec.SETTINGS_DEFAULTS")}": "{v}",'
             for k, v in SETTINGS_DEFAULTS.items() if k != FAULT_BUILD_SWITCH]
    return {"settings_defaults": "{\n" + "\n".join(pairs) + "\n}"}


def _requirement_mapping(dest: Path | None) -> dict[str, str]:
    """What the generated tox.ini installs: ``${torch_requirement}``, the torch ``accelkit new``
    runs with (an unpinned ``torch`` may pull another, multi-GB build, and the C++ is tied to
    torch's ABI), and ``${accelkit_requirement}``: this accelkit's source tree when it is
    installed from one (not released yet, or a fork), named relative to the package folder
    ``dest`` (``file://{toxinidir}/...``: no path of this machine in the package), else this
    version."""
    import importlib.metadata

    import torch

    import accelkit

    dist = importlib.metadata.distribution("accelkit")
    source = None
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if "dir_info" in direct:
        source = direct["url"]
    else:  # a `setup.py develop` install records nothing: src/accelkit/ under the checkout
        root = Path(accelkit.__file__).resolve().parents[2]
        if (root / "pyproject.toml").is_file() and (root / "src" / "accelkit").is_dir():
            source = root.as_uri()
    requirement = f"accelkit=={dist.version}"
    if source:
        requirement = f"accelkit @ {source}"
        local = Path(urllib.request.url2pathname(urllib.parse.urlparse(source).path))
        if dest is not None:
            relative = os.path.relpath(local, Path(dest).resolve())
            requirement = f"accelkit @ file://{{toxinidir}}/{Path(relative).as_posix()}"
    return {"torch_requirement": f"torch=={torch.__version__.split('+')[0]}",
            "accelkit_requirement": requirement}


def _template_files(names: Names, dest: Path | None) -> dict[str, str]:
    files: dict[str, str] = {}
    mapping = {**names.mapping(), **_extension_mapping(names), **_settings_mapping(names),
               **_requirement_mapping(dest)}
    for path in sorted(p for p in TEMPLATE_DIR.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(TEMPLATE_DIR).as_posix()
        text = path.read_text()
        if rel.endswith(".tmpl"):
            rel = rel[:-len(".tmpl")]
            try:
                text = string.Template(text).substitute(mapping)
            except (KeyError, ValueError) as exc:
                raise TemplateError(f"template {path}: bad placeholder {exc}") from None
        files[string.Template(rel).substitute(mapping)] = text
    return files


def render(names: Names, dest: Path | None = None) -> dict[str, str]:
    """Every file of the package ``torch_<name>`` to be written into ``dest``: relative path ->
    text."""
    files = _mock_files(names)
    for rel, text in _template_files(names, dest).items():
        if rel in files:
            raise TemplateError(f"{rel} is both a template file and rendered from the mock")
        files[rel] = text
    _check_sources_built(files, names)
    return files


def _check_sources_built(files: dict[str, str], names: Names) -> None:
    """Every rendered C++ translation unit must be one setup.py compiles (and vice versa):
    named in it, or a kernel file (``csrc/kernels/*.cpp``, which it globs)."""
    units = {rel for rel in files if rel.startswith("csrc/") and rel.endswith((".cpp", ".cc"))
             and not rel.startswith("csrc/kernels/")}
    named = set(re.findall(r'"(csrc/[^"*]+\.(?:cpp|cc))"', files["setup.py"]))
    kernels = any(rel.startswith("csrc/kernels/") for rel in files)
    if kernels and 'glob("csrc/kernels/*.cpp")' not in files["setup.py"]:
        raise TemplateError("the mock has kernels in csrc/kernels/ but setup.py of the template "
                            "does not build them; update device_templates/cuda_like/setup.py.tmpl")
    if units != named:
        raise TemplateError(
            f"setup.py of the template compiles {sorted(named)} but the mock's sources render to "
            f"{sorted(units)}; update device_templates/cuda_like/setup.py.tmpl")


def check_destination(dest: Path) -> None:
    """``dest`` must be missing or an empty directory."""
    if dest.exists() and not dest.is_dir():
        raise TemplateError(f"{dest} exists and is not a directory; pass --dir with a new or "
                            "empty directory")
    if dest.is_dir():
        entries = sorted(p.name for p in dest.iterdir())
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise TemplateError(
                f"directory {dest} is not empty ({len(entries)} entries: {shown}); accelkit new "
                "writes only into a new or empty directory: pass another --dir")


def create_package(name: str, dest: Path | None = None, cname: str | None = None
                   ) -> tuple[Names, Path, list[Path]]:
    """Validate, render and write ``torch_<name>`` into ``dest`` (default ``./torch_<name>``).
    Returns the names, the folder and the files written. TemplateError: nothing written."""
    names = Names.create(name, cname)
    dest = Path(dest) if dest is not None else Path.cwd() / names.package
    check_destination(dest)
    files = render(names, dest)
    written: list[Path] = []
    for rel, text in sorted(files.items()):
        path = dest / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as exc:
            raise TemplateError(
                f"cannot write {path}: {exc.strerror or exc}; {len(written)} of {len(files)} "
                f"files were written to {dest}") from exc
        written.append(path)
    return names, dest, written
