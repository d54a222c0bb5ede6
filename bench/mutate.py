"""Sampled mutation testing of the C++ layer and the mock: how many plausible bugs at random
places of ``core/csrc`` and ``backends/mock/csrc`` the conformance catalogue kills.

Where ``bench/mutants.py`` switches on faults someone wrote, this one writes the bugs itself. A
mutant is one small edit of one line, at a site drawn from ``--seed``:

    drop     an expression statement (a call, an assignment, an increment) is removed
    return   ``return <expression>;`` becomes ``return {};`` (the type's default value)
    compare  a comparison is flipped: ``<`` and ``>=``, ``>`` and ``<=``, ``==`` and ``!=``
    offset   an integer literal ``n`` becomes ``n + 1``

Sites are the code lines of the files (no comments, blank or preprocessor lines, no code inside
``#ifdef ACCELKIT_FAULTS``, no lines of the fault build's own files nor of mockccl's path across
hosts, which the catalogue on one host never reaches), drawn uniformly over every site of every
file, then an applicable operator at the site. Each mutant is written into the
working tree, built (accelkit's library and the mock's two extensions, in a cache folder of the
run: ``ACCELKIT_CACHE_DIR``; a compiler cache, ``ccache`` on ``PATH``, makes a rebuild one file
long), and run against the catalogue at ``--world-size`` on the mock:

1. the areas the mutated file serves (:data:`FILE_AREAS`) in the default mode;
2. a mutant that survived that: the whole catalogue in the default mode, then the areas of the
   file in the discrete and asynchronous modes (:data:`MODES`), which reach the paths the
   default mode does not;
3. a mutant that survived those, of a file with tests of its own behaviour beyond the
   catalogue's contract (:data:`FILE_TESTS`: mockccl's error reporting and settings): those
   tests;

then the file is restored (also when the run is interrupted). A mutant is

    stillborn  its build fails (not counted)
    killed     a check ends FAIL, ERROR, TIMEOUT, CRASH or XPASS where the unmutated control
               run of the same mode passed (or, in stage 3, a test fails that passed unmutated)
    survived   nothing changed

The score is killed / (killed + survived), and again with the equivalent mutants left out
(the usual mutation score: no test can kill them). Each survivor is listed with its diff; one
that is not work for the catalogue is explained in :data:`EXPLAINED` (``file:line`` -> why: an
equivalent mutant, or code since rewritten), the others are work for the catalogue. ``--readme`` writes the score, the
survivors and the raw results' place into bench/README.md.

    python bench/mutate.py [--mutants 40] [--seed 1] [--world-size 2] [--json FILE] [--readme]
                           [--file PATH ...] [--keep DIR]
    python bench/mutate.py --render FILE [--readme]   # the section again from a run's results
    python bench/mutate.py --retry FILE [--readme]    # its survivors again, on the tree as it is
    python bench/mutate.py --resume FILE [--readme]   # the mutants a stopped run did not reach

The raw results are written after every mutant, so a run stopped part way still renders, with
the mutants it did not reach counted apart. ``--retry`` runs a saved run's survivors that
:data:`EXPLAINED` does not explain again once checks were added for them (each mutant found by
its line's text) and records which die: the section then shows the run's score and the score
after the retry, the survivors killed on it with their killers. ``--resume`` runs the mutants
a stopped run left pending, each found by its line's text on the tree as it is (one whose line
is gone is ``gone``, not counted), so a run of many mutants can be finished in several sittings.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from _results import environment, write_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import mutant_faults  # noqa: E402  (tests/fixtures)

#: The source folders mutated, and the files left alone (the fault build's own code, compiled
#: out of the build under test).
FOLDERS = (ROOT / "core" / "csrc", ROOT / "backends" / "mock" / "csrc")
SKIPPED = {"faults.cpp", "faults.h", "faulty_runtime.cpp", "faulty_runtime.h",
           "faulty_transport.cpp", "faulty_transport.h",
           # mockccl across hosts: the catalogue on one host never reaches it;
           # tests/engine/test_two_hosts.py, tests/mockccl/test_mockccl_hostile.py and the
           # failure tests across hosts do.
           "mockccl_net.cpp", "mockccl_net.h", "mockccl_hosts.cpp", "mockccl_hosts.h",
           "mockccl_wire.h"}

#: The areas that exercise each file (by name); the cheap first pass runs these in the default
#: mode, and a survivor of the whole catalogue runs them in the other modes. The files of ops
#: include ``ops`` (torch's OpInfo database, seconds at its quick level): the asynchronous
#: fallback's paths show only there in the asynchronous modes.
FILE_AREAS: dict[str, tuple[str, ...]] = {
    "guard.cpp": ("registration", "streams"),
    "events.cpp": ("streams",),
    "allocator.cpp": ("registration", "streams"),
    "context.cpp": ("registration", "devicemesh"),
    "generator.cpp": ("rng",),
    "random.cpp": ("rng", "registration"),
    "hooks.cpp": ("registration",),
    "register.cpp": ("registration",),
    "python.cpp": ("registration", "streams"),
    "host_tensor.cpp": ("dtensor", "registration", "ops"),
    "kernels.cpp": ("dtensor", "registration", "tp", "ops"),
    "fallback.cpp": ("dtensor", "tp", "registration", "ops", "streams"),
    "layouts.cpp": ("registration", "dtensor", "ops"),
    "autocast.cpp": ("registration", "training"),
    "rnn_cells.cpp": ("training",),
    "sync_batch_norm.cpp": ("training",),
    "backend.cpp": ("collectives", "streams"),
    "operations.cpp": ("collectives",),
    "work.cpp": ("collectives", "streams"),
    "python.cpp/c10d": ("collectives",),
    "mock_runtime.h": ("registration", "streams"),
    "mockrt.cpp": ("registration", "streams"),
    "scheduler.h": ("streams",),
    "mock_device.cpp": ("registration",),
    "binary_ops.cpp": ("dtensor", "tp", "ops"),
}
MOCKCCL_AREAS = ("collectives", "devicemesh")
#: The project's own tests of a file's behaviour beyond what the catalogue asks of a backend
#: (by the file name's start): a survivor of every catalogue stage runs them last, so a mutant
#: of mockccl's own error reporting is killed by the test of that reporting, not explained away.
FILE_TESTS: dict[str, tuple[str, ...]] = {"mockccl": ("tests/mockccl/test_mockccl_failures.py",)}
DEFAULT_AREAS = ("registration", "collectives", "dtensor", "streams", "rng")

#: The mock's modes (the fault matrix's, tests/fixtures/mutant_faults.py): a survivor is also
#: run in each beyond the default.
MODES = mutant_faults.MODES

#: Outcomes that kill a mutant (where the control passed).
KILLING = {"fail", "error", "timeout", "crash", "xpass"}

#: Survivors that are not work for the catalogue, by ``path:line`` (relative to the repository,
#: at the run's commit): why.
EXPLAINED: dict[str, str] = {
    "core/csrc/c10d/operations.cpp:372":
        "equivalent: every caller of TransportBackend::reduction had already checked its output "
        "tensor (single(), check_tensor in allreduce_coalesced and reduce_scatter_base_job); the "
        "redundant check is removed since",
    "core/csrc/runtime/register.cpp:91":
        "equivalent: a digit inside an error message's string literal; the script no longer "
        "picks sites inside string or character literals",
    "core/csrc/c10d/operations.cpp:73":
        "a real bug behind it: no check called torch.distributed.all_gather_coalesced, and the "
        "glue took its outputs transposed (a list per input, where torch and gloo take a list "
        "per rank); the function is rewritten and collectives.coalesced calls it, failing on "
        "the old code",
    "core/csrc/c10d/backend.cpp:95":
        "a real bug behind it: shutdown() (destroy_process_group) aborted the transport whenever "
        "work was in flight, so on an asynchronous device a collective issued just before "
        "destroy_process_group failed on every rank; close() is rewritten (shutdown() finishes "
        "what was issued, as ProcessGroupNCCL's; abort() aborts) and "
        "collectives.destroy_after_collective fails on the old code",
    "backends/mock/csrc/mockccl_sync.cpp:176":
        "equivalent for what a backend owes: after another rank aborted the group, each later "
        "call still raises DistBackendError naming that rank and its reason (check_aborted reads "
        "the group's shared abort record every time); only the wording differs from the "
        "remembered failure's",
    "core/csrc/aten/kernels.cpp:135":
        "equivalent: `t.set_(t)` without its shortcut sets the tensor to its own storage, offset, "
        "sizes and strides, which changes nothing (the shortcut saves the work, as ATen's "
        "set_ does)",
    "backends/mock/csrc/driver/scheduler.h:219":
        "equivalent: the entry is a local of the scheduler loop's body, so without the reset "
        "its captures (what a parked wait holds) are destroyed at the end of the iteration, "
        "under the scheduler's lock instead of just before it; none of them takes that lock",
    "core/csrc/aten/kernels.cpp:342":
        "equivalent in behaviour: without its own kernel `view` reaches the boxed fallback, "
        "which returns a view of an input as a view of the device tensor's storage "
        "(fallback.cpp), so every view still aliases its base; only slower (a boxed call per "
        "view)",
    "core/csrc/aten/host_tensor.cpp:90":
        "equivalent: an internal assertion of an invariant every caller keeps (the host image "
        "uploaded is made from that storage, never larger); without it nothing else changes",
    "backends/mock/csrc/mockccl.cpp:201":
        "equivalent: a digit inside an error message's string literal (chosen before the "
        "script stopped picking sites inside literals)",
}


@dataclass
class Mutant:
    path: str       # relative to the repository
    line: int       # 1-based
    operator: str
    before: str
    after: str
    outcome: str = "pending"
    killed_by: list[str] = field(default_factory=list)
    stage: str = ""          # where it was killed, or how far it survived
    seconds: float = 0.0
    retried: str = ""        # the commit a survivor was run again on (--retry), if it was
    resumed: str = ""        # the commit a mutant left pending ran on (--resume), if it was

    def diff(self) -> str:
        return "".join(difflib.unified_diff([self.before + "\n"], [self.after + "\n"],
                                            f"a/{self.path}:{self.line}",
                                            f"b/{self.path}:{self.line}"))


# -- choosing mutants ---------------------------------------------------------------------------

COMPARISONS = [("<=", ">"), (">=", "<"), ("==", "!="), ("!=", "=="), ("<", ">="), (">", "<=")]
#: A declaration, not a statement to drop (dropping it would only fail to build).
DECLARATION = re.compile(r"^(?:const\s+|static\s+|constexpr\s+|thread_local\s+)*"
                         r"[\w:]+(?:<[^;]*>)?[\s*&]+[\w]+\s*(?:=|\{|\(|;|\[)")
NOT_STATEMENTS = ("return", "using", "namespace", "typedef", "case ", "break", "continue", "}",
                  "default:", "template", "friend", "class ", "struct ", "enum ")


def _candidates(text: str) -> list[tuple[str, str]]:
    """Every (operator, mutated line) applicable to one line; what a string or character
    literal holds is text, not code (a digit of a message is no site)."""
    code = text.split("//")[0].rstrip()
    masked = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'',
                    lambda lit: lit.group()[0] + " " * (len(lit.group()) - 2) + lit.group()[-1],
                    code)
    stripped = code.strip()
    indent = code[:len(code) - len(stripped)]
    found = []
    if (stripped.endswith(";") and not stripped.startswith(NOT_STATEMENTS)
            and masked.count("(") == masked.count(")") and not DECLARATION.match(stripped)
            and ("(" in stripped or re.search(r"\+\+|--|[^=!<>]=[^=]", stripped))):
        found.append(("drop", indent + "/* dropped by bench/mutate.py */"))
    m = re.match(r"^(\s*)return\s+(.+);$", code)
    if m and m.group(2).strip() not in ("{}", "nullptr", "0", "false", "true"):
        found.append(("return", f"{m.group(1)}return {{}};"))
    templated = re.search(r"[\w:]<|>\s*\w*\(|template|_cast<", masked)
    for a, b in COMPARISONS:
        if a in ("<", ">") and templated:
            continue  # a template's angle brackets, not a comparison
        hit = re.search(rf"(?<=[\w)\] ]) {re.escape(a)} (?=[\w(!-])", masked)
        if hit:
            found.append(("compare", code[:hit.start()] + f" {b} " + code[hit.end():]))
            break
    hit = re.search(r"(?<![\w.'\"])(\d+)(?![\w.'\"])", masked)
    if hit and not stripped.startswith(("case ", "static_assert")):
        found.append(("offset", code[:hit.start()] + str(int(hit.group(1)) + 1) + code[hit.end():]))
    return found


def _sources(only: list[str]) -> list[Path]:
    files = sorted(p for folder in FOLDERS for p in folder.rglob("*")
                   if p.suffix in (".cpp", ".h") and p.name not in SKIPPED)
    if only:
        wanted = {(ROOT / f).resolve() for f in only}
        files = [p for p in files if p.resolve() in wanted]
        if not files:
            sys.exit(f"mutate.py: none of {only} is a source this script mutates")
    return files


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines a mutant may touch: code outside comments, the
    preprocessor and the fault build."""
    out, in_comment, faults = [], False, 0
    for number, text in enumerate(path.read_text().splitlines(), 1):
        stripped = text.strip()
        if in_comment:
            in_comment = "*/" not in stripped
            continue
        if stripped.startswith("/*"):
            in_comment = "*/" not in stripped
            continue
        if stripped.startswith("#"):
            if re.match(r"#\s*ifdef\s+ACCELKIT_FAULTS", stripped):
                faults += 1
            elif faults and re.match(r"#\s*(endif|else)", stripped):
                faults -= 1
            continue
        if faults or not stripped or stripped.startswith("//"):
            continue
        out.append((number, text))
    return out


