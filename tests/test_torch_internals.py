"""Private torch internals are touched in one module only (accelkit.core.torch_internals),
which names the torch releases it was verified on: the conformance engine and the
device-handle checker use its functions, never torch's private names themselves."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from accelkit.core import torch_internals

ROOT = Path(__file__).resolve().parents[1]
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
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert release in torch_internals.VERIFIED_ON, (
        f"torch {release}: re-read accelkit.core.torch_internals against this torch's source, "
        "then add it to VERIFIED_ON")
