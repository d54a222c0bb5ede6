"""The engine's pure parts, without processes: merging per-rank results, selection, exit
rules, report writers on a synthetic run, the /dev/shm sweep."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from accelkit.conformance.api import CheckDef
from accelkit.conformance.engine import loader
from accelkit.conformance.engine.options import Options
from accelkit.conformance.engine.verdict import merge, verdict
from accelkit.conformance.launchers.processes import SHM_DIR, SHM_PREFIX, sweep_shm
from accelkit.conformance.model import RunReport
from accelkit.conformance.outcomes import CheckResult, Outcome, RankResult
from accelkit.conformance.reports import files as reports
from accelkit.conformance.reports import terminal
from accelkit.core import registry


def _ranks(*statuses):
    return [RankResult(rank=i, status=s, message=f"{s} {i}" if s != "pass" else "")
            for i, s in enumerate(statuses)]


@pytest.mark.parametrize("statuses,outcome,reason", [
    (("pass", "pass"), Outcome.PASS, ""),
    (("pass", "fail"), Outcome.FAIL, "rank 1: fail 1"),
    (("fail", "error"), Outcome.ERROR, "rank 1: error 1"),
    (("skip", "fail"), Outcome.FAIL, "rank 1: fail 1"),
    (("skip", "pass"), Outcome.SKIP, "skip 0"),
    (("timeout", "error"), Outcome.TIMEOUT, "rank 0: timeout 0"),
    (("crash", "timeout", "aborted"), Outcome.CRASH, "rank 0: crash 0"),
    (("fail", "fail"), Outcome.FAIL, "rank 0: fail 0\nrank 1: fail 1"),
])
def test_merge_worst_rank_wins(statuses, outcome, reason):
    assert merge(_ranks(*statuses)) == (outcome, reason)


def _def(cid, ws=4, also_at=()):
    return CheckDef(id=cid, fn=lambda ctx: None, world_size=ws, doc="d", also_at=also_at)


def test_rank_statuses_are_one_vocabulary_whatever_the_rank_sent():
    """A rank's status read back from JSON or a pipe (a string) is the enum; reports show it
    as its word."""
    from accelkit.conformance.outcomes import RankStatus

    r = RankResult(rank=0, status="aborted")
    assert r.status is RankStatus.ABORTED and f"{r.status}" == "aborted"
    assert r.to_dict()["status"] == "aborted"
    with pytest.raises(ValueError, match="'finished' is not a valid RankStatus"):
        RankResult(rank=0, status="finished")


def test_verdict_merges_judges_rows_and_applies_the_expectation():
    """One pure function: a decided step keeps its reason; the ranks merge worst first; a wrong
    row fails a passing check unless an [ops] entry covers it (then xfail, or xpass that fails
    under strict); an xfail expectation turns the actual outcome into XFAIL or XPASS."""
    from accelkit.conformance.engine.expectations import Expectation, OpExpectation

    check = _def("ops.unary", ws=2)
    skipped = verdict(check, None, None, decided=(Outcome.SKIP, "no device"))
    assert (skipped.outcome, skipped.reason, skipped.ranks) == (Outcome.SKIP, "no device", [])
    crashed = verdict(check, _ranks("crash", "aborted"), Expectation("ops.unary", "xfail", "why"))
    assert (crashed.outcome, crashed.actual) == (Outcome.XFAIL, Outcome.CRASH)
    assert crashed.reason == "expected failure: why\nactual CRASH: rank 0: crash 0"

    def ranks(*statuses):
        return [RankResult(rank=i, status="pass", rows=[{"op": "sin", "dtype": "float32",
                                                          "status": s, "detail": "differs"}])
                for i, s in enumerate(statuses)]

    wrong = verdict(check, ranks("pass", "fail"), None)
    assert wrong.outcome is Outcome.FAIL and "1 of 2 cases differ" in wrong.reason
    covered = {"sin": OpExpectation("sin", "known")}
    assert verdict(check, ranks("pass", "fail"), None, ops=covered).outcome is Outcome.PASS
    stale = verdict(check, ranks("pass", "pass"), None, ops=covered, strict=True)
    assert stale.outcome is Outcome.FAIL and [r["status"] for r in stale.rows] == ["xpass"] * 2
    fixed = verdict(check, ranks("pass", "pass"), Expectation("ops.unary", "xfail", "why"))
    assert (fixed.outcome, fixed.actual) == (Outcome.XPASS, Outcome.PASS)


def test_select_by_area_substring_and_glob():
    checks = {c.id: c for c in [_def("mesh.one"), _def("mesh.two", 2), _def("dtensor.one"),
                                _def("collectives.all_reduce_sum"), _def("mesh.a_last")]}
    ids = lambda sel: [c.id for c in sel]  # noqa: E731
    # world size first, then area, then definition order (not alphabetical)
    assert ids(loader.select(checks)) == ["mesh.two", "collectives.all_reduce_sum",
                                          "dtensor.one", "mesh.one", "mesh.a_last"]
    assert ids(loader.select(checks, areas=["mesh"])) == ["mesh.two", "mesh.one", "mesh.a_last"]
    assert ids(loader.select(checks, patterns=["one"])) == ["dtensor.one", "mesh.one"]
    assert ids(loader.select(checks, patterns=["*.one"])) == ["dtensor.one", "mesh.one"]
    assert ids(loader.select(checks, patterns=["all_red*"])) == []  # a glob matches the whole id


def _plan(checks, world_sizes=(), expectations=None, **host):
    from accelkit.conformance.engine.plan import Host, make_plan

    return make_plan(checks, expectations or {}, Host(backend="b", **host), world_sizes)


def _expectation(check_id, status="xfail", world_size=None):
    from accelkit.conformance.engine.expectations import Expectation

    return Expectation(check_id, status, "why", world_size=world_size)


def test_plan_runs_each_check_at_every_requested_size_it_is_written_for():
    checks = [_def("a.fixed"), _def("a.scales", also_at=(2, 8)), _def("a.only8", 8)]
    keys = lambda plan: [s.key for s in plan.steps]  # noqa: E731
    assert keys(_plan(checks)) == ["a.fixed@4", "a.scales@4", "a.only8@8"]
    at2 = _plan(checks, [2])
    assert keys(at2) == ["a.scales@2"]
    assert [(c.id, c.world_sizes) for c in at2.left_out] == [("a.fixed", (4,)),
                                                             ("a.only8", (8,))]
    assert keys(_plan(checks, [8, 2])) == ["a.scales@2", "a.scales@8", "a.only8@8"]
    assert at2.steps[0].check.world_sizes == (2, 4, 8)  # run at 2, still written for all
    with pytest.raises(ValueError, match=r"'a.fixed' is written for world sizes \[4\], not 2"):
        checks[0].at(2)


def test_plan_decides_what_does_not_run_and_why_in_order():
    checks = [_def("a.one"), _def("a.two", also_at=(2,)), _def("a.three")]
    exps = {"a.one": _expectation("a.one", "skip"), "a.two@4": _expectation("a.two", world_size=4),
            "a.two": _expectation("a.two", "skip")}
    plan = _plan(checks, expectations=exps, problems={4: "4 devices needed, 2 present"})
    decided = {s.key: s.decided for s in plan.steps}
    assert decided["a.one@4"] == (Outcome.SKIP, "expected skip: why")
    assert decided["a.two@4"] == (Outcome.SKIP, "4 devices needed, 2 present; --world-size 2 "
                                                "runs it on 2 ranks")
    assert decided["a.three@4"] == (Outcome.SKIP, "4 devices needed, 2 present")
    assert plan.steps[1].expectation.key == "a.two@4"  # id@N wins over id
    unavailable = _plan(checks, unavailable="no driver")
    assert {s.decided for s in unavailable.steps} == {
        (Outcome.UNAVAILABLE, "backend 'b' cannot run here: no driver")}
    missing = _plan(checks, missing=lambda requires: "needs an accelerator")
    assert {s.decided for s in missing.steps} == {(Outcome.SKIP, "needs an accelerator")}
    assert {s.decided for s in _plan(checks).steps} == {None}


def test_plan_for_a_launch_skips_checks_written_for_another_size():
    checks = [_def("a.fixed"), _def("a.scales", also_at=(2,))]
    plan = _plan(checks, launch=2, problems={2: None})
    assert [(s.key, s.decided and s.decided[0]) for s in plan.steps] == [
        ("a.scales@2", None), ("a.fixed@4", Outcome.SKIP)]
    assert plan.steps[1].decided[1].startswith("written for 4 ranks; this launch has 2")


def _declare(tmp_path, source: str, name: str = "declared") -> dict:
    """Import ``source`` as the check module ``<name>.py`` (through the loader); its checks."""
    path = tmp_path / f"{name}.py"
    path.write_text("from accelkit.conformance.api import Defaults, check\n\n" + source)
    checks = loader.load([str(path)], builtin=False)
    return {cid: c for cid, c in checks.items() if c.module.endswith("." + name)}


DECLARED = '''
CHECK_DEFAULTS = Defaults(also_at=(2, 8), requires=("accelerator",))


@check
def plain(ctx):
    """Takes every default (torch.distributed)."""


@check(world_size=8, also_at=(), requires=(), timeout=9)
def overridden(ctx):
    """Replaces each default (torch.distributed)."""
'''


def test_check_id_comes_from_module_and_function_and_defaults_from_the_module(tmp_path):
    checks = _declare(tmp_path, DECLARED)
    plain, overridden = checks["declared.plain"], checks["declared.overridden"]
    assert (plain.world_size, plain.also_at, plain.requires, plain.timeout) == (
        4, (2, 8), ("accelerator",), None)
    assert (overridden.world_size, overridden.also_at, overridden.requires,
            overridden.timeout) == (8, (), (), 9)
    named = _declare(tmp_path, "CHECK_DEFAULTS = Defaults(area='elsewhere')\n\n\n@check\n"
                               "def one(ctx):\n    'Area from the module (torch).'\n",
                     name="area_override")
    assert list(named) == ["elsewhere.one"]


def test_check_declaration_errors(tmp_path):
    from accelkit.conformance.api import check

    with pytest.raises(TypeError, match=r"@check\('x.bad'\): a check's id is <module name>"):
        check("x.bad")
    for i, kwargs in enumerate(("world_size=0", "also_at=(0,)", "world_size=4, also_at=(4,)")):
        with pytest.raises(loader.CheckLoadError, match="world sizes must be >= 1"):
            _declare(tmp_path, f"@check({kwargs})\ndef bad(ctx):\n    'x (torch).'\n",
                     name=f"bad{i}")
    with pytest.raises(loader.CheckLoadError, match="set it before the first check"):
        _declare(tmp_path, "@check\ndef early(ctx):\n    'x (torch).'\n\n\n"
                           "CHECK_DEFAULTS = Defaults(also_at=(2,))\n", name="late")
    with pytest.raises(loader.CheckLoadError, match="needs a docstring"):
        _declare(tmp_path, "@check\ndef nodoc(ctx):\n    pass\n", name="nodoc")


def test_import_module_errors_name_the_module(tmp_path):
    with pytest.raises(loader.CheckLoadError, match="check module file 'nope.py' does not exist"):
        loader.import_module("nope.py")
    bad = tmp_path / "bad_checks.py"
    bad.write_text("raise ValueError('broken on purpose')\n")
    with pytest.raises(loader.CheckLoadError,
                       match=r"cannot import check module '.*bad_checks.py': ValueError: broken"):
        loader.import_module(str(bad))


def _report(strict=False, **extra):
    results = [
        CheckResult("a.ok", 4, Outcome.PASS, duration_s=0.1, ranks=_ranks("pass", "pass")),
        CheckResult("a.fixed", 4, Outcome.XPASS, "passed, but expected to fail: x",
                    expectation={"status": "xfail", "reason": "x", "link": None, "torch": None},
                    actual=Outcome.PASS),
        CheckResult("b.skip", 2, Outcome.SKIP, "no accelerator"),
    ]
    return RunReport(spec=registry.get("cpu"), options=Options(strict=strict),
                     results=results, versions={"torch": "2.13.0"}, **extra)


def test_xpass_fails_only_under_strict():
    assert _report().ok()
    assert [r.id for r in _report(strict=True).failed()] == ["a.fixed"]
    assert not _report(strict=True).ok()


def test_aborted_run_is_not_ok():
    assert not _report(aborted="TIMEOUT in a.ok").ok()


def test_junit_strict_xpass_is_a_failure():
    root = reports.to_junit(_report(strict=True)).getroot()
    suite = root.find("testsuite[@name='a']")
    assert suite.attrib["failures"] == "1"
    case = suite.find("testcase[@name='fixed@4']")
    assert case.find("failure").attrib["type"] == "XPASS"
    loose = reports.to_junit(_report()).getroot().find("testsuite[@name='a']")
    assert loose.attrib["failures"] == "0"


def test_written_reports_parse(tmp_path):
    paths = reports.write(_report(), tmp_path / "r")
    assert [p.name for p in paths] == ["report.json", "junit.xml", "report.md"]
    ET.parse(paths[1])
    assert "**Result: ✅ conformant" in paths[2].read_text()


def test_report_md_opens_with_what_did_not_pass():
    """The first thing report.md says, under its title: each check that fails the run and why."""
    bad = _report(strict=True)
    bad.results.append(CheckResult("b.broken", 2, Outcome.CRASH, "rank 1: exit code 3\nlog"))
    md = reports.to_markdown(bad)
    assert md.startswith("# PyTorch distributed conformance: `cpu`\n\n**Did not pass (2):**\n\n"
                         "- `a.fixed@4` ❔ unexpected pass: passed, but expected to fail: x\n"
                         "- `b.broken@2` 💥 CRASH: rank 1: exit code 3\n"), md
    assert reports.to_markdown(_report()).startswith(
        "# PyTorch distributed conformance: `cpu`\n\n**Did not pass:** nothing that ran "
        "failed.\n")


def test_reports_name_every_host_with_its_ranks():
    """A launch over two hosts: report.json maps each hostname to its ranks, report.md, the
    JUnit properties and the terminal summary name both with their ranks. One host (pool
    mode): report.json gives it every rank of the largest world size that ran, the others name
    it alone and the summary has no hosts line."""
    report = _report(host="node-a", hosts={"node-b": [3, 2], "node-a": [0, 1]})
    data = reports.to_json(report)
    assert data["host"] == "node-a"
    assert list(data["hosts"].items()) == [("node-a", [0, 1]), ("node-b", [2, 3])]
    assert "| hosts | `node-a` (ranks 0-1), `node-b` (ranks 2-3) |" in reports.to_markdown(report)
    assert "\n2 hosts: node-a (ranks 0-1), node-b (ranks 2-3)\n" in terminal.summary(report)
    props = {p.attrib["name"]: p.attrib["value"]
             for p in reports.to_junit(report).getroot().iter("property")}
    assert props["hosts"] == "node-a (ranks 0-1), node-b (ranks 2-3)"

    pool = _report(host="node-a")
    assert reports.to_json(pool)["hosts"] == {"node-a": [0, 1, 2, 3]}
    assert "| host | `node-a` |" in reports.to_markdown(pool)
    assert "hosts" not in terminal.summary(pool)
    assert reports.ranks_text([5, 0, 1, 2, 7, 8]) == "ranks 0-2, 5, 7-8"
    assert reports.ranks_text([3]) == "rank 3"


def test_summary_for_unavailable_backend():
    report = _report(unavailable="no CUDA device (torch.cuda.is_available() is False)")
    text = terminal.summary(report)
    assert "UNAVAILABLE: backend 'cpu' cannot run here: no CUDA device" in text
    assert text.endswith("NOT RUN: backend unavailable (exit 0; --require-available makes it "
                         "exit 3)")


def test_sweep_shm_removes_only_segments_of_the_given_pids():
    """A segment is its creator's (``accelkit_mockccl_<pid>_<n>_<random>``): one whose counter
    or random part happens to equal a killed pid belongs to another, live, process and stays."""
    fake_pid = 4_000_000_000  # above any real pid
    ours = SHM_DIR / f"{SHM_PREFIX}{fake_pid}_0_5f3a"
    others = [SHM_DIR / f"{SHM_PREFIX}{fake_pid + 1}_0_5f3a",
              SHM_DIR / f"{SHM_PREFIX}{fake_pid + 1}_{fake_pid}_5f3a",
              SHM_DIR / f"{SHM_PREFIX}{fake_pid + 1}_2_{fake_pid}"]
    for p in (ours, *others):
        p.write_bytes(b"x")
    try:
        assert sweep_shm([fake_pid]) == [ours.name]
        assert not ours.exists() and all(p.exists() for p in others)
    finally:
        for p in (ours, *others):
            if p.exists():
                os.unlink(p)


def test_sweep_shm_leaves_a_segment_it_may_not_remove(monkeypatch):
    """Another user's segment (unlink refused: /dev/shm is sticky) stays, and the sweep goes on
    with the rest instead of raising out of kill_group."""
    fake_pid = 4_000_000_002
    theirs = SHM_DIR / f"{SHM_PREFIX}{fake_pid}_0_aa"
    ours = SHM_DIR / f"{SHM_PREFIX}{fake_pid}_1_bb"
    for p in (theirs, ours):
        p.write_bytes(b"x")
    unlink = Path.unlink

    def refuse_theirs(path, *args, **kwargs):
        if path.name == theirs.name:
            raise PermissionError(1, "Operation not permitted", str(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", refuse_theirs)
    try:
        assert sweep_shm([fake_pid]) == [ours.name]
    finally:
        monkeypatch.undo()
        for p in (theirs, ours):
            p.unlink(missing_ok=True)


def test_kill_group_stops_a_child_and_what_it_started_and_sweeps_their_segments():
    """A spawned process leads its own group: kill_group stops it and the process it started
    (which a kill of the child alone would orphan), reaps it, and removes a mockccl segment
    named after the grandchild; exit_text names the signal."""
    import subprocess
    import sys
    import time

    from accelkit.conformance.launchers.processes import exit_text, group_pids, kill_group, spawn

    script = ("import subprocess, sys, time; "
              "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print(g.pid, flush=True); time.sleep(60)")
    child = spawn([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    segment = SHM_DIR / f"{SHM_PREFIX}{grandchild}_0_test"
    segment.write_bytes(b"x")
    try:
        assert set(group_pids(child.pid)) >= {child.pid, grandchild}
        assert kill_group(child.pid, [child]) == [segment.name]
        assert exit_text(child.returncode) == "SIGKILL" and not segment.exists()
        deadline = time.monotonic() + 5
        while grandchild in group_pids(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # the grandchild, now a zombie of init, is reaped by init
        assert grandchild not in group_pids(child.pid)
    finally:
        child.stdout.close()
        segment.unlink(missing_ok=True)
    assert exit_text(3) == "exit code 3" and exit_text(None) == "still running"


@pytest.mark.parametrize("failure", [RuntimeError("nvcc: not found"),
                                     SystemExit("build tool gave up")])
def test_a_failed_prepare_errors_every_check_once_and_is_not_retried(failure):
    """spec.prepare() (the backend's compile) fails: every check is ERROR with its message,
    the compile is not retried per check, and a SystemExit from a build tool does not end
    the run."""
    from dataclasses import replace

    from accelkit.conformance.engine.runner import Runner

    calls = []

    def prepare():
        calls.append(1)
        raise failure

    spec = replace(registry.get("cpu"), name="prepfail", prepare=prepare)
    plan = _plan([_def("a.one"), _def("a.two"), _def("a.three", 2)])
    report = Runner(spec, Options()).run(plan)
    assert [r.outcome for r in report.results] == [Outcome.ERROR] * 3
    for r in report.results:
        assert f"prepare() failed: {type(failure).__name__}: {failure}" in r.reason, r.reason
    assert len(calls) == 1
    assert report.pool_starts == []


def test_two_check_files_with_the_same_name_both_load(tmp_path):
    """--checks-module a/vendor_checks.py --checks-module b/vendor_checks.py: both files'
    checks are loaded (each file is its own module), none is dropped silently."""
    from accelkit.conformance.api import CHECKS

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "vendor_checks.py").write_text(
            "from accelkit.conformance.api import check\n\n\n"
            "@check(world_size=2)\n"
            f"def from_{folder}(ctx):\n"
            f"    '''A check defined in folder {folder} (torch.distributed).'''\n")
    for folder in ("a", "b"):
        loader.import_module(str(tmp_path / folder / "vendor_checks.py"))
    assert {"vendor_checks.from_a", "vendor_checks.from_b"} <= set(CHECKS)


def test_one_option_table_for_every_entry_point():
    """The CLI, torchrun and the pytest plugin read one table: the same option gets the same
    default everywhere (the plugin's timeout is the CLI's), and every Options field is an
    option."""
    import argparse
    from dataclasses import fields

    from accelkit.conformance.engine import options

    flags = [o.flag for o in options.OPTIONS]
    assert len(flags) == len(set(flags))
    assert {o.dest for o in options.OPTIONS} == {f.name for f in fields(options.Options)}
    parser = argparse.ArgumentParser()
    options.add_to_parser(parser, options.CLI)
    cli = options.from_namespace(parser.parse_args([]), options.CLI)
    pytest_values = {"backend": "mock"}
    plugin = options.from_values(options.PYTEST, lambda dest: pytest_values.get(dest))
    assert cli == plugin == options.Options()
    assert cli.timeout_s == options.DEFAULT_TIMEOUT_S
    parsed = options.from_namespace(parser.parse_args(
        ["--timeout", "5", "--world-size", "2", "--world-size", "8", "-k", "a", "--strict"]),
        options.CLI)
    assert (parsed.timeout_s, parsed.world_sizes, parsed.patterns, parsed.strict) == (
        5.0, [2, 8], ["a"], True)
    torchrun = argparse.ArgumentParser()
    options.add_to_parser(torchrun, options.TORCHRUN)
    with pytest.raises(SystemExit):  # a launch has its own world size
        torchrun.parse_args(["--world-size", "2"])


def test_the_segment_prefix_is_the_one_mockccl_creates():
    """The engine sweeps what mockccl creates: its ``kSegmentPrefix`` is ``/`` + SHM_PREFIX."""
    source = (Path(__file__).resolve().parents[2] / "backends" / "mock" / "csrc" /
              "mockccl.cpp").read_text()
    assert f'constexpr const char* kSegmentPrefix = "/{SHM_PREFIX}";' in source


def test_resolve_leaves_the_options_it_was_given_and_reads_the_file_once(monkeypatch):
    """The session's options name the expectations file used (the backend's own here); the
    caller's stay as they were; the file is read once for its checks and once for its [ops]."""
    from accelkit.conformance.engine import expectations as expectations_mod
    from accelkit.conformance.engine.session import resolve

    reads = []
    real = expectations_mod._read
    monkeypatch.setattr(expectations_mod, "_read", lambda path: reads.append(path) or real(path))
    given = Options(backend="cpu", areas=["rng"])
    session = resolve(given)
    assert given.expectations is None
    assert session.options.expectations == str(registry.get("cpu").expectations)
    assert len(reads) == 2 and session.ops == {}


