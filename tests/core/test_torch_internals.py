"""Private torch internals: the conformance engine and the device-handle checker reach them
only through accelkit.core.torch_internals; every private torch name accelkit's code reaches is
listed in its PRIVATE_APIS and resolves on the installed torch, which is a release the list was
verified on. Run on each supported torch (``tox -e torch213,torch214,torch215``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from accelkit.core import torch_internals

pytestmark = pytest.mark.torch_version

ROOT = Path(__file__).resolve().parents[2]
#: accelkit's code (the tests and the vendor template aside).
PACKAGE = [p for folder in ("core", "backends", "conformance", "src")
           for p in sorted((ROOT / folder).rglob("*.py"))]
#: The engine (everything in conformance/ but the catalogue, whose checks test torch's own
#: behaviour) and the device-handle checker.
SCANNED = sorted((ROOT / "conformance").glob("*.py")) + [ROOT / "core" / "checker.py"]


def _private_uses(path: Path) -> list[str]:
    """``file:line name`` of every private torch name a module reaches: a private attribute of
    a name bound to a torch import, a private name imported from torch, a private module."""
    tree = ast.parse(path.read_text())
    torch_names: set[str] = set()
    found = []

    def private(part: str) -> bool:
        return part.startswith("_") and not part.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    torch_names.add((alias.asname or alias.name).split(".")[0])
                    if any(private(p) for p in alias.name.split(".")):
                        found.append(f"{path.name}:{node.lineno} import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                torch_names.add(alias.asname or alias.name)
                if private(alias.name) or any(private(p) for p in node.module.split(".")):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in torch_names | {"torch"}:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


def test_engine_and_checker_touch_no_private_torch_name():
    found = [use for path in SCANNED for use in _private_uses(path)]
    assert found == [], "use accelkit.core.torch_internals instead: " + ", ".join(found)


def test_the_installed_torch_is_one_the_internals_were_verified_on():
    release = torch_internals.torch_release()
    assert release in torch_internals.VERIFIED_ON, (
        f"torch {release}: re-read accelkit.core.torch_internals against this torch's source, "
        "then add it to VERIFIED_ON")


def _private_names(path: Path) -> set[str]:
    """Dotted private torch names ``path`` reaches (aliases resolved), each cut after its last
    private part: ``from torch.distributed import distributed_c10d as c10d`` then
    ``c10d._world.pg_map`` gives ``torch.distributed.distributed_c10d._world``."""
    tree = ast.parse(path.read_text())
    alias: dict[str, str] = {}
    found: set[str] = set()

    def cut(parts: list[str]) -> str | None:
        last = max((i for i, p in enumerate(parts) if p.startswith("_")
                    and not p.startswith("__")), default=-1)
        return ".".join(parts[:last + 1]) if last >= 0 else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    alias[a.asname or "torch"] = a.name if a.asname else "torch"
                    found.add(cut(a.name.split(".")))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 \
                and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
                found.add(cut(f"{node.module}.{a.name}".split(".")))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, root = [], node
            while isinstance(root, ast.Attribute):
                parts.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id in alias:
                found.add(cut(alias[root.id].split(".") + parts[::-1]))
    return found - {None}


def test_every_private_torch_name_accelkit_uses_is_listed():
    listed = [api.name for api in torch_internals.PRIVATE_APIS]
    unlisted = sorted(f"{name} ({path.relative_to(ROOT)})" for path in PACKAGE
                      for name in _private_names(path)
                      if not any(n == name or n.startswith(name + ".") for n in listed))
    assert unlisted == [], ("list these in accelkit.core.torch_internals.PRIVATE_APIS, with what "
                            "they are used for: " + ", ".join(unlisted))


def test_every_listed_private_torch_name_resolves_on_this_torch():
    missing = torch_internals.missing_private_apis()
    assert missing == [], f"torch {torch.__version__} moved private APIs accelkit uses:\n" + "\n".join(
        f"  {api.name} (used for: {api.used_for}): {why}" for api, why in missing)


def test_a_moved_private_api_is_named_with_its_use(monkeypatch):
    gone = torch_internals.PrivateAPI("torch.distributed._no_such_api", "a test of the message")
    monkeypatch.setattr(torch_internals, "PRIVATE_APIS", (*torch_internals.PRIVATE_APIS, gone))
    (api, why), = torch_internals.missing_private_apis()
    assert api is gone and "has no attribute '_no_such_api'" in why
    text = torch_internals.render_private_apis()
    assert "MISSING torch.distributed._no_such_api (used for: a test of the message)" in text
    future = torch_internals.PrivateAPI("torch._not_yet", "a later torch's API", torch=">=99")
    monkeypatch.setattr(torch_internals, "PRIVATE_APIS", (future,))
    assert torch_internals.missing_private_apis() == []
