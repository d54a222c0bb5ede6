"""``accelkit upstream``: PyTorch's own distributed tests on a backend.

PyTorch's test files are not in the wheel, so the end-to-end tests run accelkit's own fixture
files written in their style (``tests/fixtures/upstream``) in three runs of the command:
mock with the cpu baseline (every fixture passes; the report, the comparison and the
process-group proof are checked), mock without any adaptation (each fixture fails or skips
for the gap its adaptation closes), and the FSDP fixture without fsdp-rank-device alone. The
rest are unit tests of the parts (expectations, file selection, adaptations' refusal,
comparison, outcome parsing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from accelkit.conformance.engine.expectations import (
    ExpectationsError,
    load,
    load_upstream,
)
from accelkit.conformance.upstream import adaptations, compare, groups, plugin, selection
from support import TESTS

from accelkit.cli import main

FIXTURES = TESTS / "fixtures" / "upstream"
HARNESS = "distributed/test_harness_fixture.py"
DTENSOR = "distributed/tensor/test_dtensor_fixture.py"
FSDP = "distributed/_composable/fsdp/test_fsdp_fixture.py"


def _upstream(report_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop("PYTORCH_TESTING_DEVICE_ONLY_FOR", None)
    return subprocess.run([sys.executable, "-m", "accelkit", "upstream", "--tests",
                           str(FIXTURES), "--report-dir", str(report_dir), *args],
                          env=env, capture_output=True, text=True, timeout=900)


def _report(path: Path) -> dict:
    return json.loads((path / "report.json").read_text())


def _by_id(report: dict) -> dict[str, dict]:
    return {t["nodeid"]: t for t in report["tests"]}


@pytest.fixture(scope="module")
def mock_vs_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("upstream_mock")
    proc = _upstream(out, "--backend", "mock", "--baseline", "cpu",
                     "--expectations", str(FIXTURES / "expectations.toml"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc, out


@pytest.fixture(scope="module")
def mock_unadapted(tmp_path_factory):
    out = tmp_path_factory.mktemp("upstream_unadapted")
    proc = _upstream(out, "--backend", "mock", "--no-adapt", "all", "--expectations",
                     str(FIXTURES / "expectations_without_adaptations.toml"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return _by_id(_report(out))


# --- end to end on the fixtures ---------------------------------------------------------

def test_fixtures_pass_on_mock_and_on_cpu(mock_vs_cpu):
    _, out = mock_vs_cpu
    outcomes = {k: t["outcome"] for k, t in _by_id(_report(out)).items()}
    assert outcomes == {
        f"{HARNESS}::SkipIfLtXGpuTest::test_all_reduce_on_two_devices": "pass",
        f"{HARNESS}::DeviceTypeTestMOCK::test_all_reduce_mock": "pass",
        f"{HARNESS}::ContinuousTest::test_all_reduce": "pass",
        f"{HARNESS}::ContinuousTest::test_all_gather": "xpass",   # stale xfail expectation
        f"{DTENSOR}::DTensorFixtureTest::test_shard_redistribute_random": "pass",
        f"{DTENSOR}::DTensorFixtureTestWithLocalTensor::test_shard_redistribute_random": "pass",
        f"{DTENSOR}::FakeProcessGroupTest::test_device_mesh_on_fake_group": "pass",
        f"{DTENSOR}::DTensorOpFixtureTest::test_shard_and_gather_on_threads": "skip",
        f"{FSDP}::FSDPFixtureTest::test_fully_shard_gradients": "pass",
    }
    baseline = {k: (t["outcome"], t["reason"]) for k, t in
                _by_id(_report(out / "baseline")).items()}
    # cpu has no accelerator: the harness skips what needs GPUs, runs the rest on gloo
    assert baseline[f"{HARNESS}::SkipIfLtXGpuTest::test_all_reduce_on_two_devices"] == (
        "skip", "Need at least 2 CUDA devices")
    assert baseline[f"{FSDP}::FSDPFixtureTest::test_fully_shard_gradients"][0] == "skip"
    assert {k: o for k, (o, _) in baseline.items() if o != "skip"} == {
        f"{HARNESS}::DeviceTypeTestCPU::test_all_reduce_cpu": "pass",
        f"{HARNESS}::ContinuousTest::test_all_reduce": "pass",
        f"{HARNESS}::ContinuousTest::test_all_gather": "pass",
        f"{DTENSOR}::DTensorFixtureTest::test_shard_redistribute_random": "pass",
        f"{DTENSOR}::DTensorFixtureTestWithLocalTensor::test_shard_redistribute_random": "pass",
        f"{DTENSOR}::FakeProcessGroupTest::test_device_mesh_on_fake_group": "pass",
        f"{DTENSOR}::DTensorOpFixtureTest::test_shard_and_gather_on_threads": "pass",
    }


def test_every_multiprocess_test_ran_on_mockccl_with_one_device_per_rank(mock_vs_cpu):
    _, out = mock_vs_cpu
    tests = _by_id(_report(out))
    for node in (f"{HARNESS}::SkipIfLtXGpuTest::test_all_reduce_on_two_devices",
                 f"{HARNESS}::DeviceTypeTestMOCK::test_all_reduce_mock",
                 f"{HARNESS}::ContinuousTest::test_all_reduce",
                 f"{DTENSOR}::DTensorFixtureTest::test_shard_redistribute_random",
                 f"{FSDP}::FSDPFixtureTest::test_fully_shard_gradients"):
        test = tests[node]
        assert {g["backend"] for g in test["groups"]} == {"mock:mockccl"}, node
        assert sum(g["ranks"] for g in test["groups"] if g["size"] == 2) >= 2, node
        assert test["devices"] == ["mock:0", "mock:1"], node
        assert test["flag"] is None, node


def test_simulated_groups_are_flagged_not_failed(mock_vs_cpu):
    proc, out = mock_vs_cpu
    report = _report(out)
    flagged = {f["nodeid"]: f["kind"] for f in report["groups"]["flagged"]}
    assert flagged == {
        f"{DTENSOR}::DTensorFixtureTestWithLocalTensor::test_shard_redistribute_random":
            "simulated",
        f"{DTENSOR}::FakeProcessGroupTest::test_device_mesh_on_fake_group": "simulated",
    }
    assert "2 test(s) ran only on simulated groups" in proc.stdout
    baseline = _report(out / "baseline")
    assert "cpu:gloo,cuda:gloo" in baseline["groups"]["by_backend"]
    assert {f["kind"] for f in baseline["groups"]["flagged"]} <= {"simulated"}


def test_expectations_are_applied_at_collection_and_unmatched_reported(mock_vs_cpu):
    proc, out = mock_vs_cpu
    report = _report(out)
    tests = _by_id(report)
    stale = tests[f"{HARNESS}::ContinuousTest::test_all_gather"]
    assert stale["expectation"]["category"] == "backend-bug"
    skipped = tests[f"{DTENSOR}::DTensorOpFixtureTest::test_shard_and_gather_on_threads"]
    assert skipped["reason"].startswith("expected skip: [torch-limitation]")
    assert report["expectations"]["unmatched"] == [f"{HARNESS}::NoSuchTest::*"]
    assert "expectation pattern matched no test: 'distributed/test_harness_fixture.py::" \
           "NoSuchTest::*'" in proc.stdout


def test_comparison_with_the_cpu_baseline(mock_vs_cpu):
    _, out = mock_vs_cpu
    comp = _report(out)["comparison"]
    assert comp["against"]["backend"] == "cpu"
    assert comp["regressions"] == [] and comp["only_here"] == [] and comp["only_there"] == []
    assert comp["matched"] == 9  # DeviceTypeTestMOCK..._mock matched DeviceTypeTestCPU..._cpu
    assert [e["test"] for e in comp["skipped_here"]] == [
        f"{DTENSOR}::DTensorOpFixtureTest::test_shard_and_gather_on_threads"]


def test_report_files(mock_vs_cpu):
    _, out = mock_vs_cpu
    report = _report(out)
    assert report["schema"] == "accelkit.upstream/1"
    files = {f["path"]: f for f in report["files"]}
    assert set(files) == {HARNESS, DTENSOR, FSDP}
    assert files[HARNESS]["classes"]["ContinuousTest"]["xpass"] == 1
    assert all(f["duration_s"] > 0 and Path(f["log"]).is_file() for f in files.values())
    assert {a["name"] for a in report["adaptations"] if a["applied"]} == set(
        adaptations.BY_NAME)
    suites = ET.parse(out / "junit.xml").getroot().findall("testsuite")
    assert sorted(s.get("name") for s in suites) == sorted(
        p.removesuffix(".py") for p in files)
    # a case per test, named as in the node id (an upstream test has no world size of its own)
    cases = [c for s in suites for c in s.findall("testcase")]
    assert sorted(c.get("name") for c in cases) == sorted(
        t["nodeid"].split("::", 1)[1] for t in report["tests"])
    markdown = (out / "report.md").read_text()
    assert markdown.index("## Passes on `cpu`, fails on `mock`") \
        < markdown.index("## Process groups") < markdown.index("## Files")
    assert "| `DeviceTypeTestMOCK` | 1 |" in markdown


#: Each adaptation, the fixture test that shows it is needed, and what that test does on mock
#: without it (outcome, text of its reason or failure).
NEEDED = {
    "skip-if-lt-x-gpu": (f"{HARNESS}::SkipIfLtXGpuTest::test_all_reduce_on_two_devices",
                         "skip", "Need at least 2 CUDA devices"),
    "device-type-test-base": (f"{HARNESS}::DeviceTypeTestPRIVATEUSE1::test_all_reduce_mock",
                              "xfail", "Invalid device string: 'privateuse1'"),
    "dtensor-init-pg": (f"{DTENSOR}::DTensorFixtureTest::test_shard_redistribute_random",
                        "xfail", "Backend mockccl not supported!"),
    "fake-pg-device": (f"{DTENSOR}::FakeProcessGroupTest::test_device_mesh_on_fake_group",
                       "xfail", "No backend type associated with device type mock"),
    "fsdp-device-selection": (f"{FSDP}::FSDPFixtureTest::test_fully_shard_gradients",
                              "xfail", "No backend type associated with device type mock"),
}


def test_every_adaptation_has_a_fixture_that_needs_it():
    assert set(NEEDED) | {"fsdp-rank-device", "hardware-classification-names"} == \
        set(adaptations.BY_NAME)


@pytest.mark.torch_version
@pytest.mark.parametrize("name", sorted(NEEDED))
def test_fixture_fails_or_skips_without_its_adaptation(mock_unadapted, name):
    """On a torch whose harness still has the gap; where torch closed it (``fixed_in``) the
    fixture passes without the adaptation, which proves it is not needed there."""
    node, outcome, text = NEEDED[name]
    test = mock_unadapted[node]
    if adaptations.BY_NAME[name].not_needed(torch.__version__):
        assert test["outcome"] in ("pass", "xpass"), test
        return
    assert test["outcome"] == outcome, test
    assert text in test["reason"] + test["details"]


HW = "distributed/hw_classification_fixture.py"


@pytest.mark.torch_version
def test_hardware_classified_classes_of_another_device_are_skipped(tmp_path):
    """A test file newer than the harness imports HardwareClassification: on torch 2.13 it
    collects only with hardware-classification-names; on every torch the class classified for
    CUDA is skipped on mock with the reason, the GENERIC one runs."""
    proc = _upstream(tmp_path / "adapted", "--backend", "mock", "--file", HW)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tests = _by_id(_report(tmp_path / "adapted"))
    assert tests[f"{HW}::GenericTest::test_generic"]["outcome"] == "pass"
    cuda = tests[f"{HW}::CudaOnlyTest::test_needs_cuda"]
    assert cuda["outcome"] == "skip"
    assert cuda["reason"].startswith("the test class is classified for CUDA hardware")
    applied = {a["name"]: a for a in _report(tmp_path / "adapted")["adaptations"]}
    shim = adaptations.BY_NAME["hardware-classification-names"]
    if shim.not_needed(torch.__version__):
        assert applied[shim.name]["why_not"] == "not needed: fixed in torch 2.14"
        return
    assert applied[shim.name]["applied"] is True
    proc = _upstream(tmp_path / "bare", "--backend", "mock", "--file", HW,
                     "--no-adapt", shim.name)
    assert proc.returncode == 1
    error = _by_id(_report(tmp_path / "bare"))[HW]
    assert error["outcome"] == "error"
    assert "cannot import name 'HardwareClassification'" in error["reason"]


def test_without_adaptations_fsdp_runs_on_gloo_and_is_flagged(mock_unadapted):
    test = mock_unadapted[f"{FSDP}::FSDPFixtureTest::test_fully_shard_gradients"]
    assert test["flag_kind"] == "foreign"
    assert {g["backend"] for g in test["groups"]} == {"cpu:gloo,cuda:gloo"}
    # what needs no adaptation still runs on the backend
    continuous = mock_unadapted[f"{HARNESS}::ContinuousTest::test_all_reduce"]
    assert continuous["outcome"] == "pass"
    assert {g["backend"] for g in continuous["groups"]} == {"mock:mockccl"}


def test_fsdp_ranks_share_device_0_without_fsdp_rank_device(tmp_path):
    """Also: arguments accelkit upstream does not know go to pytest."""
    proc = _upstream(tmp_path, "--backend", "mock", "--file", FSDP,
                     "--no-adapt", "fsdp-rank-device", "-k", "fully_shard", "-p", "no:randomly")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = _report(tmp_path)
    assert report["pytest_args"] == ["-k", "fully_shard", "-p", "no:randomly"]
    test = _by_id(report)[f"{FSDP}::FSDPFixtureTest::test_fully_shard_gradients"]
    assert test["outcome"] == "fail"
    assert "current_device_index(), self.rank" in test["details"]
    assert "Expected 1 but got 0" in test["details"]


def test_a_hanging_file_is_killed_with_its_children_and_a_broken_one_reported(tmp_path):
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELKIT_TEST_CHILD_PID_FILE": str(pid_file)}
    proc = subprocess.run(
        [sys.executable, "-m", "accelkit", "upstream", "--backend", "cpu", "--tests",
         str(TESTS / "fixtures" / "upstream_failures"), "--report-dir", str(tmp_path / "r"),
         "--file-timeout", "20", "--jobs", "2"],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = _report(tmp_path / "r")
    files = {f["path"]: f for f in report["files"]}
    assert files["test_hangs_fixture.py"]["status"] == "timeout"
    tests = _by_id(report)
    assert tests["test_hangs_fixture.py::test_hangs_with_a_child"]["outcome"] == "timeout"
    never = tests["test_hangs_fixture.py::test_after_the_hang"]
    assert never["outcome"] == "not-run"
    assert never["reason"] == ("never started: the file ran past its 20 s timeout during "
                               "test_hangs_fixture.py::test_hangs_with_a_child")
    child, store = pid_file.read_text().split()
    child = int(child)
    assert Path(store).parent.name.startswith("accelkit-upstream-"), store
    assert not Path(store).parent.exists(), f"the file's temporary folder is left: {store}"
    assert not Path(f"/proc/{child}").exists() or \
        Path(f"/proc/{child}/stat").read_text().split(")")[1].split()[0] == "Z"
    broken = files["test_import_error_fixture.py"]
    assert broken["status"] == "collect-error"
    assert "No module named 'accelkit_no_such_module_for_the_fixture'" in \
        broken["collect_errors"][0]["reason"]
    assert broken["counts"]["error"] == 1
    assert _by_id(report)["test_import_error_fixture.py"]["outcome"] == "error"
    assert "test_hangs_fixture.py: timeout" in proc.stdout


# --- the command's refusals --------------------------------------------------------------

def test_explain_lists_every_adaptation_with_target_and_versions(capsys):
    assert main(["upstream", "--backend", "mock", "--explain", "--no-adapt",
                 "fake-pg-device"]) == 0
    out = capsys.readouterr().out
    for a in adaptations.ADAPTATIONS:
        assert f"{a.name}  [{a.target}]  torch {a.torch_versions}" in out
    assert "fake-pg-device" in out and "disabled (--no-adapt)" in out
    assert "PYTORCH_TESTING_DEVICE_ONLY_FOR=mock" in out
    assert main(["upstream", "--backend", "cpu", "--explain"]) == 0
    assert "none applies: torch's harness knows cpu" in capsys.readouterr().out


def test_adaptations_are_refused_on_another_torch(monkeypatch, capsys):
    """Refused on a torch they were not verified on; an adaptation whose gap torch closed
    before that release (skip-if-lt-x-gpu, fixed in 2.15) is not needed, not refused."""
    monkeypatch.setattr("accelkit.conformance.engine.session.torch_version", lambda: "2.16.0")
    assert main(["upstream", "--backend", "mock", "--tests", str(FIXTURES), "--list"]) == 2
    err = capsys.readouterr().err
    assert ("adaptation 'dtensor-init-pg' (torch.testing._internal.distributed._tensor."
            "common_dtensor.DTensorTestBase.init_pg) was written and verified for torch "
            ">=2.13,<2.16, not 2.16.0") in err
    assert "--no-adapt dtensor-init-pg" in err
    assert "skip-if-lt-x-gpu" not in err
    assert main(["upstream", "--backend", "mock", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "here:   not needed: fixed in torch 2.15" in out
    assert "fixed:  in torch 2.15: skip_if_lt_x_gpu counts torch.accelerator devices" in out
    # the cpu baseline needs none, and --no-adapt all runs without any
    assert main(["upstream", "--backend", "cpu", "--tests", str(FIXTURES), "--list"]) == 0
    assert main(["upstream", "--backend", "mock", "--tests", str(FIXTURES), "--list",
                 "--no-adapt", "all"]) == 0


@pytest.mark.parametrize("args,message", [
    (["--no-adapt", "skip-if-lt-x-gpus"], "unknown adaptation(s) skip-if-lt-x-gpus; known:"),
    ([], "--tests PATH is required"),
    (["--tests", "/nonexistent/x"], "--tests /nonexistent/x: not a directory"),
    (["--area", "fsdp2"], "--area selects from a PyTorch checkout's default set"),
    (["--file", "nope.py"], "--file nope.py: no such file under"),
    (["--compare", "/nonexistent/report.json"], "--compare /nonexistent/report.json:"),
    (["--compare", "r.json", "--baseline", "cpu"], "give one of them"),
    (["--jobs", "0"], "--jobs must be at least 1"),
])
def test_usage_errors(capsys, args, message):
    if args and args[0] != "--tests" and "--tests PATH" not in message:
        args = ["--tests", str(FIXTURES), *args]
    assert main(["upstream", "--backend", "mock", "--list", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_backend_that_cannot_run_here_exits_3(capsys, tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["upstream", "--backend", "cuda", "--tests", str(FIXTURES),
                 "--report-dir", str(tmp_path)]) == 3
    assert "backend cuda cannot run here: no CUDA device" in capsys.readouterr().err


# --- file selection -----------------------------------------------------------------------

def _checkout(tmp_path: Path, version: str = "2.13.0a0") -> Path:
    (tmp_path / "version.txt").write_text(version + "\n")
    for area in ("dtensor", "dcp"):
        for rel in selection.DEFAULT_FILES[area][:1]:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text("")
    return tmp_path


def test_checkout_runs_the_default_set_it_has(tmp_path):
    sel = selection.select(_checkout(tmp_path), areas=[], files=[],
                           torch_version="2.13.0+cpu")
    assert sel.kind == "checkout" and sel.version == "2.13.0a0"
    assert sel.files == ["test/distributed/tensor/test_dtensor.py",
                         "test/distributed/checkpoint/test_state_dict.py"]
    assert sel.areas["test/distributed/checkpoint/test_state_dict.py"] == "dcp"
    assert "test/distributed/test_device_mesh.py" in sel.missing
    only = selection.select(tmp_path, areas=["dcp"], files=[], torch_version="2.13.0")
    assert only.files == ["test/distributed/checkpoint/test_state_dict.py"]


def test_checkout_of_another_version_is_refused(tmp_path):
    root = _checkout(tmp_path, "2.14.0a0")
    with pytest.raises(selection.SelectionError, match=r"PyTorch 2\.14\.0a0 but the installed "
                                                       r"torch is 2\.13\.0.*git checkout v2\.13"):
        selection.select(root, areas=[], files=[], torch_version="2.13.0")
    assert selection.select(root, areas=[], files=[], torch_version="2.13.0",
                            ignore_version=True).files


def test_folder_runs_its_test_files():
    sel = selection.select(FIXTURES, areas=[], files=[], torch_version="2.13.0")
    assert sel.kind == "folder" and sel.files == sorted([HARNESS, DTENSOR, FSDP])
    assert selection.select(FIXTURES, areas=[], files=[str(FIXTURES / FSDP)],
                            torch_version="2.13.0").files == [FSDP]


# --- expectations, comparison, outcomes, groups ---------------------------------------------

def _toml(tmp_path, text):
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def test_upstream_expectations(tmp_path):
    path = _toml(tmp_path, '''
[checks."rng.offset_exact"]
status = "xfail"
reason = "conformance entries live beside upstream ones"

[upstream."test/distributed/tensor/test_random_ops.py::*::test_rng_tracker_init"]
status = "xfail"
reason = "seed broadcast"
category = "backend-bug"
link = "https://example.invalid/1"

[upstream."test/distributed/*"]
status = "skip"
reason = "later"
category = "unsupported-op"
torch = ">=2.14"
''')
    exps = load_upstream(path, "2.13.0")
    assert [e.pattern for e in exps] == [
        "test/distributed/tensor/test_random_ops.py::*::test_rng_tracker_init"]
    assert exps[0].matches("test/distributed/tensor/test_random_ops.py::DistTensorRandomOpTest"
                           "::test_rng_tracker_init")
    assert not exps[0].matches("test/distributed/tensor/test_random_ops.py::X::test_other")
    assert len(load_upstream(path, "2.14.0")) == 2
    assert set(load(path, {"rng.offset_exact"}, "2.13.0")) == {"rng.offset_exact"}


def test_checkout_patterns_match_a_folder_of_test_files_by_file_name_and_test_id(tmp_path):
    """Expectations written with checkout paths match the same files copied into a plain
    folder (``--tests`` a folder: node ids start at the file, or at a sub-folder)."""
    (exp,) = load_upstream(_toml(tmp_path, '''
[upstream."test/distributed/tensor/test_random_ops.py::*WithLocalTensor::test_init_*"]
status = "xfail"
reason = "LocalTensor"
category = "torch-limitation"
'''), "2.13.0")
    for node in ("test/distributed/tensor/test_random_ops.py::AWithLocalTensor::test_init_ops",
                 "test_random_ops.py::AWithLocalTensor::test_init_ops",
                 "tensor/test_random_ops.py::AWithLocalTensor::test_init_ops"):
        assert exp.matches(node), node
    assert not exp.matches("test_random_ops.py::ATest::test_init_ops")
    assert not exp.matches("test_other.py::AWithLocalTensor::test_init_ops")
    assert exp.applies_to_file("test_random_ops.py")
    assert exp.applies_to_file("test/distributed/tensor/test_random_ops.py")
    assert not exp.applies_to_file("test_device_mesh.py")


def test_strict_ignores_expectations_of_files_not_selected(tmp_path):
    """--strict fails a run whose expectations match nothing, but only those of the files
    that ran: the shipped expectations name files --file left out."""
    exps = tmp_path / "exp.toml"
    exps.write_text('''
[upstream."distributed/test_harness_fixture.py::ContinuousTest::test_all_gather"]
status = "xfail"
reason = "a file this run does not select"
category = "backend-bug"
''')
    proc = _upstream(tmp_path / "r", "--backend", "cpu", "--file",
                     "distributed/tensor/test_dtensor_fixture.py", "-k", "FakeProcessGroup",
                     "--expectations", str(exps), "--strict")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = _report(tmp_path / "r")
    assert report["expectations"]["unmatched"] == []
    assert "matched no test" not in proc.stdout
    # each test is reported as it finishes, while its file runs
    assert ("  distributed/tensor/test_dtensor_fixture.py::FakeProcessGroupTest::"
            "test_device_mesh_on_fake_group: pass (") in proc.stdout


@pytest.mark.parametrize("entry,message", [
    ('status = "xfail"\nreason = "x"\n', "category is None; expected one of unsupported-op, "
                                         "version-skew, torch-limitation, backend-bug"),
    ('status = "xfail"\nreason = "x"\ncategory = "flaky"\n', "category is 'flaky'"),
    ('status = "fail"\nreason = "x"\ncategory = "backend-bug"\n', "status is 'fail'"),
    ('status = "skip"\ncategory = "backend-bug"\n', "reason is missing"),
    ('status = "skip"\nreason = "x"\ncategory = "backend-bug"\nowner = "me"\n',
     "unknown key(s) owner"),
])
def test_bad_upstream_entries_name_the_line(tmp_path, entry, message):
    path = _toml(tmp_path, '\n[upstream."a.py::T::t"]\n' + entry)
    with pytest.raises(ExpectationsError) as err:
        load_upstream(path, "2.13.0")
    assert f"{path}:2: upstream.\"a.py::T::t\"" in str(err.value)
    assert message in str(err.value)


def test_generic_names_match_device_type_classes_across_devices():
    assert compare.generic("a.py::TestFooMOCK::test_bar_mock_float32", "mock") == \
        compare.generic("a.py::TestFooCPU::test_bar_cpu_float32", "cpu") == \
        "a.py::TestFoo<DEVICE>::test_bar_<device>_float32"
    assert compare.generic("a.py::MockTest::test_mocked", "mock") == "a.py::MockTest::test_mocked"


def test_compare_buckets():
    def report(name, device, outcomes):
        return {"backend": {"name": name, "device_type": device}, "started": "t",
                "tests": [{"nodeid": n, "outcome": o, "reason": o} for n, o in outcomes]}
    here = report("mock", "mock", [("f::A::t", "fail"), ("f::B::t", "skip"),
                                   ("f::C::t", "error"), ("f::D::t", "pass"),
                                   ("f::E::t", "pass")])
    there = report("cpu", "cpu", [("f::A::t", "pass"), ("f::B::t", "pass"),
                                  ("f::C::t", "timeout"), ("f::D::t", "fail"),
                                  ("f::F::t", "pass")])
    result = compare.compare(here, there)
    assert [e["test"] for e in result["regressions"]] == ["f::A::t"]
    assert [e["test"] for e in result["skipped_here"]] == ["f::B::t"]
    assert [e["test"] for e in result["both_fail"]] == ["f::C::t"]
    assert [e["test"] for e in result["fixed"]] == ["f::D::t"]
    assert result["only_here"] == ["f::E::t"] and result["only_there"] == ["f::F::t"]


def test_headline_is_the_rank_exception_not_the_harness_wrapper():
    text = ("E   RuntimeError: Process 1 exited with error code 10 and exception:\n"
            "E   Traceback (most recent call last):\n"
            "E     File \"x.py\", line 3, in test\n"
            "E   AssertionError: Tensor-likes are not close!\n")
    assert plugin.headline(text) == "AssertionError: Tensor-likes are not close!"
    assert plugin.headline("RuntimeError: Process 0 terminated or timed out after 300.0 "
                           "seconds") == \
        "RuntimeError: Process 0 terminated or timed out after 300.0 seconds"
    assert plugin.headline("no exception here\nlast line") == "last line"


def test_backend_strings():
    assert groups.parse_backend("cpu:gloo, mock:mockccl") == {"cpu": "gloo", "mock": "mockccl"}
    assert groups.is_backends("cpu:gloo,mock:mockccl", "mock", "mockccl")
    assert not groups.is_backends("cpu:gloo,cuda:gloo", "mock", "mockccl")
    assert groups.is_backends("threaded", "cpu", "threaded")


def test_records_are_attributed_to_tests(tmp_path):
    """Groups of a continuous worker's class go to each of its tests, a unittest id to its
    test, a node id to itself; a group made outside any test and recorder errors stay on the
    file."""
    from accelkit.conformance.upstream.report import UpstreamReport, add_file
    from accelkit.conformance.upstream.runner import FileRun
    from accelkit.core import registry

    run = FileRun("t.py", tmp_path)
    run.records.mkdir()
    run.collected = [{"nodeid": "t.py::C::test_a", "unittest_id": "t.C.test_a"},
                     {"nodeid": "t.py::C::test_b", "unittest_id": "t.C.test_b"},
                     {"nodeid": "t.py::D::test_c", "unittest_id": "t.D.test_c"}]
    run.tests = [{"nodeid": n["nodeid"], "outcome": "pass", "reason": "", "details": "",
                  "duration_s": 1.0, "expectation": None} for n in run.collected]

    def group(test, backend="mock:mockccl", size=2):
        return {"kind": "group", "test": test, "backend": backend, "size": size, "rank": 0,
                "bound_device": None, "device": None}
    lines = [group(["class", "t.C"]), group(["unittest", "t.C.test_b"], size=1),
             group(["node", "t.py::D::test_c"], "cpu:gloo"), group(None),
             {"kind": "device", "test": ["unittest", "t.C.test_a"], "device": "mock:1"},
             {"kind": "error", "error": "ValueError: boom"}]
    (run.records / "groups-1.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    report = UpstreamReport(spec=registry.get("mock"), torch="2.13.0", started="t", root="r",
                            kind="folder", version=None, strict=True)
    add_file(report, run, None)
    tests = {t.nodeid: t for t in report.tests}
    assert [g["size"] for g in tests["t.py::C::test_a"].groups] == [2]
    assert tests["t.py::C::test_a"].devices == ["mock:1"]
    assert sorted(g["size"] for g in tests["t.py::C::test_b"].groups) == [1, 2]
    assert tests["t.py::D::test_c"].flag_kind == "foreign"
    assert report.foreign == [tests["t.py::D::test_c"]] and not report.ok()  # strict
    assert report.files[0].unattributed_groups[0]["backend"] == "mock:mockccl"
    assert report.files[0].recorder_errors == ["ValueError: boom"]


def test_a_file_that_does_not_collect_is_an_error_in_the_counts_and_junit(tmp_path):
    """A collection error (an import of a newer torch's name, a syntax error) is one ERROR test
    named by the file's node id: the summary, the file's counts and junit.xml show it, not
    only the file's status (a CI reading junit.xml would otherwise see nothing fail)."""
    from accelkit.conformance.upstream import bridge
    from accelkit.conformance.upstream.report import UpstreamReport, add_file, to_json
    from accelkit.conformance.upstream.runner import FileRun, _read_results
    from accelkit.core import registry

    run = FileRun("t.py", tmp_path)
    run.records.mkdir()
    run.exit_code = 2
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(x) for x in [
        {"kind": "collect_error", "nodeid": "t.py",
         "reason": "ImportError: cannot import name 'Newer' from 'torch.testing'",
         "details": "Traceback ..."},
        {"kind": "collected", "tests": [], "matched": {}}]))
    _read_results(run, results, 60.0)
    assert run.status == "collect-error"
    report = UpstreamReport(spec=registry.get("cpu"), torch="2.13.0", started="t", root="r",
                            kind="folder", version=None, strict=False)
    add_file(report, run, None)
    (test,) = report.tests
    assert (test.nodeid, test.outcome) == ("t.py", "error")
    assert test.reason == ("collection error: ImportError: cannot import name 'Newer' from "
                           "'torch.testing'")
    assert report.counts()["error"] == 1 and not report.ok()
    assert to_json(report)["files"][0]["counts"]["error"] == 1
    bridge.write_junit(report, tmp_path / "junit.xml")
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("errors")) == ("1", "1")