def choose(count: int, seed: int, only: list[str]) -> list[Mutant]:
    """``count`` mutants at distinct sites, drawn from ``seed``."""
    rng = random.Random(seed)
    sites = [(path, number, text) for path in _sources(only)
             for number, text in _code_lines(path) if _candidates(text)]
    rng.shuffle(sites)
    chosen = []
    for path, number, text in sites[:count]:
        operator, after = rng.choice(_candidates(text))
        chosen.append(Mutant(str(path.relative_to(ROOT)), number, operator, text, after))
    return chosen


# -- running ------------------------------------------------------------------------------------

def _areas(path: str) -> tuple[str, ...]:
    name = Path(path).name
    if name.startswith("mockccl"):
        return MOCKCCL_AREAS
    if "/c10d/" in path and name == "python.cpp":
        return FILE_AREAS["python.cpp/c10d"]
    return FILE_AREAS.get(name, DEFAULT_AREAS)


def _env(cache: Path, mode: str) -> dict[str, str]:
    return {**os.environ, "ACCELKIT_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1",
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **MODES[mode]}


def build(cache: Path) -> tuple[bool, str]:
    """Build the library and both mock extensions as the tree now is."""
    proc = subprocess.run([sys.executable, "-c", "import accelkit.backends.mock; "
                           "from accelkit.backends.mock import mockccl; mockccl.extension()"],
                          env=_env(cache, "default"), capture_output=True, text=True,
                          timeout=3600)
    return proc.returncode == 0, proc.stderr[-3000:]


