"""``accelkit backends``: every known backend, and whether it can run here and why.

It reads the registry and calls each spec's ``probe``; it never calls ``setup()``, so listing
registers no device and leaves PrivateUse1 free.
"""

from __future__ import annotations

import argparse
import sys

from accelkit.core import registry
from accelkit.core.spec import BackendSpec

COLUMNS = ("NAME", "DEVICE", "COLLECTIVE", "RNG", "AVAILABLE", "REASON")


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
    rows = [COLUMNS, *(_row(spec, args.world_size) for spec in specs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    for row in rows:
        print("  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]]).rstrip())
    return 0


def _row(spec: BackendSpec, world_size: int) -> tuple[str, ...]:
    try:
        available, reason = spec.probe(world_size)
        shown = "yes" if available else "no"
    except Exception as exc:  # a broken probe is reported in its row, not as a crash
        shown, reason = "no", f"probe raised {type(exc).__name__}: {exc}"
    return (spec.name, spec.device_type, spec.collective_backend, spec.capabilities.rng,
            shown, reason)
