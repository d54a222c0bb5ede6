"""Who provides each PrivateUse1 kernel: accelkit's C++ layer, the vendor, or torch.

torch's dispatcher records where every kernel was registered (``torch._C._dispatch_dump``):
accelkit registers its kernels from ``core/csrc/runtime/register.cpp``
(``accelkit::register_device``), a vendor from its own ``TORCH_LIBRARY_IMPL`` blocks, torch from
its own sources (e.g. the c10d ops). A vendor kernel for an op accelkit also implements wins
(accelkit does not register over it), which is what ``accelkit doctor`` shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

#: Where accelkit registers its kernels and fallbacks (the end of the recorded path).
ACCELKIT_SITE = ("core", "csrc", "runtime", "register.cpp")

_SITE = re.compile(r"^(?P<key>\w+): (?:fallthrough )?registered at (?P<file>.+):(?P<line>\d+)")

#: An op that only backend kernels implement (no composite kernel), so the PrivateUse1 entry of
#: its dispatch table is the boxed fallback: where it was registered tells whose it is.
_FALLBACK_PROBE = "aten::nonzero"


@dataclass(frozen=True)
class Kernel:
    """One op's PrivateUse1 kernel and its registration site."""

    op: str
    owner: str  #: "accelkit", "vendor" or "torch"
    site: str   #: "file:line"


def owner_of(path: str) -> str:
    """"accelkit", "torch" or "vendor" for a registration site's file."""
    parts = PurePath(path).parts
    if tuple(parts[-len(ACCELKIT_SITE):]) == ACCELKIT_SITE:
        return "accelkit"
    if "pytorch" in parts or "torch" in parts:
        return "torch"
    return "vendor"


def _site(dump: str, key: str) -> tuple[str, str] | None:
    for line in dump.splitlines():
        match = _SITE.match(line)
        if match and match["key"] == key:
            return match["file"], match["line"]
    return None


def privateuse1_kernels() -> list[Kernel]:
    """Every op with a PrivateUse1 kernel in this process, with its owner, sorted by op."""
    import torch

    out = []
    for op in sorted(torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")):
        site = _site(torch._C._dispatch_dump(op), "PrivateUse1")
        if site is not None:
            out.append(Kernel(op, owner_of(site[0]), f"{site[0]}:{site[1]}"))
    return out


def fallback_owner() -> Kernel | None:
    """The PrivateUse1 boxed fallback and its owner, or None when there is none."""
    import torch

    if not torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1):
        return None
    site = _site(torch._C._dispatch_dump_table(_FALLBACK_PROBE), "PrivateUse1")
    if site is None:
        return Kernel("(boxed fallback)", "unknown", "?")
    return Kernel("(boxed fallback)", owner_of(site[0]), f"{site[0]}:{site[1]}")