def catalogue(cache: Path, mode: str, areas: tuple[str, ...] | None, world_size: int,
              out: Path, timeout: float) -> dict[str, str]:
    """check -> outcome of one conformance run (every area when ``areas`` is None)."""
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "accelkit", "conformance", "--backend", "mock",
            "--world-size", str(world_size), "--report-dir", str(out), "--timeout", str(timeout)]
    for area in areas or ():
        argv += ["--area", area]
    subprocess.run(argv, env=_env(cache, mode), capture_output=True, text=True, timeout=7200)
    report = out / "report.json"
    if not report.exists():
        return {"(the run)": "crash"}
    return {c["key"]: c["outcome"] for c in json.loads(report.read_text())["checks"]}


def killers(run: dict[str, str], control: dict[str, str]) -> list[str]:
    """The checks that end badly where the control passed."""
    return sorted(key for key, outcome in run.items()
                  if outcome in KILLING and control.get(key, "pass") not in KILLING)


class Controls:
    """The unmutated tree's outcomes, per mode and selection, computed once each."""

    def __init__(self, cache: Path, world_size: int, work: Path, timeout: float) -> None:
        self.cache, self.world_size, self.work, self.timeout = cache, world_size, work, timeout
        self.runs: dict[tuple[str, tuple[str, ...] | None], dict[str, str]] = {}

    def get(self, mode: str, areas: tuple[str, ...] | None) -> dict[str, str]:
        key = (mode, areas)
        if key not in self.runs:
            self.runs[key] = catalogue(self.cache, mode, areas, self.world_size,
                                       self.work / "control", self.timeout)
        return self.runs[key]

    def tests(self, files: tuple[str, ...]) -> dict[str, str]:
        key = ("tests", files)
        if key not in self.runs:
            self.runs[key] = run_tests(self.cache, files, self.work / "control-tests.xml")
        return self.runs[key]