def _capability_rows(**statuses):
    """Rows of ``collectives.capability_levels``: every op of the guide passing, but for the
    ``statuses`` given (op or capability -> status)."""
    from accelkit.conformance.checks.collectives import CAPABILITY_BITS, EXTENDED_OPS, MINIMAL_OPS

    rows = [{"capability": op, "kind": kind, "status": statuses.get(op, "pass"), "detail": ""}
            for kind, ops in (("minimal", MINIMAL_OPS), ("extended", EXTENDED_OPS)) for op in ops]
    return rows + [{"capability": bit, "kind": "capability", "status": statuses.get(bit, "skip"),
                    "detail": "not advertised"} for bit, _ in CAPABILITY_BITS]


@pytest.mark.parametrize("statuses,level", [
    ({}, "extended"),
    ({"Splitting": "fail"}, "extended"),  # the bits are reported beside the level
    ({"recvAnysource": "error"}, "minimal"),
    ({"gather": "skip"}, "minimal"),
    ({"barrier": "fail"}, "below minimal"),
])
def test_the_guide_level_is_the_highest_set_whose_every_op_passed(statuses, level):
    assert reports.guide_level(_capability_rows(**statuses)) == level


def test_report_md_shows_the_guide_level_and_every_op_and_capability_not_in_the_op_table():
    """report.md has a capability table with the level reached and a row per op and bit; the
    ops area's op table (rows with an ``op``) leaves the capability rows out."""
    report = _report()
    ranks = [RankResult(rank=0, status="fail", rows=_capability_rows(Splitting="fail", send="error")),
             RankResult(rank=1, status="fail")]  # rank 0 reports the table
    result = CheckResult("collectives.capability_levels", 2, Outcome.FAIL, "Splitting: wrong",
                         ranks=ranks)
    report.results.append(result)
    md = reports.to_markdown(report)
    assert "## collective capabilities (`collectives.capability_levels@2`)" in md
    assert "reached: **minimal**." in md
    assert "| `Splitting` | capability | fail |" in md and "| `send` | extended | error |" in md
    assert "## op table" not in md
