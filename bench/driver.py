"""Launch and event overhead on driver streams and events vs the layer before them, and the
FSDP2 step on both, in one run.

The reference is accelkit at ``--reference`` (default :data:`REFERENCE`, the last commit whose
``Runtime`` had no stream or event objects: ``torch.Event`` was the layer's marker task, the
mock's runtime its own scheduler). It is installed into a folder of its own
(``git archive`` + ``pip install --target``, kept under the accelkit cache as
``bench-reference/<commit>``) and imported through ``PYTHONPATH``; its C++ builds into cache
folders of its own (they are keyed by the sources' digest). The current build is the accelkit
this Python imports. Each round runs, in fresh processes, reference then current:

- per mode (synchronous; asynchronous, ``ACCELKIT_MOCK_ASYNC=1``), the micro cases
  (:data:`CASES`): each the median over batches of a batch's time per call until the calls
  return ("issue") and until ``torch.mock.synchronize()`` returns ("done"); and the first op
  of a fresh process (its time and the modules it imports);
- the FSDP2 step of ``bench/training.py`` (``--layouts fsdp2``: 4 ranks, mock + mockccl and
  cpu + gloo alternating), per mode.

A ratio is the median over rounds of current/reference (paired: the two run back to back, under
the same load). Exit status 1 when a ratio exceeds :data:`TARGET` (no regression beyond the
machine's noise), an empty launch adds more than :data:`LAUNCH_ADDED_TARGET` of a tiny op, or the
first op costs more than :data:`FIRST_OP_TARGET` times torch's own first
op on its ``meta`` device. Writes the raw results
(``bench/results/driver.json``) and the section "Driver streams and events" of
bench/README.md.

    python bench/driver.py [--rounds 7] [--reference REV] [--no-fsdp2] [--no-readme]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import environment, write_section
from _timing import returned_and_done

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: The last commit before driver streams and events (the Runtime seam's launch, copy and
#: stream_wait only; the layer's own events).
REFERENCE = "2c1d7bb"
MODES = {"sync": {}, "async": {"ACCELKIT_MOCK_ASYNC": "1"}}
#: case -> what it times per call.
CASES = {
    "launch": "an empty kernel launched on the current stream (torch.mock's _sleep(0))",
    "add_8": "torch.add of two 8-element float32 tensors (dispatch, the launch, the output)",
    "event_record_query": "Event(enable_timing=True).record() then .query()",
    "event_record_synchronize": "Event.record() then .synchronize()",
    "wait_event": "Event.record() on the current stream, then another stream's wait_event()",
    "elapsed_time": "two timing events recorded, the second synchronized, elapsed_time()",
}
#: The largest current/reference ratio accepted (the 2-core machine's run-to-run noise).
TARGET = 1.15
#: The empty launch is held to what it adds to an op instead: current minus reference, over
#: the reference's ``add_8``, at most this. A launch is now two driver calls through the adapter
#: (mockSetDevice, mockLaunchKernel), as a vendor's layer makes them, where the runtime before ran
#: the kernel itself; what that costs must stay small beside the op it launches.
LAUNCH_ADDED_TARGET = 0.05
#: The first op of a fresh process over torch's own first op on its ``meta`` device (in a fresh
#: process too): the asynchronous mock infers an op's output from its meta kernel, and torch
#: registers Python meta kernels for many ops (torch/_meta_registrations.py, shadowing the C++
#: structured ones) whose first call imports torch._dynamo (``_disable_dynamo`` in
#: torch/_compile.py), once per process, as any FakeTensor or meta-device user pays. Beyond that
#: cost the first op adds at most this much.
FIRST_OP_TARGET = 1.2
BEGIN, END = "<!-- driver.py: begin -->", "<!-- driver.py: end -->"


def micro(calls: int, batches: int) -> dict:
    """The micro cases in this process (its mode from the environment): per case, the median
    of ``batches`` batches of ``calls`` calls, in µs per call; and the first op's cost."""
    import accelkit.backends.mock as mock  # noqa: F401  (registers torch.mock)
    import torch

    torch.set_num_threads(1)
    before = set(sys.modules)
    start = time.perf_counter()
    first = torch.ones(8, device="mock") + 1
    torch.mock.synchronize()
    first_s = time.perf_counter() - start
    imported = sorted(set(sys.modules) - before)
    del first

    sleep = mock._C._sleep
    a, b = torch.ones(8, device="mock"), torch.ones(8, device="mock")
    side = torch.mock.Stream()
    timing = torch.mock.Event(enable_timing=True)
    end = torch.mock.Event(enable_timing=True)
    plain = torch.mock.Event()

    def launch():
        sleep(0)

    def add_8():
        torch.add(a, b)

    def event_record_query():
        timing.record()
        timing.query()

    def event_record_synchronize():
        plain.record()
        plain.synchronize()

    def wait_event():
        plain.record()
        side.wait_event(plain)

    def elapsed_time():
        timing.record()
        end.record()
        end.synchronize()
        timing.elapsed_time(end)

    cases = {"launch": launch, "add_8": add_8, "event_record_query": event_record_query,
             "event_record_synchronize": event_record_synchronize, "wait_event": wait_event,
             "elapsed_time": elapsed_time}
    assert cases.keys() == CASES.keys()
    results = {}
    for name, fn in cases.items():
        for _ in range(calls // 10):
            fn()
        torch.mock.synchronize()
        issue, done = returned_and_done(fn, calls, batches, torch.mock.synchronize)
        results[name] = {"issue_us": statistics.median(issue) / calls * 1e6,
                         "done_us": statistics.median(done) / calls * 1e6}
    return {"accelkit": mock.__file__, "torch": torch.__version__, "cases": results,
            "first_op_s": first_s, "first_op_imports": len(imported),
            "first_op_imports_dynamo": "torch._dynamo" in imported}


def first_meta_op() -> dict:
    """torch's first op on its meta device in this (fresh) process: seconds and modules imported."""
    import torch

    before = set(sys.modules)
    start = time.perf_counter()
    torch.ones(8, device="meta") + 1
    seconds = time.perf_counter() - start
    return {"first_op_s": seconds, "first_op_imports": len(set(sys.modules) - before)}


def reference_site(rev: str) -> tuple[Path, str]:
    """The folder accelkit at ``rev`` is installed in (built the first time) and its commit."""
    from accelkit.core.cpp import cache_root

    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                            capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"--reference {rev}: not a commit of {ROOT} ({commit.stderr.strip()}); "
                         "name a commit of this repository's history")
    commit = commit.stdout.strip()
    site = cache_root() / "bench-reference" / commit
    if (site / "accelkit" / "__init__.py").exists():
        return site, commit
    with tempfile.TemporaryDirectory(prefix="accelkit-reference-") as tmp:
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        print(f"installing the reference {commit[:10]} into {site}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--target", str(site), tmp], check=True)
    return site, commit