def run_tests(cache: Path, files: tuple[str, ...], junit: Path) -> dict[str, str]:
    """test node id -> "pass" or "fail" of one pytest run of ``files`` on the tree as it is."""
    junit.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={junit}", *files], cwd=ROOT, env=_env(cache, "default"),
                   capture_output=True, text=True, timeout=3600)
    if not junit.exists():
        return {"(the test run)": "crash"}
    import xml.etree.ElementTree as ET

    return {f"{case.get('classname')}::{case.get('name')}":
            "fail" if case.find("failure") is not None or case.find("error") is not None
            else "pass" for case in ET.parse(junit).iter("testcase")}


def _tests(path: str) -> tuple[str, ...]:
    name = Path(path).name
    return next((files for start, files in FILE_TESTS.items() if name.startswith(start)), ())


def run_mutant(m: Mutant, cache: Path, controls: Controls, world_size: int, work: Path,
               timeout: float) -> None:
    """Apply, build, run, restore; fills the mutant's outcome."""
    path = ROOT / m.path
    original = path.read_text()
    lines = original.splitlines(keepends=True)
    assert lines[m.line - 1].rstrip("\n") == m.before, f"{m.path}:{m.line} changed since chosen"
    lines[m.line - 1] = m.after + "\n"
    mutated = "".join(lines)
    started = time.monotonic()
    previous = signal.getsignal(signal.SIGINT)

    def control(mode: str, selection: tuple[str, ...] | None) -> dict[str, str]:
        # the control runs the unmutated tree: the original text back selects its build,
        # which the cache (keyed by the sources' content) still holds
        path.write_text(original)
        try:
            return controls.tests(selection) if mode == "tests" else controls.get(mode, selection)
        finally:
            path.write_text(mutated)

    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        path.write_text(mutated)
        ok, log = build(cache)
        if not ok:
            m.outcome, m.stage = "stillborn", log.strip().splitlines()[-1][:200] if log else "build"
            return
        areas = _areas(m.path)
        stages: list[tuple[str, tuple[str, ...] | None]] = [("default", areas), ("default", None)]
        stages += [(mode, areas) for mode in MODES if mode != "default"]
        for mode, selection in stages:
            run = catalogue(cache, mode, selection, world_size, work / "mutant", timeout)
            found = killers(run, control(mode, selection))
            if found:
                m.outcome, m.killed_by = "killed", found
                m.stage = f"{mode}: {'areas ' + ', '.join(selection) if selection else 'catalogue'}"
                return
        tests = _tests(m.path)
        if tests:
            found = killers(run_tests(cache, tests, work / "mutant-tests.xml"),
                            control("tests", tests))
            if found:
                m.outcome, m.killed_by = "killed", found
                m.stage = f"tests: {', '.join(tests)}"
                return
        m.outcome, m.stage = "survived", "every stage"
    finally:
        path.write_text(original)
        signal.signal(signal.SIGINT, previous)
        m.seconds = round(time.monotonic() - started, 1)


