"""The ``ops`` area's cost and result: ``accelkit conformance --backend mock --area ops`` at the
quick level in every mode of the mock, and at the full level (``ACCELKIT_OPS_LEVEL=full``),
each a run of its own at 4 ranks: wall time (pool start included), the checks' time, the
op table's counts (OpInfo ops, op x dtype rows per status) and the registry sweep's aten ops
without a path on the device (in a documented family, or not).

    python bench/ops_area.py [--modes default discrete discrete-async async] [--no-full]
                             [--no-readme]

Writes ``bench/results/ops-area.json`` (with the commit, torch version and load average) and
regenerates the "Operators" section of bench/README.md. Exit status 1 if a run did not pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import environment, write_section
from accelkit.backends import mock_spec

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BEGIN, END = "<!-- ops_area.py: begin -->", "<!-- ops_area.py: end -->"
#: The mock's modes (accelkit.backends.mock_spec.MODES), in the order conformance-modes runs them.
MODES = {mode: mock_spec.MODES[mode] for mode in ("default", "discrete", "discrete-async", "async")}
STATUSES = ("pass", "fail", "error", "xfail", "xpass", "skip")
#: The registry sweep: its rows are aten ops without a path, not OpInfo x dtype rows.
REGISTRY = "ops.registry"


def run(mode: str, level: str) -> dict:
    """One ``--area ops`` run; its times and the op table's counts."""
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELKIT_OPS_LEVEL=level, **MODES[mode])
    with tempfile.TemporaryDirectory() as reports:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "accelkit", "conformance", "--backend", "mock",
                               "--area", "ops", "--report-dir", reports], env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - start
        written = Path(reports) / "report.json"
        if not written.exists():
            raise SystemExit(f"no report from the {mode} {level} run:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        report = json.loads(written.read_text())
    rows = [row for check in report["checks"] if check["id"] != REGISTRY for row in check["rows"]]
    no_path = [row for check in report["checks"] if check["id"] == REGISTRY for row in check["rows"]]
    return {"mode": mode, "level": level, "exit": proc.returncode, "wall_s": round(wall, 1),
            "checks_s": round(sum(c["duration_s"] for c in report["checks"]), 1),
            "outcomes": {c["id"]: c["outcome"] for c in report["checks"]},
            "no_path": {s: sum(row["status"] == s for row in no_path) for s in ("skip", "error")},
            "ops": len({row["op"] for row in rows}), "rows": len(rows),
            "counts": {s: sum(row["status"] == s for row in rows) for s in STATUSES},
            "not_passed": sorted({f"{row['op']} {row['dtype']}: {row['status']}"
                                  for row in rows if row["status"] in ("fail", "error", "xfail", "xpass")})}


def readme_section(data: dict) -> str:
    env = data["environment"]
    lines = [BEGIN, "", "`python bench/ops_area.py` (regenerates this section, raw results in "
             "`results/ops-area.json`): `accelkit conformance --backend mock --area ops` at 4 ranks, "
             "one run per mode and level.", "",
             "| mode | level | ops | rows | " + " | ".join(STATUSES) + " | no path: documented, not | checks | wall |",
             "|---|---|---:|---:|" + "---:|" * len(STATUSES) + "---|---:|---:|"]
    for r in data["runs"]:
        counts = " | ".join(str(r["counts"][s]) for s in STATUSES)
        lines.append(f"| {r['mode']} | {r['level']} | {r['ops']} | {r['rows']} | {counts} | "
                     f"{r['no_path']['skip']}, {r['no_path']['error']} | "
                     f"{r['checks_s']:.0f} s | {r['wall_s']:.0f} s |")
    lines += ["", f"Measured {env['date']}, commit {env['commit']}, torch {env['torch']}, "
              f"{env['cpus']} CPUs, load average {env['load_before'][0]:.1f} before and "
              f"{env['load_after'][0]:.1f} after. The rows that did not pass (xfail: listed in the "
              "mock's expectations with the reason, or expected by torch):", ""]
    for r in data["runs"]:
        lines.append(f"- {r['mode']}, {r['level']}: " + (", ".join(r["not_passed"]) or "none"))
    return "\n".join([*lines, "", END])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--no-full", action="store_true", help="skip the full level")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    args = parser.parse_args(argv)
    data = {"environment": environment(), "runs": []}
    plan = [(mode, "quick") for mode in args.modes] + ([] if args.no_full else [("default", "full")])
    for mode, level in plan:
        result = run(mode, level)
        data["runs"].append(result)
        print(f"{mode:15} {level:6} {result['ops']} ops, {result['rows']} rows {result['counts']} "
              f"checks {result['checks_s']} s, wall {result['wall_s']} s, exit {result['exit']}",
              flush=True)
    data["environment"]["load_after"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ops-area.json").write_text(json.dumps(data, indent=1) + "\n")
    if not args.no_readme:
        write_section(readme_section(data), BEGIN, END, "Operators")
    return 0 if all(r["exit"] == 0 for r in data["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
