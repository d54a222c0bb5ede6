"""What the multi-process benchmarks share: build the mock's extensions once and find a free
port (as the tests do: tests/support/ranks.py), then run a script's ranks (``<script> --rank R N
PORT RESULT [args...]``) on this host or on simulated hosts, and read the JSON result rank 0
writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from accelkit.conformance.launchers.processes import exit_text, kill_group, spawn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.ranks import build_extensions, free_port  # noqa: E402 (tests/ on the path first)


def run_ranks(script: str, ranks: int, result: Path, *args: str) -> dict | None:
    """The result of ``ranks`` processes of ``script`` (None, with the exit codes printed,
    when a rank failed)."""
    build_extensions()
    result.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs: list[subprocess.Popen] = []
    try:
        for r in range(ranks):
            procs.append(spawn([sys.executable, script, "--rank", str(r), str(ranks), str(port),
                                str(result), *args], group=procs[0].pid if procs else 0, env=env))
        codes = [p.wait() for p in procs]
    finally:  # a failed or interrupted run leaves no rank behind
        kill_group(procs[0].pid if procs else None, procs)
    if any(codes):
        print(f"rank exit {', '.join(exit_text(c) for c in codes)}", file=sys.stderr)
        return None
    return json.loads(result.read_text())


def run_on_hosts(script: str, ranks: int, hosts: int, result: Path, *args: str) -> dict | None:
    """As :func:`run_ranks`, with the ranks on ``hosts`` simulated hosts
    (:class:`accelkit.conformance.launchers.hosts.Hosts`), in blocks: rank r on host r * hosts // ranks.
    Each rank's arguments end with host 0's address (its MASTER_ADDR) and the hosts' interface
    name. None, with the reason printed, when no hosts can be made here or a rank failed."""
    from accelkit.conformance.launchers.hosts import IFNAME, Hosts, unavailable, worker_env

    why = unavailable(hosts)
    if why is not None:
        print(f"cannot make {hosts} simulated hosts here: {why}", file=sys.stderr)
        return None
    build_extensions()
    result.parent.mkdir(parents=True, exist_ok=True)
    with Hosts(hosts) as made:
        port = made.port()
        procs = [made.popen(r * hosts // ranks,
                            [sys.executable, script, "--rank", str(r), str(ranks), str(port),
                             str(result), *args, made.address(0), IFNAME], env=worker_env())
                 for r in range(ranks)]
        codes = [p.wait() for p in procs]
    if any(codes):
        print(f"rank exit {', '.join(exit_text(c) for c in codes)}", file=sys.stderr)
        return None
    return json.loads(result.read_text())
