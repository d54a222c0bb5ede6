"""Conformance across hosts: two simulated hosts (``accelkit.conformance.launchers.hosts``: a network
namespace, hostname, /dev/shm and PID namespace each, joined by a veth pair) run one torchrun
each, ``--nnodes 2 --nproc-per-node 2``, joined by a c10d rendezvous on the first host, and the
launch runs ``python -m accelkit.conformance``. Its collectives must cross hosts (ranks 0-1 on
one host, 2-3 on the other), the way they do on a cluster; rank 0 writes the one report, which
names both hosts with their ranks. SKIPped, with the reason, where namespaces cannot be made
(not root)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import engine_env  # tests/fixtures (tests/conftest.py)
import pytest
from accelkit.conformance.launchers import hosts as hosts_mod

_REASON = hosts_mod.unavailable()

#: The mock's areas whose checks communicate between ranks: across hosts each of their
#: collectives, DeviceMesh groups, DTensor redistributions, training steps and checkpoints
#: crosses the TCP path. The areas left out run nothing another rank sees (registration, ops,
#: streams: one device each; the compile area's Inductor code generation, whose collectives
#: are the eager ones of these areas; scale: one process), and run at 4 ranks on one host in
#: `tox -e conformance`.
CROSSING_AREAS = ("collectives", "devicemesh", "dtensor", "tp", "rng", "training", "pipelining",
                  "checkpoint")

#: What the two hosts run: the backend, the checks (areas selected; every check written for 4
#: ranks), the environment of its ranks and the fewest PASSes the report must count (the mock
#: passes 169 checks of those areas at 4 ranks: a floor near that catches checks that quietly
#: turn into skips). The mock is the target: its collective library must connect ranks on
#: different hosts.
#: Under torchrun the mock shows each host as many devices as it runs ranks, as a cluster's
#: nodes do (torchrun's --nproc-per-node is a node's device count): torch's DTensor RNG tracker
#: takes device ``rank % device_count()`` for a rank's own, which is the device LOCAL_RANK
#: selected only then. The rng area with 8 devices a host shows what a check says where that is
#: not so: the second host's ranks SKIP what torch's tracker gets wrong there, naming it.
#: cpu (gloo) on one area is the reference, cheap, that the harness and the report work
#: whatever the mock's state.
RUNS = [
    pytest.param("mock", [a for area in CROSSING_AREAS for a in ("--area", area)], {}, 160, {},
                 id="mock-crossing-areas"),
    pytest.param("mock", ["--area", "rng"], {"ACCELKIT_MOCK_DEVICES": "8"}, 10,
                 {"rng.user_generator@4": ("skip", "rank % device_count()")},
                 id="mock-rng-8-devices"),
    pytest.param("cpu", ["--area", "collectives"], {}, 50, {}, id="cpu-collectives"),
]

#: Seconds for the whole launch (on 2 CPU cores the mock's crossing areas take about 45 s, cpu's
#: collectives about 30 s, cpu's whole catalogue about 2 minutes).
TIMEOUT_S = 900


def _machine_links() -> list[str]:
    proc = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return sorted(line.split(":")[1].strip() for line in proc.stdout.splitlines())


@pytest.mark.skipif(_REASON is not None, reason=str(_REASON))
def _torchrun_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("torchelastic_*")}


@pytest.mark.parametrize(("backend", "select", "ranks_env", "at_least", "expected"), RUNS)
def test_conformance_across_two_hosts(tmp_path, backend, select, ranks_env, at_least, expected):
    """Both torchruns exit 0; the launch writes one report.json, in torchrun mode, naming both
    hosts with two ranks each (0-3 in all, rank 0's host as ``host``); every check that ran
    ran on those 4 ranks, each rank answering; at least ``at_least`` PASS, nothing fails, and
    the ``expected`` checks end as said (outcome, words of the reason).
    report.md and the terminal summary name both hosts with their ranks. Afterwards no
    namespace, interface, process, shared-memory segment or temporary folder (torchrun's
    ``torchelastic_*`` logs) of the run is left."""
    _, marker = engine_env.new_env()
    links, shm, temporary = _machine_links(), engine_env.shm_segments(), _torchrun_folders()
    started = time.monotonic()
    with hosts_mod.Hosts(2) as hosts:
        names = [hosts.hostname(0), hosts.hostname(1)]
        runs = hosts_mod.run_torchrun(
            hosts, 2, ["--backend", backend, *select, "--report-dir", str(tmp_path)],
            timeout=TIMEOUT_S, env={**ranks_env, engine_env.MARKER_VAR: marker},
            tail_chars=200_000)
    took = time.monotonic() - started
    written = tmp_path / "report.json"
    report = json.loads(written.read_text()) if written.exists() else {"checks": []}
    failing = [f"{c['key']} {c['outcome'].upper()}: {c['reason'][:1000]}" for c in report["checks"]
               if c["outcome"] in ("fail", "error", "timeout", "crash", "xpass")]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(
        failing + [str(run)[-6000:] for run in runs])
    assert failing == []

    assert sorted(p.name for p in tmp_path.rglob("report.json")) == ["report.json"]
    assert (report["mode"], report["aborted"], report["error"]) == ("torchrun", None, None)
    hosts = report["hosts"]
    assert sorted(hosts) == sorted(names), hosts
    assert all(len(ranks) == 2 for ranks in hosts.values()), hosts
    assert sorted(r for ranks in hosts.values() for r in ranks) == [0, 1, 2, 3]
    assert 0 in hosts[report["host"]]

    ran = [c for c in report["checks"] if c["outcome"] not in ("skip", "unavailable")]
    assert ran, "no check ran"
    assert {(c["world_size"], tuple(sorted(r["rank"] for r in c["ranks"]))) for c in ran} == {
        (4, (0, 1, 2, 3))}
    passed = sum(c["outcome"] == "pass" for c in report["checks"])
    assert report["summary"]["pass"] == passed >= at_least, report["summary"]
    by_key = {c["key"]: c for c in report["checks"]}
    for key, (outcome, reason) in expected.items():
        assert (by_key[key]["outcome"], reason in by_key[key]["reason"]) == (outcome, True), \
            by_key[key]

    # ranks are contiguous per host: torchrun gives node k the ranks k*2, k*2+1
    listed = [(h, f"ranks {min(r)}-{max(r)}") for h, r in hosts.items()]
    md = (tmp_path / "report.md").read_text()
    assert "| hosts | " + ", ".join(f"`{h}` ({r})" for h, r in listed) + " |" in md
    rank0 = runs[names.index(report["host"])].output
    assert "\n2 hosts: " + ", ".join(f"{h} ({r})" for h, r in listed) + "\n" in rank0, \
        rank0[-3000:]

    assert engine_env.marked_processes(marker) == []
    assert [n for n in hosts_mod.namespaces() if n.startswith(f"accelkit-{os.getpid()}-")] == []
    assert _machine_links() == links
    assert engine_env.shm_segments() == shm
    assert _torchrun_folders() == temporary
    print(f"{backend} {' '.join(select)}: 2 hosts x 2 ranks, {passed} PASS, {took:.1f} s "
          f"(torchruns {', '.join(f'{run.duration_s:.1f} s' for run in runs)})")
