"""torch versions: the range accelkit supports, version clauses, and the installed torch.

A version range is a comma-separated list of ``>=``, ``>``, ``<=``, ``<``, ``==``, ``!=`` clauses
on release numbers (``2.13`` compares as ``2.13.0``; local parts such as ``+cpu`` are ignored).
Expectations files, ``accelkit upstream``'s harness adaptations, :data:`PRIVATE_APIS
<accelkit.core.torch_internals.PRIVATE_APIS>` and version-gated checks all use it.
"""

from __future__ import annotations

import re
from importlib import metadata

_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")


def release(version: str) -> tuple[int, ...]:
    """``2.15.0+cu130`` -> ``(2, 15, 0)``; ``2.13`` -> ``(2, 13, 0)``."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    if not match:
        raise ValueError(f"not a version: {version!r}")
    parts = tuple(int(p) for p in match.group(0).split("."))
    return parts + (0,) * (3 - len(parts))


def version_matches(version: str, spec: str) -> bool:
    """Whether ``version`` (e.g. ``2.13.0+cpu``) satisfies ``spec`` (e.g. ``>=2.13,<2.15``)."""
    have = release(version)
    for clause in spec.split(","):
        match = _CLAUSE.match(clause)
        if not match:
            raise ValueError(f"bad version clause {clause.strip()!r} (expected e.g. '>=2.13')")
        op, want = match.group(1), release(match.group(2))
        ok = {">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want,
              "==": have == want, "!=": have != want}[op]
        if not ok:
            return False
    return True


def torch_version() -> str:
    """The installed torch's version, read from its metadata (torch is not imported)."""
    return metadata.version("torch")


def torch_at_least(minimum: str) -> bool:
    """Whether the installed torch is ``minimum`` (e.g. ``"2.15"``) or newer."""
    return release(torch_version()) >= release(minimum)


def torch_build() -> str:
    """``CPU``, ``CUDA 13.0`` or ``ROCm 7.1``: what the installed torch was built for, read from
    its ``torch/version.py`` (torch is not imported)."""
    try:
        text = metadata.distribution("torch").locate_file("torch/version.py").read_text()
    except (OSError, metadata.PackageNotFoundError):
        return "unknown"
    for key, label in (("cuda", "CUDA"), ("hip", "ROCm")):
        found = re.search(rf"^{key}\s*(?::\s*[^=]+)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if found:
            return f"{label} {found.group(1)}"
    return "CPU"
