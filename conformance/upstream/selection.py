"""Which upstream test files an ``accelkit upstream`` run takes from ``--tests PATH``.

``PATH`` is either a PyTorch source checkout (it has ``test/distributed/``) or a folder of test
files. In a checkout the default set is :data:`DEFAULT_FILES` (paths in the PyTorch repository,
grouped by area); in a folder it is every ``test_*.py`` below it. ``--area`` and ``--file``
narrow the set. A checkout's ``version.txt`` must name the installed torch's major.minor: the
tests change with the harness they import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

#: The default set, by area: PyTorch's own distributed tests of what accelkit's conformance
#: suite covers, as paths in the PyTorch repository.
DEFAULT_FILES: dict[str, tuple[str, ...]] = {
    "devicemesh": ("test/distributed/test_device_mesh.py",),
    "dtensor": ("test/distributed/tensor/test_dtensor.py",
                "test/distributed/tensor/test_api.py",
                "test/distributed/tensor/test_init.py"),
    "redistribute": ("test/distributed/tensor/test_redistribute.py",),
    "random": ("test/distributed/tensor/test_random_ops.py",
               "test/distributed/tensor/parallel/test_tp_random_state.py"),
    "tp": ("test/distributed/tensor/parallel/test_tp_style.py",
           "test/distributed/tensor/parallel/test_parallelize_api.py",
           "test/distributed/tensor/parallel/test_tp_examples.py"),
    "fsdp2": ("test/distributed/_composable/fsdp/test_fully_shard_init.py",
              "test/distributed/_composable/fsdp/test_fully_shard_training.py",
              "test/distributed/_composable/fsdp/test_fully_shard_state_dict.py"),
    "dcp": ("test/distributed/checkpoint/test_state_dict.py",
            "test/distributed/checkpoint/test_dtensor_checkpoint.py",
            "test/distributed/checkpoint/test_file_system_checkpoint.py",
            "test/distributed/checkpoint/test_tp_checkpoint.py"),
}


class SelectionError(Exception):
    """``--tests``/``--area``/``--file`` select nothing runnable; the message says why."""


@dataclass
class Selection:
    root: Path
    kind: str                      # "checkout" or "folder"
    files: list[str]               # paths relative to root, in run order
    missing: list[str] = field(default_factory=list)   # default files this checkout lacks
    version: str | None = None     # the checkout's version.txt
    areas: dict[str, str] = field(default_factory=dict)  # file -> area (default set only)


def _major_minor(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return tuple(int(x) for x in match.groups()) if match else ()


def select(path: str | Path, *, areas: list[str], files: list[str], torch_version: str,
           ignore_version: bool = False) -> Selection:
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise SelectionError(f"--tests {path}: not a directory (give a PyTorch checkout or a "
                             "folder of test files)")
    unknown = [a for a in areas if a not in DEFAULT_FILES]
    if unknown:
        raise SelectionError(f"unknown area(s) {', '.join(unknown)}; known: "
                             f"{', '.join(DEFAULT_FILES)}")
    if (root / "test" / "distributed").is_dir():
        selection = _checkout(root, areas, torch_version, ignore_version)
    else:
        if areas:
            raise SelectionError(f"--area selects from a PyTorch checkout's default set; {root} "
                                 "has no test/distributed/ (use --file for a folder)")
        found = sorted(str(p.relative_to(root)) for p in root.rglob("test_*.py"))
        selection = Selection(root, "folder", found)
    if files:
        selection.files = _pick(root, files)
    if not selection.files:
        raise SelectionError(f"no test file selected under {root}"
                             + (f" (default files missing: {', '.join(selection.missing)})"
                                if selection.missing else ""))
    return selection


def _checkout(root: Path, areas: list[str], torch_version: str,
              ignore_version: bool) -> Selection:
    version_file = root / "version.txt"
    version = version_file.read_text().strip() if version_file.is_file() else None
    if version and not ignore_version and _major_minor(version) != _major_minor(torch_version):
        raise SelectionError(
            f"the checkout {root} is PyTorch {version} but the installed torch is "
            f"{torch_version}: its tests import the installed harness and would fail on the "
            "difference. Check out the matching release tag (git checkout v"
            f"{'.'.join(map(str, _major_minor(torch_version)))}.0), or pass --ignore-version")
    wanted = areas or list(DEFAULT_FILES)
    selection = Selection(root, "checkout", [], version=version)
    for area in wanted:
        for rel in DEFAULT_FILES[area]:
            if (root / rel).is_file():
                selection.files.append(rel)
                selection.areas[rel] = area
            else:
                selection.missing.append(rel)
    return selection


def _pick(root: Path, requested: list[str]) -> list[str]:
    """``--file`` values (replacing the default set): paths relative to the root, or
    absolute, of any test file under it."""
    picked = []
    for value in requested:
        path = Path(value)
        path = path if path.is_absolute() else root / path
        if not path.is_file():
            raise SelectionError(f"--file {value}: no such file under {root}")
        try:
            rel = str(path.resolve().relative_to(root))
        except ValueError:
            raise SelectionError(f"--file {value} is outside --tests {root}") from None
        if rel not in picked:
            picked.append(rel)
    return picked
