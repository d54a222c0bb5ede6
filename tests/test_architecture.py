"""docs/architecture.md names every file of the package (the CLI, core/ with its headers and
C++, the backends, conformance/ and the template's renderer) and every folder of tests, and no
file that is gone, so the map cannot go stale; every test module is in a folder of the map and
classified in tests/support/markers.py, by what it does."""

from __future__ import annotations

import re
from pathlib import Path

from support.markers import MARKERS

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


def _test_modules() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("test_*.py")
                  if "fixtures" not in p.relative_to(ROOT / "tests").parts)


def test_every_test_module_is_in_a_folder_on_the_map():
    named = _named()
    loose = [str(p.relative_to(ROOT)) for p in _test_modules()
             if p.parent != ROOT / "tests" and f"{p.parent.relative_to(ROOT)}/" not in named]
    assert loose == [], f"tests/ mirrors the source: put these in a folder docs/architecture.md names: {loose}"
    top = [p.name for p in _test_modules() if p.parent == ROOT / "tests"]
    assert top == ["test_architecture.py"], f"test modules at the top of tests/: {top}"


def test_every_test_module_is_classified_by_its_markers():
    """Every module has its entry in MARKERS and every entry a module; a module that makes
    simulated hosts is marked ``namespaces`` and one that starts no rank, pool or conformance
    run is not marked ``multi_process``."""
    modules = {p.relative_to(ROOT / "tests").as_posix(): p for p in _test_modules()}
    assert sorted(set(modules) - set(MARKERS)) == [], "add these to tests/support/markers.py"
    assert sorted(set(MARKERS) - set(modules)) == [], "tests/support/markers.py names modules that are gone"
    for key, path in modules.items():
        if path == Path(__file__).resolve():  # this module names the signs it looks for
            continue
        text = path.read_text()
        makes_hosts = re.search(r"\bHosts\(|unshare|ip netns", text) is not None
        assert makes_hosts == ("namespaces" in MARKERS[key]), f"{key}: namespaces marker"
        starts_ranks = re.search(r"spawn_ranks|engine_env|\"(conformance|upstream)\"|torchrun|Pool\(|"
                                 r"hosts\.popen|run_pool|mutant_faults|__main__", text) is not None
        if "multi_process" in MARKERS[key]:
            assert starts_ranks, f"{key} is marked multi_process but starts no rank process"


def test_the_release_envs_collect_every_module_with_torch_version_tests():
    """`tox -e torch214,torch215` give pytest the modules that hold ``torch_version`` tests, so
    it collects (and builds the mock for) those only; a module that gains or loses one must be
    added to or taken from that list in tox.ini, or its tests would not run on those releases."""
    marked = sorted(p.relative_to(ROOT).as_posix() for p in _test_modules()
                    if p != Path(__file__).resolve()
                    and re.search(r"pytest\.mark\.torch_version\b", p.read_text()))
    command = re.search(r"torch214,torch215: pytest -q -m torch_version (.*) \{posargs\}",
                        (ROOT / "tox.ini").read_text())
    assert command, "tox.ini: the release envs' pytest command"
    assert sorted(command.group(1).split()) == marked
