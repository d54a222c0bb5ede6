"""bench/mutate.py chooses the same mutants from the same seed, each a one-line change of a
source it is meant to mutate, and renders its score from a run's raw results saying how many
ran. (Building and running mutants is the benchmark's job: hours, not a unit test.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "mutate.py"
sys.path.insert(0, str(SCRIPT.parent))

import mutate  # noqa: E402  (bench/)


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                          timeout=120)


def test_the_same_seed_chooses_the_same_mutants_and_another_seed_others():
    first, again, other = (mutate.choose(40, seed, []) for seed in (1, 1, 2))
    assert [m.diff() for m in first] == [m.diff() for m in again]
    assert [m.diff() for m in first] != [m.diff() for m in other]
    assert len({(m.path, m.line) for m in first}) == 40, "two mutants at one site"


def test_every_mutant_changes_one_line_of_a_mutated_source_outside_the_fault_build():
    mutants = mutate.choose(200, 3, [])
    assert {m.operator for m in mutants} == {"drop", "return", "compare", "offset"}
    for m in mutants:
        path = ROOT / m.path
        assert path.parent.is_relative_to(ROOT / "core" / "csrc") or \
            path.parent.is_relative_to(ROOT / "backends" / "mock" / "csrc"), m.path
        assert path.name not in mutate.SKIPPED, m.path
        assert path.read_text().splitlines()[m.line - 1] == m.before
        assert m.after != m.before and "\n" not in m.after
        assert "ACCELKIT_FAULT" not in m.before


def test_render_counts_only_mutants_that_ran_and_lists_survivors_with_their_diff(tmp_path):
    chosen = mutate.choose(5, 1, [])
    outcomes = [("killed", ["collectives.all_reduce_sum"]), ("survived", []),
                ("stillborn", []), ("pending", []), ("killed", ["rng.seed_width"])]
    for m, (outcome, by) in zip(chosen, outcomes, strict=True):
        m.outcome, m.killed_by, m.seconds = outcome, by, 90.0
    chosen[4].retried, chosen[4].stage = "def5678", "default: areas rng"
    raw = {"commit": "abc1234", "torch": "2.13.0+cpu", "date": "2026-12-03 14:00 UTC",
           "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 2.0, 2.0], "seed": 1,
           "world_size": 2, "mutants": [m.__dict__ for m in chosen]}
    results = tmp_path / "mutate.json"
    results.write_text(json.dumps(raw))
    proc = _run("--render", str(results))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "**Score: 1 of 3 live mutants killed (33 %)**; 1 stillborn" in out
    assert "**1 of the 5 chosen not run**" in out
    assert ("The survivors run again (`--retry`) at commit def5678: **2 of 3 live mutants "
            "killed (67 %)**.") in out
    survivors, retried = out.split("Survivors:")[1].split("killed on the retry")
    assert f"`{chosen[1].path}:{chosen[1].line}`" in survivors
    assert f"-{chosen[1].before}" in survivors and f"+{chosen[1].after}" in survivors
    assert f"`{chosen[4].path}:{chosen[4].line}` ({chosen[4].operator}): killed by " \
           "`rng.seed_width` (default: areas rng)" in retried
    assert re.search(r"commit abc1234, torch 2\.13\.0\+cpu", out)


def test_bad_options_are_refused_naming_the_option():
    proc = _run("--mutants", "0")
    assert proc.returncode == 2 and "--mutants must be at least 1" in proc.stderr
    proc = _run("--list", "--file", "src/accelkit/cli.py")
    assert proc.returncode == 1
    assert "none of ['src/accelkit/cli.py'] is a source this script mutates" in proc.stderr
    for option in ("--render", "--retry", "--resume"):
        proc = _run(option, "no-such-results.json")
        assert proc.returncode == 2 and f"{option} no-such-results.json: no such file; give the " \
            "raw results a run wrote with --json" in proc.stderr, proc.stderr


def test_what_a_string_literal_holds_is_no_site():
    assert mutate._candidates('      "AUTOLOAD=0 stops torch from loading it (a < b)");') == []
    assert mutate._candidates('  if (n < 3) fail("n < 3 of 4", n);') == [
        ("drop", "  /* dropped by bench/mutate.py */"),
        ("compare", '  if (n >= 3) fail("n < 3 of 4", n);'),
        ("offset", '  if (n < 4) fail("n < 3 of 4", n);')]


def test_the_control_runs_the_unmutated_tree_and_the_file_is_restored(monkeypatch, tmp_path):
    """A check that fails with the mutant in the tree kills it only where the control, run with
    the original text back in place, passed; the file ends as it began."""
    source = tmp_path / "core" / "csrc" / "x.cpp"
    source.parent.mkdir(parents=True)
    source.write_text("int f() {\n  g();\n  return 1;\n}\n")
    m = mutate.Mutant("core/csrc/x.cpp", 2, "drop", "  g();", "  /* dropped by bench/mutate.py */")
    seen = []

    def catalogue(cache, mode, areas, world_size, out, timeout):
        mutated = source.read_text().splitlines()[1] == m.after
        seen.append((out.name, mode, mutated))
        return {"registration.x@2": "fail" if mutated else "pass"}

    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    monkeypatch.setattr(mutate, "build", lambda cache: (True, ""))
    monkeypatch.setattr(mutate, "catalogue", catalogue)
    mutate.run_mutant(m, tmp_path, mutate.Controls(tmp_path, 2, tmp_path, 10), 2, tmp_path, 10)
    assert (m.outcome, m.killed_by) == ("killed", ["registration.x@2"])
    assert seen == [("mutant", "default", True), ("control", "default", False)]
    assert source.read_text() == "int f() {\n  g();\n  return 1;\n}\n"


def test_a_survivor_of_the_catalogue_meets_its_files_own_tests_last(monkeypatch, tmp_path):
    """A mockccl mutant that survives every catalogue stage runs the tests of FILE_TESTS (a real
    pytest run: a test that fails with the mutant in the tree and passed without it kills it);
    a mutant of a file without such tests survives without them."""
    source = tmp_path / "backends" / "mock" / "csrc" / "mockccl_x.cpp"
    source.parent.mkdir(parents=True)
    source.write_text("int f() {\n  g();\n}\n")
    test = tmp_path / "test_x.py"
    test.write_text("from pathlib import Path\n\n\n"
                    "def test_kept():\n"
                    f"    assert 'g();' in Path({str(source)!r}).read_text()\n\n\n"
                    "def test_always():\n    pass\n")
    m = mutate.Mutant(str(source.relative_to(tmp_path)), 2, "drop", "  g();",
                      "  /* dropped by bench/mutate.py */")
    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    monkeypatch.setattr(mutate, "FILE_TESTS", {"mockccl": (str(test),)})
    monkeypatch.setattr(mutate, "build", lambda cache: (True, ""))
    monkeypatch.setattr(mutate, "catalogue", lambda *args: {"collectives.x@2": "pass"})
    mutate.run_mutant(m, tmp_path, mutate.Controls(tmp_path, 2, tmp_path, 10), 2, tmp_path, 10)
    assert m.outcome == "killed" and m.stage == f"tests: {test}", (m.outcome, m.stage)
    assert m.killed_by == ["test_x::test_kept"]
    other = mutate.Mutant("core/csrc/x.cpp", 2, "drop", "  g();", "  /* dropped */")
    (tmp_path / "core" / "csrc").mkdir(parents=True)
    (tmp_path / "core" / "csrc" / "x.cpp").write_text("int f() {\n  g();\n}\n")
    mutate.run_mutant(other, tmp_path, mutate.Controls(tmp_path, 2, tmp_path, 10), 2, tmp_path,
                      10)
    assert (other.outcome, other.stage) == ("survived", "every stage")


def test_resume_runs_the_pending_mutants_where_their_lines_are_now(monkeypatch, tmp_path):
    """A stopped run's pending mutants run on the tree as it is, each found by its line's text
    (one line lower after an edit); one whose line was rewritten is gone, not counted; what ran
    before keeps its outcome."""
    source = tmp_path / "core" / "csrc" / "x.cpp"
    source.parent.mkdir(parents=True)
    source.write_text("int f() {\n  h();\n  g();\n  return 1;\n}\n")
    ran = mutate.Mutant("core/csrc/x.cpp", 4, "return", "  return 1;", "  return {};",
                        outcome="survived", seconds=5.0)
    moved = mutate.Mutant("core/csrc/x.cpp", 2, "drop", "  g();", "  /* dropped by bench/mutate.py */")
    rewritten = mutate.Mutant("core/csrc/x.cpp", 1, "offset", "int f(int a = 0) {",
                              "int f(int a = 1) {")
    raw = {"commit": "abc1234", "torch": "2.13.0+cpu", "date": "2026-12-03 14:00 UTC",
           "load_before": [1.0, 1.0, 1.0], "seed": 1, "world_size": 2,
           "mutants": [ran.__dict__, moved.__dict__, rewritten.__dict__]}
    results = tmp_path / "mutate.json"
    results.write_text(json.dumps(raw))

    def catalogue(cache, mode, areas, world_size, out, timeout):
        return {"registration.x@2": "fail" if "g();" not in source.read_text() else "pass"}

    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    monkeypatch.setattr(mutate, "environment", lambda: {"commit": "def5678"})
    monkeypatch.setattr(mutate, "build", lambda cache: (True, ""))
    monkeypatch.setattr(mutate, "catalogue", catalogue)
    assert mutate.main(["--resume", str(results), "--keep", str(tmp_path / "work")]) == 0
    after = {m["before"]: m for m in json.loads(results.read_text())["mutants"]}
    assert (after["  return 1;"]["outcome"], after["  return 1;"]["resumed"]) == ("survived", "")
    assert after["  g();"]["outcome"] == "killed" and after["  g();"]["resumed"] == "def5678"
    assert after["  g();"]["killed_by"] == ["registration.x@2"]
    assert after["int f(int a = 0) {"]["outcome"] == "gone"
    assert "load_after" in json.loads(results.read_text())
    assert source.read_text() == "int f() {\n  h();\n  g();\n  return 1;\n}\n"
    out = mutate.markdown(mutate._load(results)["mutants"], raw, 1, 2)
    assert "**Score: 1 of 2 live mutants killed (50 %)**; 0 stillborn (did not build); 2 run " \
           "after a stop (`--resume`) at commit def5678, 1 of them gone" in out
