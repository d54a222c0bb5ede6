"""Benchmark of the conformance suite's world sizes, on the mock:

1. the simulated tier: the whole ``scale`` area in one ``accelkit conformance`` run (16, 64,
   256 and 1,024 ranks, one worker per size on torch's fake process group; target <= 10 min
   and <= 4 GiB peak RSS on the 2-core machine), split per size from its report (the checks'
   time, the worker's start-up, the worker's peak RSS);
2. real processes: the checks of the devicemesh and pipelining areas that run at
   ``--world-size`` N = 2, 4, 8, 16 (N rank processes, mockccl), one run per size.

For each run: its wall time, the peak RSS of its largest process (``wait4``'s ``ru_maxrss``:
the engine or one rank) and the sum of the ranks' peaks (from the report's per-rank
``peak_host_mb``). Writes ``bench/results/scale.json``
(with the commit, torch version and load average) and ``scale.png``, and regenerates the
"World sizes" section of bench/README.md.

    python bench/scale.py [--simulated 16,64,256,1024] [--real 2,4,8,16] [--no-readme]
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
from accelkit.conformance.launchers.processes import kill_group, spawn

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BEGIN, END = "<!-- scale.py: begin -->", "<!-- scale.py: end -->"
#: The real tier's checks: areas whose checks are written for any world size (DeviceMesh's
#: groups; pipelining's point-to-point traffic, which fills mockccl's per-pair mailboxes).
REAL_AREAS = ("devicemesh", "pipelining")
#: Targets for the whole scale area (every simulated size in one run).
TARGET_S, TARGET_MIB = 600.0, 4096.0


def _conformance(args: list[str], env: dict[str, str] | None = None) -> dict:
    """One ``accelkit conformance --backend mock`` run: wall time, exit code, peak RSS of its
    largest process, the report's summary and the ranks' summed peak."""
    with tempfile.TemporaryDirectory(prefix="accelkit-bench-scale-") as out:
        cmd = [sys.executable, "-c", "import sys; from accelkit.cli import main; "
               "sys.exit(main(sys.argv[1:]))", "conformance", "--backend", "mock",
               "--report-dir", out, *args]
        started = time.perf_counter()
        proc = spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                     env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:  # the run's ranks go with it, also when this one is interrupted
            kill_group(proc.pid, [])
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4
        wall = time.perf_counter() - started
        stderr = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        try:
            report = json.loads((Path(out) / "report.json").read_text())
        except (OSError, ValueError):
            raise SystemExit(f"{' '.join(cmd)} wrote no report (exit status {status}):\n{stderr}") from None
    ranks_peak = max((sum(r["peak_host_mb"] or 0 for r in c["ranks"]) for c in report["checks"]),
                     default=0.0)
    check_s = sum(c["duration_s"] for c in report["checks"])
    return {"args": args, "exit": os.waitstatus_to_exitcode(status), "wall_s": round(wall, 1),
            "check_s": round(check_s, 2), "peak_process_mib": round(usage.ru_maxrss / 1024, 1),
            "peak_ranks_sum_mib": round(ranks_peak, 1), "summary": report["summary"],
            "pool_start_s": round(sum(s["seconds"] for s in report["pool_starts"]), 1),
            "report": report}


def _per_size(report: dict, n: int) -> dict:
    """The simulated size ``n`` of a whole-area report: its checks' time and outcomes, its
    worker's start-up and peak RSS."""
    checks = [c for c in report["checks"] if c["world_size"] == n]
    start = sum(s["seconds"] for s in report["pool_starts"] if s["world_size"] == n)
    check_s = sum(c["duration_s"] for c in checks)
    peak = max((c["peak_host_mb"] or 0 for c in checks), default=0.0)
    summary = {}
    for c in checks:
        summary[c["outcome"]] = summary.get(c["outcome"], 0) + 1
    return {"world_size": n, "wall_s": round(check_s + start, 1), "check_s": round(check_s, 2),
            "pool_start_s": round(start, 1), "peak_process_mib": round(peak, 1),
            "peak_ranks_sum_mib": round(peak, 1), "summary": summary}


