"""Finding checks: the catalogue, extra check modules, and selection.

Extra modules (fixtures, a vendor's own checks) are named either as an importable module
(``my_vendor.checks``) or as a path to a ``.py`` file; the engine's workers import the same
list, so a check id means the same function on every rank.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path

from accelkit.conformance.api import CHECKS, CheckDef, forget, verify_defaults


class CheckLoadError(Exception):
    """A check module cannot be imported; the message names it and what went wrong."""


def _module_name_for_path(path: Path) -> str:
    """The module name a ``.py`` check file is imported under: ``accelkit_checks_<digest of
    its resolved path>.<stem>``, so two files of the same name are two modules, and the last
    part (the checks' default area) is the file's name."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    return f"accelkit_checks_{digest}.{stem}"


def import_module(name: str) -> str:
    """Import one check module by dotted name or ``.py`` path (idempotent); the name it is
    imported under. A module that fails to import leaves no check behind."""
    path = Path(name)
    from_file = name.endswith(".py") or path.is_file()
    if from_file and not path.is_file():
        raise CheckLoadError(f"check module file {name!r} does not exist")
    mod_name = _module_name_for_path(path) if from_file else name
    if mod_name in sys.modules:
        return mod_name
    try:
        if from_file:
            spec = importlib.util.spec_from_file_location(mod_name, path.resolve())
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(name)
        verify_defaults(mod_name)
    except BaseException as exc:
        sys.modules.pop(mod_name, None)
        forget(mod_name)
        if isinstance(exc, Exception):
            raise CheckLoadError(
                f"cannot import check module {name!r}: {type(exc).__name__}: {exc}") from exc
        raise
    return mod_name


def load(modules: list[str], builtin: bool = True) -> dict[str, CheckDef]:
    """Import the catalogue (unless ``builtin`` is False) and ``modules``; their checks (those
    of their submodules included), not those of other check modules this process imported."""
    if builtin:
        from accelkit.conformance import checks

        try:
            for module in checks.load_all():
                verify_defaults(module)
        except Exception as exc:
            raise CheckLoadError(
                f"cannot import the check catalogue (accelkit.conformance.checks): "
                f"{type(exc).__name__}: {exc}") from exc
    wanted = tuple(import_module(name) for name in modules)
    if builtin:
        wanted += ("accelkit.conformance.checks",)
    return {cid: c for cid, c in CHECKS.items()
            if any(c.module == m or c.module.startswith(m + ".") for m in wanted)}


def _matches(check_id: str, pattern: str) -> bool:
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(check_id, pattern)
    return pattern in check_id


def select(checks: dict[str, CheckDef], *, areas: list[str] | None = None,
           patterns: list[str] | None = None) -> list[CheckDef]:
    """Checks in ``areas`` whose id matches any of ``patterns`` (substring, or glob when it has
    ``*?[``), each at its default world size (the plan moves them to others); ordered by
    world size, then area, then definition order (a module lists its checks from the basic
    to the advanced)."""
    chosen = []
    position = {cid: i for i, cid in enumerate(checks)}
    for check in checks.values():
        if areas and check.area not in areas:
            continue
        if patterns and not any(_matches(check.id, p) for p in patterns):
            continue
        chosen.append(check)
    return sorted(chosen, key=lambda c: (c.world_size, c.area, position[c.id]))