def markdown(mutants: list[Mutant], env: dict, seed: int, world_size: int) -> str:
    counted = [m for m in mutants if m.outcome in ("killed", "survived")]
    later = [m for m in counted if m.outcome == "killed" and m.retried]
    killed = sum(m.outcome == "killed" for m in counted)
    pending = sum(m.outcome == "pending" for m in mutants)
    resumed = [m for m in mutants if m.resumed]
    gone = sum(m.outcome == "gone" for m in mutants)
    hours = sum(m.seconds for m in mutants) / 3600

    def score(n: int) -> str:
        return f"{n} of {len(counted)} live mutants killed ({100.0 * n / max(len(counted), 1):.0f} %)"

    lines = [f"`python bench/mutate.py --mutants {len(mutants)} --seed {seed} --world-size "
             f"{world_size} --json bench/results/mutate.json --readme`, commit {env['commit']}, "
             f"torch {env['torch']}, {env['date']}, load {env['load_before'][0]:.1f} before, "
             + (f"{env['load_after'][0]:.1f} after" if "load_after" in env else "stopped part way")
             + f", {hours:.1f} h of mutants; raw results "
             "in `bench/results/mutate.json` (`--render` rewrites this section from them).",
             "",
             f"**Score: {score(killed - len(later))}**; "
             f"{sum(m.outcome == 'stillborn' for m in mutants)} stillborn (did not build)"
             + (f"; {len(resumed)} run after a stop (`--resume`) at commit "
                f"{', '.join(sorted({m.resumed for m in resumed}))}" if resumed else "")
             + (f", {gone} of them gone (their line was rewritten since)" if gone else "")
             + (f"; **{pending} of the {len(mutants)} chosen not run** (the run was stopped: "
                "the score is of those that ran)" if pending else "") + "."
             + (f" The survivors run again (`--retry`) at commit "
                f"{', '.join(sorted({m.retried for m in counted if m.retried}))}: "
                f"**{score(killed)}**." if later else ""),
             "",
             "| operator | mutants | killed | survived | stillborn |", "|---|---:|---:|---:|---:|"]
    for op in ("drop", "return", "compare", "offset"):
        mine = [m for m in mutants if m.operator == op]
        lines.append(f"| {op} | {len(mine)} | {sum(m.outcome == 'killed' for m in mine)} | "
                     f"{sum(m.outcome == 'survived' for m in mine)} | "
                     f"{sum(m.outcome == 'stillborn' for m in mine)} |")
    survivors = [m for m in mutants if m.outcome == "survived"]
    unexplained = [m for m in survivors if f"{m.path}:{m.line}" not in EXPLAINED]
    equivalent = [m for m in survivors
                  if EXPLAINED.get(f"{m.path}:{m.line}", "").startswith("equivalent")]
    by_tests = [m for m in counted if m.outcome == "killed" and m.stage.startswith("tests")]
    if counted:
        lines[2] += (f" **Mutation score with the {len(equivalent)} equivalent mutants left out "
                     f"(no check can kill them): {killed} of {len(counted) - len(equivalent)} "
                     f"({100.0 * killed / max(len(counted) - len(equivalent), 1):.0f} %)**"
                     + (f", {len(by_tests)} of the kills by the project's tests of the mock's own "
                        "behaviour (stage 3)" if by_tests else "") + ".")
    if survivors:
        lines += ["", f"Of the {len(survivors)} survivors, {len(survivors) - len(unexplained)} "
                  "are explained below (equivalent, or a bug since fixed) and "
                  f"{len(unexplained)} {'is' if len(unexplained) == 1 else 'are'} work for the "
                  "catalogue."]
    lines += ["", "Survivors:" if survivors else "No survivor.", ""]
    for m in survivors:
        why = EXPLAINED.get(f"{m.path}:{m.line}") or "not explained: work for the catalogue"
        lines += [f"- `{m.path}:{m.line}` ({m.operator}): {why}", "", "  ```diff",
                  *[f"  {d}" for d in m.diff().splitlines()], "  ```", ""]
    if later:
        lines += ["Survivors of the run killed on the retry:", ""]
    for m in later:
        lines += [f"- `{m.path}:{m.line}` ({m.operator}): killed by "
                  f"{', '.join(f'`{k}`' for k in m.killed_by)} ({m.stage})", "", "  ```diff",
                  *[f"  {d}" for d in m.diff().splitlines()], "  ```", ""]
    return "\n".join(lines).rstrip() + "\n"


