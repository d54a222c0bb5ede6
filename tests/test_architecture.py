"""docs/architecture.md names every file of the package (the CLI, core/ with its headers and
C++, the backends, conformance/ and the template's renderer) and no file that is gone, so the
map cannot go stale."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
#: Where every file must be on the map (``__init__.py`` only for a backend, which it is).
MAPPED = {"src/accelkit": ("*.py", "commands/*.py"), "core": ("*.py", "csrc/**/*.cpp", "csrc/**/*.h",
          "include/accelkit/**/*.h"), "backends": ("*/*.py", "*/*.toml", "*/csrc/**/*.cpp",
          "*/csrc/**/*.h"), "conformance": ("*.py", "engine/*.py", "launchers/*.py", "reports/*.py"), "device_templates": ("*.py",)}


def _named() -> set[str]:
    return set(re.findall(r"`([\w./-]+/[\w./-]*)`", DOC.read_text()))


def test_every_file_is_on_the_map():
    named = _named()
    files = sorted({str(path.relative_to(ROOT)) for folder, patterns in MAPPED.items()
                    for pattern in patterns for path in (ROOT / folder).glob(pattern)
                    if "__pycache__" not in path.parts})
    missing = [f for f in files if f not in named and not (
        f.endswith("__init__.py") and not f.startswith("backends/"))]
    assert missing == [], f"name these in docs/architecture.md, one line each: {missing}"


def test_every_file_on_the_map_is_there():
    gone = sorted(name for name in _named() if not (ROOT / name.rstrip("/")).exists()
                  and not name.startswith(("torch/", "test/")))
    assert gone == [], f"docs/architecture.md names files that are not in the tree: {gone}"
