"""The catalogue's mutation score: every mutant of the mock's fault build against the whole
conformance catalogue, and which checks catch each.

A mutant is the mock with one realistic bug switched on (``tests/fixtures/mutant_faults.py``
lists them with the mode that shows them; ``core/csrc/testing/faults.cpp`` has the story of each). For
every mode one ``accelkit conformance`` run on the fault build (``ACCELKIT_MOCK_FAULTS=1``)
runs each catalogue check written for ``--world-size`` once per fault of the mode and once with
no fault (the control), all in one pool of ranks. A check catches a mutant when it ends
FAIL, ERROR, TIMEOUT or CRASH with the fault on and passes in the control of the same run.
The asynchronous and discrete mutants are also run in the default mode, where they must not
be caught (the default mode cannot see them: what the other modes add).

    python bench/mutants.py [--world-size 2] [--mode default] [--fault NAME ...] [--area AREA ...]
                            [--json bench/results/mutants.json] [--keep DIR]

Prints the table recorded in bench/README.md ("Mutation score"); exit status 1 if a mutant
goes uncaught in its mode or is caught in the default mode when it should not be.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(FIXTURES))

import mutant_faults  # noqa: E402  (tests/fixtures)


def markdown(rows: list[dict]) -> str:
    lines = ["| mutant | mode | caught by | checks |", "|---|---|---|---|"]
    for row in rows:
        names = ", ".join(f"`{c}`" for c in row["caught_by"]) or "—"
        lines.append(f"| `{row['fault']}` | {row['mode']} | {len(row['caught_by'])} | {names} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--mode", action="append", choices=sorted(mutant_faults.MODES),
                        help="only these modes (repeatable; default: all)")
    parser.add_argument("--fault", action="append", help="only these faults (repeatable)")
    parser.add_argument("--area", action="append", help="only catalogue checks of these areas")
    parser.add_argument("--timeout", type=float, default=120, help="per-check budget (s)")
    parser.add_argument("--json", type=Path, help="write the results there")
    parser.add_argument("--keep", type=Path, help="keep the check modules and reports there")
    args = parser.parse_args(argv)

    ids = [cid for cid in mutant_faults.catalogue_ids()
           if not args.area or cid.split(".", 1)[0] in args.area]
    faults = args.fault or list(mutant_faults.MUTANTS)
    unknown = sorted(set(faults) - set(mutant_faults.MUTANTS))
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; known: {sorted(mutant_faults.MUTANTS)}")
    modes = args.mode or list(mutant_faults.MODES)
    rows, runs, failed = [], {}, False
    with tempfile.TemporaryDirectory(prefix="accelkit-mutants-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for mode in modes:
            # Each mode's own mutants; the default mode also runs the others (not caught there).
            chosen = [f for f in faults if mode in mutant_faults.MUTANTS[f] or mode == "default"]
            if not chosen:
                continue
            plan = [(fault, ids) for fault in [mutant_faults.CONTROL, *chosen]]
            started = time.monotonic()
            outcomes = mutant_faults.run(mode, plan, args.world_size, folder, args.timeout)
            seconds = time.monotonic() - started
            runs[mode] = {"seconds": round(seconds, 1), "faults": chosen,
                          "checks": sum(len(v) for v in outcomes.values()),
                          "control_not_passing": sorted(
                              cid for cid, o in outcomes.get(mutant_faults.CONTROL, {}).items()
                              if o != "pass")}
            print(f"mode {mode}: {len(chosen)} faults x {len(ids)} checks + control in "
                  f"{seconds:.0f} s", file=sys.stderr)
            for fault, caught in mutant_faults.caught(outcomes).items():
                own = mode in mutant_faults.MUTANTS[fault]
                rows.append({"fault": fault, "mode": mode, "caught_by": caught})
                if own and not caught:
                    print(f"NOT CAUGHT: {fault} in mode {mode}", file=sys.stderr)
                    failed = True
                if not own and caught:
                    print(f"caught in mode {mode} although it belongs to "
                          f"{', '.join(mutant_faults.MUTANTS[fault])}: {fault} by {caught}",
                          file=sys.stderr)
                    failed = True
    order = list(mutant_faults.MUTANTS)
    rows.sort(key=lambda r: (order.index(r["fault"]), r["mode"] not in mutant_faults.MUTANTS[r["fault"]],
                             r["mode"]))
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"world_size": args.world_size, "runs": runs,
                                         "load_average": os.getloadavg(), "rows": rows},
                                        indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
