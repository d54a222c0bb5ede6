"""How long accelkit's own suite takes: `.ci/run` (lint, `tox`, `tox -e conformance`, the
mock's other modes, the other torch releases) on a fresh clone of the commit, each stage and
each tox environment timed, with the tests' count and their slowest items.

    python bench/suite_time.py [--cold] [--readme]       # clone HEAD, run .ci/run there, record
    python bench/suite_time.py --log FILE [--commit C] [--caches warm|cold] [--readme]

The first form clones HEAD into a temporary folder and runs `.ci/run` there (an hour or more on
two cores), its output written to ``bench/results/suite-time.log`` as it runs; ``--cold`` gives the run an
empty ``ACCELKIT_CACHE_DIR`` so every C++ part is built (pip's cache is the machine's either
way). The second records a `.ci/run` that already ran, from its output. Either writes
``bench/results/suite-time.json`` and, with ``--readme``, the section of bench/README.md with
the targets: `tox` (the tests) at most 10 minutes from warm C++ caches, CI at most 45 minutes
(the budget), 30 (the goal).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import environment, write_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
BEGIN, END = "<!-- suite_time.py: begin -->", "<!-- suite_time.py: end -->"
#: Targets, in minutes: the tests (`tox`) from warm caches; CI's budget and goal.
TOX_TARGET, CI_BUDGET, CI_GOAL = 10, 45, 30

#: `.ci/run`'s stage lines; newer ones also give the load average and the time (UTC) then.
STAGE = re.compile(r"^== (\S+): (\d+) (min|s) into CI(?:, load ([\d.]+), (.+ UTC))?")
#: tox's line per environment; ``cmd[...]`` lists each command's seconds, comma-separated.
ENV = re.compile(r"^\s+(\S+): (OK|FAIL code \d+) \(([\d.]+)=setup\[([\d.]+)\]\+cmd\[([\d.,]+)\] "
                 r"seconds\)")
COMMAND = re.compile(r"^(\S+): commands\[\d+\]> ")
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in ([\d.]+)s")
SLOW = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)")


def parse(log: str) -> dict:
    """A `.ci/run` output's stages (seconds from the start), tox environments (status and
    seconds), pytest summaries (per environment) and slowest test items."""
    stages, envs, pytest_runs, slowest = [], [], [], []
    current = None
    for line in log.splitlines():
        if m := STAGE.match(line):
            value = int(m.group(2)) * (60 if m.group(3) == "min" else 1)
            stage = {"stage": m.group(1), "at_s": value}
            if m.group(4):
                stage.update(load=float(m.group(4)), date=m.group(5))
            stages.append(stage)
        elif m := ENV.match(line):
            envs.append({"env": m.group(1), "status": m.group(2), "seconds": float(m.group(3)),
                         "setup_s": float(m.group(4)),
                         "commands_s": round(sum(map(float, m.group(5).split(","))), 2)})
        elif m := COMMAND.match(line):
            current = m.group(1)
        elif (m := SUMMARY.match(line)) and current is not None:
            counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", m.group(1))}
            pytest_runs.append({"env": current, "counts": counts, "seconds": float(m.group(2))})
        elif (m := SLOW.match(line)) and current == "tests":
            slowest.append({"seconds": float(m.group(1)), "when": m.group(2), "item": m.group(3)})
    return {"stages": stages, "envs": envs, "pytest": pytest_runs, "slowest": slowest[:15]}


def run_ci(cold: bool, log_path: Path) -> tuple[str, str, float]:
    """Clone HEAD, run .ci/run in the clone, its output written to ``log_path`` as it comes;
    the output, the commit and the wall seconds."""
    work = Path(tempfile.mkdtemp(prefix="accelkit-suite-time-"))
    try:
        clone = work / "accelkit"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, text=True,
                                capture_output=True, check=True).stdout.strip()
        env = dict(os.environ)
        if cold:
            env["ACCELKIT_CACHE_DIR"] = str(work / "cache")
        started = time.monotonic()
        with log_path.open("w") as log:
            code = subprocess.run([str(clone / ".ci" / "run")], cwd=clone, env=env,
                                  stdout=log, stderr=subprocess.STDOUT).returncode
            seconds = time.monotonic() - started
            log.write(f"\n.ci/run exit {code} after {seconds:.0f} s\n")
        return log_path.read_text(errors="replace"), commit, seconds
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def markdown(raw: dict) -> str:
    stages = raw["stages"]
    total = raw["total_s"]
    tests = next((e for e in raw["envs"] if e["env"] == "tests"), None)
    lines = [f"`python bench/suite_time.py{' --cold' if raw['caches'] == 'cold' else ''} "
             "--readme`: `.ci/run` on a fresh clone of commit "
             f"{raw['commit']}, {raw['date']}, {raw['cpus']} CPUs, load "
             f"{raw['load_before'][0]:.1f} before and {raw['load_after'][0]:.1f} after, C++ caches "
             f"{raw['caches']}; raw results in `results/suite-time.json`.", "",
             "| stage | minutes |", "|---|---:|"]
    for here, after in zip(stages, [*stages[1:], None], strict=True):
        if here["stage"] == "done":
            continue
        end = after["at_s"] if after else total
        lines.append(f"| {here['stage']} | {(end - here['at_s']) / 60:.1f} |")
    lines.append(f"| **all of `.ci/run`** | **{total / 60:.1f}** |")
    lines += ["", "| tox environment | status | minutes (setup + commands) |", "|---|---|---:|"]
    for e in raw["envs"]:
        lines.append(f"| {e['env']} | {e['status']} | {e['seconds'] / 60:.1f} "
                     f"({e['setup_s'] / 60:.1f} + {e['commands_s'] / 60:.1f}) |")
    for run in raw["pytest"]:
        counts = ", ".join(f"{n} {word}" for word, n in run["counts"].items())
        lines.append("")
        lines.append(f"pytest in `{run['env']}`: {counts} in {_minutes(run['seconds'])}.")
    if tests is not None:
        met = "met" if tests["seconds"] <= TOX_TARGET * 60 else "**not met**"
        lines += ["", f"`tox` (the tests): {_minutes(tests['seconds'])}; target ≤ {TOX_TARGET} "
                  f"min from warm C++ caches: {met}."]
    lines.append(f"CI: {_minutes(total)}; budget ≤ {CI_BUDGET} min: "
                 f"{'met' if total <= CI_BUDGET * 60 else '**not met**'}, goal ≤ {CI_GOAL} min: "
                 f"{'met' if total <= CI_GOAL * 60 else '**not met**'}.")
    if raw["slowest"]:
        lines += ["", "The slowest test items:", "", "| seconds | item |", "|---:|---|"]
        lines += [f"| {s['seconds']:.0f} | `{s['item']}` ({s['when']}) |" for s in raw["slowest"]]
    return "\n".join(lines) + "\n"


def _when(stages: list[dict]) -> dict:
    """The run's own date and its load at the first and last stage, where its stage lines give
    them (a log recorded later is then dated by when it ran, not when it was read)."""
    first, last = stages[0], stages[-1]
    if "load" not in first or "load" not in last:
        return {}
    return {"date": first["date"], "load_before": [first["load"]], "load_after": [last["load"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, help="the output of a .ci/run that already ran")
    parser.add_argument("--commit", help="with --log: the commit it ran (default HEAD)")
    parser.add_argument("--caches", choices=("warm", "cold"), default="warm",
                        help="with --log: whether the run found the C++ parts built")
    parser.add_argument("--cold", action="store_true",
                        help="run with an empty ACCELKIT_CACHE_DIR (every C++ part built)")
    parser.add_argument("--readme", action="store_true", help="write bench/README.md's section")
    args = parser.parse_args(argv)
    env = environment()
    if args.log is not None:
        if not args.log.is_file():
            parser.error(f"--log {args.log}: no such file; give the saved output of a .ci/run")
        log, commit, caches = args.log.read_text(errors="replace"), args.commit or env["commit"], \
            args.caches
        total = None
    else:
        log, commit, total = run_ci(args.cold, RESULTS / "suite-time.log")
        caches = "cold" if args.cold else "warm"
    parsed = parse(log)
    if not parsed["stages"] or not parsed["envs"]:
        sys.exit("suite_time.py: no stage of .ci/run in the output (it prints '== <stage>: ... "
                 "into CI' at each)")
    done = next((s["at_s"] for s in parsed["stages"] if s["stage"] == "done"), None)
    if total is None:
        if done is None:
            sys.exit("suite_time.py: the log ends before .ci/run's 'done' stage; record a run "
                     "that finished")
        total = done
    raw = {**env, "commit": commit, "caches": caches, "load_after": os.getloadavg(),
           "total_s": round(total, 1), **parsed, **_when(parsed["stages"])}
    (RESULTS / "suite-time.json").write_text(json.dumps(raw, indent=1) + "\n")
    text = markdown(raw)
    print(text)
    if args.readme:
        write_section(f"{BEGIN}\n{text}{END}", BEGIN, END, "How long the suite takes")
    failed = [e["env"] for e in parsed["envs"] if e["status"] != "OK"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