def _write_readme(text: str) -> None:
    write_section(f"<!-- mutate.py: begin -->\n{text}<!-- mutate.py: end -->",
                  "<!-- mutate.py: begin -->", "<!-- mutate.py: end -->",
                  "Sampled mutation score of the C++ layer and the mock")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mutants", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120, help="per-check budget (s)")
    parser.add_argument("--file", action="append", default=[],
                        help="only this source (repeatable; relative to the repository)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--readme", action="store_true",
                        help="write the score and survivors into bench/README.md")
    parser.add_argument("--keep", type=Path, default=None,
                        help="the run's folder (builds, reports); kept afterwards")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="print (with --readme: write) the section from a run's raw results")
    parser.add_argument("--resume", type=Path, default=None, metavar="JSON",
                        help="run the mutants a stopped run left pending, on the tree as it is "
                             "now, and update the results")
    parser.add_argument("--retry", type=Path, default=None, metavar="JSON",
                        help="run a saved run's unexplained survivors again on the tree as it "
                             "is now (after checks were added for them) and update the results")
    args = parser.parse_args(argv)
    for option, saved in (("--render", args.render), ("--retry", args.retry),
                          ("--resume", args.resume)):
        if saved is not None and not saved.is_file():
            parser.error(f"{option} {saved}: no such file; give the raw results a run wrote "
                         "with --json (bench/results/mutate.json)")
    if args.render:
        raw = _load(args.render)
        _report(raw, args.readme)
        return 0
    if args.mutants < 1:
        parser.error("--mutants must be at least 1")
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *map(str, FOLDERS)], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    if dirty and not args.list:
        sys.exit(f"mutate.py: the sources have uncommitted changes; commit or stash them first "
                 f"(a mutant is written into the tree and restored from what was there):\n{dirty}")
    if args.list:
        for m in choose(args.mutants, args.seed, args.file):
            print(m.diff())
        return 0
    if args.retry:
        raw, results = _load(args.retry), args.retry
        todo = [m for m in raw["mutants"]
                if m.outcome == "survived" and f"{m.path}:{m.line}" not in EXPLAINED]
    elif args.resume:
        raw, results = _load(args.resume), args.resume
        todo = [m for m in raw["mutants"] if m.outcome == "pending"]
    else:
        raw = {**environment(), "seed": args.seed, "world_size": args.world_size,
               "mutants": choose(args.mutants, args.seed, args.file)}
        results, todo = args.json, raw["mutants"]
    work = args.keep or Path(tempfile.mkdtemp(prefix="accelkit-mutate-"))
    cache = work / "cache"
    ok, log = build(cache)
    if not ok:
        sys.exit(f"mutate.py: the unmutated tree does not build:\n{log}")
    controls = Controls(cache, raw["world_size"], work, args.timeout)
    commit = environment()["commit"]
    for i, m in enumerate(todo, 1):
        if args.retry:
            m.retried, line = commit, _find(m)
            if line is None:
                m.stage = f"its line is no longer in {m.path} at {commit}"
                continue
            trial = replace(m, line=line)
            run_mutant(trial, cache, controls, raw["world_size"], work, args.timeout)
            m.outcome, m.killed_by, m.stage = trial.outcome, trial.killed_by, trial.stage
            m.seconds += trial.seconds
        elif args.resume:
            m.resumed, line = commit, _find(m)
            if line is None:
                m.outcome, m.stage = "gone", f"its line is no longer in {m.path} at {commit}"
            else:
                trial = replace(m, line=line)
                run_mutant(trial, cache, controls, raw["world_size"], work, args.timeout)
                m.outcome, m.killed_by, m.stage, m.seconds = (trial.outcome, trial.killed_by,
                                                              trial.stage, trial.seconds)
        else:
            run_mutant(m, cache, controls, raw["world_size"], work, args.timeout)
        print(f"[{i}/{len(todo)}] {m.outcome:9} {m.path}:{m.line} {m.operator} "
              f"({m.seconds:.0f} s) {', '.join(m.killed_by[:3]) or m.stage}", flush=True)
        _save(raw, results)
    if not args.retry and not any(m.outcome == "pending" for m in raw["mutants"]):
        raw["load_after"] = os.getloadavg()
    _save(raw, results)
    _report(raw, args.readme)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _find(m: Mutant) -> int | None:
    """The line of ``m``'s text in the tree as it is now: where it was, or the one line of the
    file with the same text; None when the line is gone (or not one)."""
    lines = (ROOT / m.path).read_text().splitlines()
    if m.line <= len(lines) and lines[m.line - 1] == m.before:
        return m.line
    at = [n for n, text in enumerate(lines, 1) if text == m.before]
    return at[0] if len(at) == 1 else None


def _load(path: Path) -> dict:
    raw = json.loads(path.read_text())
    known = set(Mutant.__dataclass_fields__)
    raw["mutants"] = [Mutant(**{k: v for k, v in m.items() if k in known})
                      for m in raw["mutants"]]
    return raw


def _save(raw: dict, path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps({**raw, "mutants": [asdict(m) for m in raw["mutants"]]},
                                   indent=1))


def _report(raw: dict, readme: bool) -> None:
    text = markdown(raw["mutants"], raw, raw["seed"], raw["world_size"])
    print(text)
    if readme:
        _write_readme(text)

if __name__ == "__main__":
    sys.exit(main())
