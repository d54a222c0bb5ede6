"""torchrun mode on one machine: `torchrun --standalone --nproc-per-node 2 -m
accelkit.conformance` runs checks on the launch's ranks, rank 0 writes the reports; a hang or a
dead rank stops the launch with a report and a non-zero exit."""

from __future__ import annotations

import json
import platform
import sys

import engine_env  # tests/fixtures (tests/conftest.py)

#: torchrun of the interpreter running the tests (its console script is torch.distributed.run),
#: so a test run outside its virtual environment's PATH launches the same torch.
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")


def _torchrun(tmp_path, *select):
    env, marker = engine_env.new_env(TMPDIR=str(tmp_path))  # torchrun's torchelastic_* logs
    proc = engine_env.run(
        [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "accelkit.conformance",
         "--backend", "cpu", "--checks-module", engine_env.CHECKS, "--no-builtin-checks",
         "--report-dir", str(tmp_path), *select], env=env, timeout=300)
    assert engine_env.marked_processes(marker) == []
    report = json.loads((tmp_path / "report.json").read_text())
    return proc, report, {c["id"]: c for c in report["checks"]}


def test_checks_run_on_the_launch_and_a_hang_stops_it_with_a_report(tmp_path):
    proc, report, checks = _torchrun(
        tmp_path, "-k", "fixture.broadcast", "-k", "fail_rank1", "-k", "raises", "-k", "hangs",
        "-k", "exits_rank1", "-k", "fixture.all_reduce")
    assert proc.returncode != 0
    assert report["mode"] == "torchrun"
    assert {cid: c["outcome"] for cid, c in checks.items()} == {
        "fixture.broadcast": "pass", "fixture.fail_rank1": "fail", "fixture.raises": "error",
        "fixture.hangs": "timeout"}
    assert checks["fixture.fail_rank1"]["reason"] == "rank 1: AssertionError: rank 1 disagrees: sum=2"
    assert checks["fixture.hangs"]["reason"] == "rank 1: no answer within 3 s"
    assert report["aborted"] == ("TIMEOUT in fixture.hangs; 2 check(s) not run: "
                                 "fixture.exits_rank1@2, fixture.all_reduce@4")
    assert "ABORTED: TIMEOUT in fixture.hangs" in proc.stdout
    assert "[4/6] TIMEOUT" in proc.stdout


def test_dead_rank_stops_the_launch_with_a_crash_report(tmp_path):
    proc, report, checks = _torchrun(tmp_path, "-k", "fixture.broadcast", "-k", "exits_rank1",
                                     "-k", "fixture.all_reduce")
    assert proc.returncode != 0
    assert checks["fixture.broadcast"]["outcome"] == "pass"
    crash = checks["fixture.exits_rank1"]
    assert crash["outcome"] == "crash"
    assert crash["ranks"][1]["status"] == "crash"
    assert "launch stopped (SIGTERM from torchrun)" in crash["reason"]
    assert report["aborted"].startswith("launch stopped during fixture.exits_rank1")


def test_checks_for_another_world_size_are_skipped(tmp_path):
    proc, report, checks = _torchrun(tmp_path, "-k", "fixture.broadcast", "-k",
                                     "fixture.all_reduce")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert checks["fixture.broadcast"]["outcome"] == "pass"
    assert checks["fixture.all_reduce"]["reason"].startswith(
        "written for 4 ranks; this launch has 2")
    assert report["aborted"] is None
    # every rank published its host through the store: both on this machine
    assert report["hosts"] == {platform.node(): [0, 1]}
    assert report["host"] == platform.node()


def test_catalogue_checks_written_for_the_launch_size_run_at_it(tmp_path):
    """A 2-rank launch runs the catalogue checks that are also written for 2 ranks, on 2 ranks;
    one tied to 4 ranks is SKIPped naming its size."""
    env, marker = engine_env.new_env(TMPDIR=str(tmp_path))  # torchrun's torchelastic_* logs
    proc = engine_env.run(
        [*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "accelkit.conformance",
         "--backend", "cpu", "-k", "collectives.all_reduce_sum", "-k", "collectives.subgroup_half",
         "--report-dir", str(tmp_path)], env=env, timeout=300)
    assert engine_env.marked_processes(marker) == []
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = {c["id"]: c for c in json.loads((tmp_path / "report.json").read_text())["checks"]}
    summed = checks["collectives.all_reduce_sum"]
    assert (summed["outcome"], summed["world_size"], len(summed["ranks"])) == ("pass", 2, 2)
    half = checks["collectives.subgroup_half"]
    assert half["outcome"] == "skip"
    assert half["reason"].startswith("written for 4 ranks; this launch has 2"), half["reason"]