def measure(simulated: list[int], real: list[int], save) -> dict:
    """Measure both tiers; ``save(data)`` after each run, so a run stopped early keeps the
    sizes measured so far."""
    data = {"environment": environment(), "simulated": [], "real": []}
    whole = _conformance(["--area", "scale", *(a for n in simulated for a in ("--world-size", str(n)))])
    report = whole.pop("report")
    data["whole_area"] = whole
    print(f"whole scale area: {whole['wall_s']:.1f} s, peak {whole['peak_process_mib']:.0f} MiB", flush=True)
    data["simulated"] = [_per_size(report, n) for n in simulated]
    data["environment"]["load_after"] = os.getloadavg()
    save(data)
    for n in real:
        args = [a for area in REAL_AREAS for a in ("--area", area)] + ["--world-size", str(n)]
        row = _conformance(args, env={"ACCELKIT_MOCK_DEVICES": str(max(n, 8))})
        row.pop("report")
        data["real"].append({"world_size": n, **row})
        print(f"real {n:5d}: {row['wall_s']:6.1f} s, ranks' peak {row['peak_ranks_sum_mib']:.0f} MiB",
              flush=True)
        data["environment"]["load_after"] = os.getloadavg()
        save(data)
    return data


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for tier, style in (("simulated", "o-"), ("real", "s-")):
        rows = data[tier]
        if not rows:
            continue
        sizes = [r["world_size"] for r in rows]
        axes[0].plot(sizes, [r["wall_s"] for r in rows], style, label=f"{tier}: checks + start-up")
        axes[0].plot(sizes, [r["check_s"] for r in rows], style, alpha=0.5, label=f"{tier}: checks only")
        memory = "peak_process_mib" if tier == "simulated" else "peak_ranks_sum_mib"
        axes[1].plot(sizes, [r[memory] for r in rows], style,
                     label=f"{tier}: {'the one worker' if tier == 'simulated' else 'sum over ranks'}")
    for ax, title in ((axes[0], "wall time, s"), (axes[1], "peak RSS, MiB")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("world size")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    env = data["environment"]
    fig.suptitle(f"accelkit conformance on mock: scale area (simulated) and {', '.join(REAL_AREAS)} "
                 f"(real); torch {env['torch']}, commit {env['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def readme_section(data: dict) -> str:
    env, whole = data["environment"], data["whole_area"]
    load = lambda v: "–".join(f"{x:.1f}" for x in v[:1])  # noqa: E731  (1-minute average)
    lines = [BEGIN, "", "`python bench/scale.py` (regenerates this section, "
             "`bench/results/scale.json` and `scale.png`). Measured "
             f"{env['date']}, commit {env['commit']}, torch {env['torch']}, {env['cpus']} CPUs, "
             f"load average {load(env['load_before'])} before and {load(env['load_after'])} after.",
             "", "| tier | world size | checks + start-up | checks | worker start-up | peak RSS (largest "
             "process) | peak RSS (sum over ranks) | result |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for tier in ("simulated", "real"):
        for r in data[tier]:
            s = r["summary"]
            result = ", ".join(f"{s[k]} {k}" for k in ("pass", "xfail", "skip", "fail", "error",
                                                       "timeout", "crash") if s.get(k))
            lines.append(f"| {tier} | {r['world_size']} | {r['wall_s']:.1f} s | {r['check_s']:.1f} s | "
                         f"{r['pool_start_s']:.1f} s | {r['peak_process_mib']:.0f} MiB | "
                         f"{r['peak_ranks_sum_mib']:.0f} MiB | {result} |")
    met = whole["wall_s"] <= TARGET_S and whole["peak_process_mib"] <= TARGET_MIB
    lines += ["", f"The whole `scale` area (16, 64, 256 and 1,024 ranks in one run): "
              f"{whole['wall_s']:.1f} s, peak RSS {whole['peak_process_mib']:.0f} MiB. Target "
              f"≤ {TARGET_S:.0f} s and ≤ {TARGET_MIB:.0f} MiB: **{'met' if met else 'missed'}**.",
              "", "![world sizes](results/scale.png)", "", END]
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulated", type=_sizes, default=[16, 64, 256, 1024])
    parser.add_argument("--real", type=_sizes, default=[2, 4, 8, 16])
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    args = parser.parse_args(argv)

    def save(data: dict) -> None:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "scale.json").write_text(json.dumps(data, indent=1) + "\n")
        plot(data, RESULTS / "scale.png")
        if not args.no_readme:
            write_section(readme_section(data), BEGIN, END, "World sizes")

    data = measure(args.simulated, args.real, save)
    print(readme_section(data))
    whole = data["whole_area"]
    return 0 if whole["wall_s"] <= TARGET_S and whole["peak_process_mib"] <= TARGET_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
