"""``accelkit backends``: every known backend, and whether it can run here and why.

It reads the registry and calls each spec's ``probe``; it never calls ``setup()``, so listing
registers no device and leaves PrivateUse1 free. It imports torch first, as every backend's use
does: when that fails because a package's ``torch.backends`` entry point (torch's autoload of
out-of-tree devices) raises, the backend that package provides is marked broken with the real
error, the others are not probed (nothing can use torch in this environment until it is fixed
or ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` is set), and the exit code is 1.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata

from accelkit.core import registry
from accelkit.core.spec import BackendSpec

COLUMNS = ("NAME", "DEVICE", "COLLECTIVE", "RNG", "AVAILABLE", "REASON")
_AUTOLOAD_FAILED = re.compile(r"Failed to load the backend extension: (\S+?)\.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, default=1, metavar="N",
                        help="number of ranks the availability probe asks for (default 1)")


def run(args: argparse.Namespace) -> int:
    if args.world_size < 1:
        print(f"accelkit backends: --world-size must be >= 1, got {args.world_size}",
              file=sys.stderr)
        return 2
    try:
        specs = [registry.get(name) for name in registry.names()]
    except registry.BackendRegistryError as exc:
        print(f"accelkit backends: {exc}", file=sys.stderr)
        return 2
    broken = _torch_import_failure()
    if broken is None:
        rows = [_row(spec, args.world_size) for spec in specs]
    else:
        rows = [_row_without_torch(spec, *broken) for spec in specs]
    _print_table([COLUMNS, *rows])
    if broken is not None:
        print(f"\nimport torch fails: {broken[1]}", file=sys.stderr)
        return 1
    return 0


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    for row in rows:
        print("  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)),
                         row[-1]]).rstrip())


def _torch_import_failure() -> tuple[str | None, str] | None:
    """None when torch imports; else (the distribution whose ``torch.backends`` entry point
    failed, or None when it is something else, and the error behind it)."""
    try:
        import torch  # noqa: F401
    except Exception as exc:
        match = _AUTOLOAD_FAILED.search(str(exc))
        cause = exc.__cause__ or exc.__context__
        if match is None or cause is None:
            return None, f"{type(exc).__name__}: {exc}"
        entry = match.group(1)
        dists = [ep.dist.name for ep in metadata.entry_points(group="torch.backends")
                 if ep.name == entry and ep.dist is not None]
        what = (f"the torch.backends entry point {entry!r}"
                + (f" of distribution {dists[0]!r}" if dists else "")
                + f" raised {type(cause).__name__}: {cause}")
        return (dists[0] if dists else None), what
    return None


def _row_without_torch(spec: BackendSpec, culprit: str | None, error: str) -> tuple[str, ...]:
    if culprit is not None and registry.distribution(spec.name) == culprit:
        shown = "no"
        reason = (f"broken: import torch loads it and fails: {error} "
                  "(TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns torch's autoload off)")
    else:
        shown = "?"
        reason = ("not probed: import torch fails here"
                  + (f" because of {culprit}'s extension (see its row)" if culprit else
                     f": {error}"))
    return (spec.name, spec.device_type, spec.collective_backend, spec.capabilities.rng,
            shown, reason)


def _row(spec: BackendSpec, world_size: int) -> tuple[str, ...]:
    try:
        available, reason = spec.probe(world_size)
        shown = "yes" if available else "no"
    except Exception as exc:  # a broken probe is reported in its row, not as a crash
        shown, reason = "no", f"probe raised {type(exc).__name__}: {exc}"
    return (spec.name, spec.device_type, spec.collective_backend, spec.capabilities.rng,
            shown, reason)