class _Store:
    """The few TCPStore calls rank 0's watchdog makes, over a dict."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key, value) -> None:
        self.data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key) -> bytes:
        return self.data[key]

    def check(self, keys) -> bool:
        return all(k in self.data for k in keys)

    def wait(self, keys, timeout=None) -> None:
        missing = [k for k in keys if k not in self.data]
        assert not missing, f"would wait for {missing}"


def _launch_runner(monkeypatch):
    from accelkit.conformance.api import CheckDef
    from accelkit.conformance.engine.options import Options
    from accelkit.conformance.engine.plan import Step
    from accelkit.conformance.launchers.torchrun import LaunchRunner, _encode
    from accelkit.conformance.outcomes import RankResult
    from accelkit.core import registry

    store = _Store()
    runner = LaunchRunner(registry.get("cpu"), Options(timeout_s=5), None,
                          ranks={"rank": 0, "world_size": 2, "local_rank": 0,
                                 "local_world_size": 2},
                          store=store, watch_store=store, finish=lambda report: None)
    check = Step(CheckDef(id="unit.check", fn=lambda ctx: None, world_size=2, doc="d"))
    aborts = []
    monkeypatch.setattr(runner, "abort", lambda *args: aborts.append(args))
    runner.index = 1
    for rank in range(2):
        store.set(f"1/rank{rank}", _encode(RankResult(rank=rank, status="pass")))
    return runner, check, aborts


def test_rank_results_travel_through_the_store_as_json_not_pickle():
    """What a rank writes to the launch's store is JSON that rank 0 reads back into the same
    result (rows included); a pickle in the store is refused, never unpickled."""
    import pickle

    import pytest
    from accelkit.conformance.launchers import torchrun
    from accelkit.conformance.outcomes import RankResult

    result = RankResult(rank=3, status="fail", message="x differs", duration_s=0.25,
                        peak_host_mb=12.5, rows=[{"op": "add", "dtype": "float32", "status": "pass"}])
    data = torchrun._encode(result)
    assert json.loads(data)["rows"][0]["op"] == "add"
    assert torchrun._decode(data) == result
    with pytest.raises(ValueError):
        torchrun._decode(pickle.dumps(result))


def test_each_rank_publishes_its_host_and_rank_0_maps_hosts_to_ranks(monkeypatch):
    """Each rank writes its hostname to the launch's store (JSON) at startup; rank 0 reads
    them all into hostname -> ranks, the report's ``hosts``."""
    from accelkit.conformance.launchers import torchrun

    store = _Store()
    for rank, host in enumerate(["node-a", "node-a", "node-b", "node-b"]):
        monkeypatch.setattr(platform, "node", lambda host=host: host)
        torchrun._publish_host(store, rank)
    assert json.loads(store.get("host/rank2")) == {"host": "node-b"}
    assert torchrun._launch_hosts(store, 4) == {"node-a": [0, 1], "node-b": [2, 3]}


def test_watchdog_firing_after_every_rank_answered_does_not_abort(monkeypatch):
    """The per-check timer may fire between the last answer and its cancel(): a check every
    rank answered is not a TIMEOUT and the launch goes on."""
    import time

    runner, check, aborts = _launch_runner(monkeypatch)
    runner._current = (check, time.perf_counter())
    runner._on_timeout(check)
    assert aborts == []


def test_sigterm_between_checks_is_reported_once(monkeypatch):
    """torchrun's SIGTERM while no check runs: the launch is reported stopped between checks
    (no TypeError reading the running check, no second report)."""
    import signal

    runner, _, aborts = _launch_runner(monkeypatch)
    runner._current = None
    monkeypatch.setattr(signal, "sigwait", lambda signals: signal.SIGTERM)
    runner.watch_sigterm()
    assert aborts == [(None, [], "launch stopped (SIGTERM from torchrun) between checks")]