def build_env(site: Path | None, mode: str) -> dict:
    """The environment of a process of one build (``site``: the reference's folder; None: the
    current build) in ``mode``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_MOCK_")}
    env.update(MODES[mode], OMP_NUM_THREADS="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_micro(site: Path | None, mode: str, calls: int, batches: int) -> dict:
    """The micro cases in a fresh process of one build (None: torch's first meta op)."""
    args = ["--micro", str(calls), str(batches)] if mode else ["--first-meta-op"]
    proc = subprocess.run([sys.executable, __file__, *args], env=build_env(site, mode or "sync"),
                          capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"the micro cases ({mode}, {site or 'current'}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def run_fsdp2(site: Path | None, mode: str, steps: int) -> dict:
    """bench/training.py's FSDP2 step (one round of ``steps`` steps) in this build and mode."""
    with tempfile.TemporaryDirectory(prefix="accelkit-driver-bench-") as out:
        proc = subprocess.run([sys.executable, str(HERE / "training.py"), "--layouts", "fsdp2",
                               "--rounds", "1", "--steps", str(steps), "--no-readme", "--no-plot",
                               "--out", out], env=build_env(site, mode), capture_output=True,
                              text=True, timeout=1800)
        if proc.returncode not in (0, 1):  # 1: training.py's own goal missed, still a result
            raise SystemExit(f"the FSDP2 step ({mode}, {site or 'current'}) failed:\n{proc.stderr[-3000:]}")
        rows = json.loads((Path(out) / "training.json").read_text())["rows"]
    by = {r["device"]: r["seconds"] for r in rows}
    return {"mock_s": by["mock"], "cpu_s": by["cpu"]}


def ratios(rounds: list[dict], key) -> float:
    """The median over rounds of current/reference of ``key(result)``."""
    return statistics.median(key(r["current"]) / key(r["reference"]) for r in rounds)


def report(data: dict) -> tuple[str, bool]:
    ok = True
    lines = ["| mode | case | reference issue | current issue | ratio | reference done | current done | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for mode in MODES:
        rounds = data["micro"][mode]
        for case in CASES:
            med = {b: {k: statistics.median(r[b]["cases"][case][k] for r in rounds)
                       for k in ("issue_us", "done_us")} for b in ("reference", "current")}
            ri = ratios(rounds, lambda r, c=case: r["cases"][c]["issue_us"])
            rd = ratios(rounds, lambda r, c=case: r["cases"][c]["done_us"])
            lines.append(f"| {mode} | `{case}` | {med['reference']['issue_us']:.2f} µs | "
                         f"{med['current']['issue_us']:.2f} µs | {ri:.2f} | "
                         f"{med['reference']['done_us']:.2f} µs | {med['current']['done_us']:.2f} µs | "
                         f"{rd:.2f} |")
            if case == "launch":
                added = statistics.median(
                    (r["current"]["cases"][case]["done_us"] - r["reference"]["cases"][case]["done_us"])
                    / r["reference"]["cases"]["add_8"]["done_us"] for r in rounds)
                met = added <= LAUNCH_ADDED_TARGET
                verdicts.append(f"{'PASS' if met else 'MISS'}  {mode} {case}: current {rd:.2f} x done; "
                                f"it adds {added:.3f} of the reference's add_8 (<= {LAUNCH_ADDED_TARGET})")
            else:
                met = max(ri, rd) <= TARGET
                verdicts.append(f"{'PASS' if met else 'MISS'}  {mode} {case}: current {ri:.2f} x issue, "
                                f"{rd:.2f} x done (<= {TARGET})")
            ok = ok and met
    meta = statistics.median(r["first_op_s"] for r in data["first_meta_op"])
    lines += ["", "| mode | first op, reference | first op, current | modules it imports (current) | "
              "current / torch's first meta op |", "|---|---|---|---|---|"]
    for mode in MODES:
        rounds = data["micro"][mode]
        ref = statistics.median(r["reference"]["first_op_s"] for r in rounds)
        cur = statistics.median(r["current"]["first_op_s"] for r in rounds)
        imports = rounds[-1]["current"]["first_op_imports"]
        dynamo = " (torch._dynamo among them)" if rounds[-1]["current"]["first_op_imports_dynamo"] else ""
        rel = statistics.median(r["current"]["first_op_s"] / m["first_op_s"]
                                for r, m in zip(rounds, data["first_meta_op"], strict=True))
        lines.append(f"| {mode} | {ref * 1e3:.0f} ms | {cur * 1e3:.0f} ms | {imports}{dynamo} | {rel:.2f} |")
        met = rel <= FIRST_OP_TARGET
        ok = ok and met
        verdicts.append(f"{'PASS' if met else 'MISS'}  {mode} first op: {cur * 1e3:.0f} ms, {rel:.2f} x "
                        f"torch's first op on its meta device ({meta * 1e3:.0f} ms, "
                        f"{data['first_meta_op'][-1]['first_op_imports']} modules; <= {FIRST_OP_TARGET})")
    if data.get("fsdp2"):
        lines += ["", "| mode | FSDP2 step, reference | FSDP2 step, current | ratio | "
                  "mock/cpu, reference | mock/cpu, current |", "|---|---|---|---|---|---|"]
        for mode in MODES:
            rounds = data["fsdp2"][mode]
            med = {b: statistics.median(r[b]["mock_s"] for r in rounds) for b in ("reference", "current")}
            rel = {b: statistics.median(r[b]["mock_s"] / r[b]["cpu_s"] for r in rounds)
                   for b in ("reference", "current")}
            ratio = ratios(rounds, lambda r: r["mock_s"])
            lines.append(f"| {mode} | {med['reference'] * 1e3:.0f} ms | {med['current'] * 1e3:.0f} ms | "
                         f"{ratio:.2f} | {rel['reference']:.2f} | {rel['current']:.2f} |")
            met = ratio <= TARGET
            ok = ok and met
            verdicts.append(f"{'PASS' if met else 'MISS'}  {mode} FSDP2 step: current {ratio:.2f} x "
                            f"reference (<= {TARGET})")
    return "\n".join(lines + [""] + verdicts), ok


def readme_section(data: dict, table: str, argv: list[str]) -> str:
    env, opts = data["environment"], data["options"]
    load = lambda v: f"{v[0]:.1f}"  # noqa: E731  (1-minute average)
    cases = "; ".join(f"`{k}`: {v}" for k, v in CASES.items())
    return "\n".join([
        BEGIN, "", f"`{' '.join(['python bench/driver.py', *argv])}`",
        f"(regenerates this part and `bench/results/driver.json`). Measured {env['date']}, commit "
        f"{env['commit']} against the reference {data['reference'][:10]}, torch {env['torch']}, "
        f"{env['cpus']} CPUs, load average {load(env['load_before'])} before and "
        f"{load(env['load_after'])} after; {opts['rounds']} rounds, each a fresh process per build "
        f"and mode with batches of {opts['calls']} calls (median of {opts['batches']})"
        + (f" and an FSDP2 run of {opts['steps']} steps" if data.get("fsdp2") else "")
        + f". Cases: {cases}. Times are per call; ratios current/reference.", "",
        "\n".join(f"- {line}" if line.startswith(("PASS", "MISS")) else line for line in table.splitlines()),
        "", END])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--reference", default=REFERENCE, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000, help="calls per batch")
    parser.add_argument("--batches", type=int, default=7, help="timed batches per case")
    parser.add_argument("--steps", type=int, default=3, help="FSDP2 steps per round")
    parser.add_argument("--no-fsdp2", action="store_true", help="the micro cases only")
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md")
    args = parser.parse_args(argv)
    for name in ("rounds", "calls", "batches", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    site, commit = reference_site(args.reference)
    env = environment()
    data = {"reference": commit, "options": {k: getattr(args, k) for k in ("rounds", "calls", "batches", "steps")},
            "micro": {m: [] for m in MODES}, "first_meta_op": [],
            "fsdp2": {} if args.no_fsdp2 else {m: [] for m in MODES}}
    start = time.monotonic()
    for i in range(args.rounds):
        # reference first in even rounds, current first in odd ones: neither always follows the other
        builds = (("reference", site), ("current", None))[::1 if i % 2 == 0 else -1]
        data["first_meta_op"].append(run_micro(None, None, 0, 0))
        for mode in MODES:
            data["micro"][mode].append({b: run_micro(s, mode, args.calls, args.batches) for b, s in builds})
            if not args.no_fsdp2:
                data["fsdp2"][mode].append({b: run_fsdp2(s, mode, args.steps) for b, s in builds})
        print(f"  round {i + 1} of {args.rounds}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    first = data["micro"]["sync"][0]
    for build, under in (("reference", True), ("current", False)):
        if Path(first[build]["accelkit"]).resolve().is_relative_to(site.resolve()) != under:
            raise SystemExit(f"the {build} build imported accelkit from {first[build]['accelkit']} "
                             f"({'not ' if under else ''}the reference's folder {site})")
    data["environment"] = {**env, "load_after": os.getloadavg()}
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / "driver.json"
    raw.write_text(json.dumps(data, indent=1) + "\n")
    text, ok = report(data)
    print(text)
    if not args.no_readme:
        write_section(readme_section(data, text, argv or sys.argv[1:]), BEGIN, END,
                      "Driver streams and events")
    print(f"\n{time.monotonic() - start:.0f} s; numbers: {raw}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--micro":
        print(json.dumps(micro(int(sys.argv[2]), int(sys.argv[3]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "--first-meta-op":
        print(json.dumps(first_meta_op()))
    else:
        sys.exit(main())
