"""What the multi-process benchmarks share: their ranks (``<script> --rank R N RESULT
[args...]``, ``MASTER_PORT`` in the environment) start through the tests' launcher
(tests/support/ranks.py, which builds the mock's extensions once first) on this host, or on
simulated hosts; rank 0 writes the JSON result."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from accelkit.conformance.launchers.processes import exit_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.ranks import build_extensions, spawn_ranks  # noqa: E402 (tests/ first)

#: A benchmark's ranks' time to finish, in seconds (the largest sweeps take minutes).
TIMEOUT_S = 3600


def run_ranks(script: str, ranks: int, result: Path, *args: str) -> dict | None:
    """The result of ``ranks`` processes of ``script``, also written to ``result`` (None, with
    each rank's exit and the end of its stderr printed, when a rank failed)."""
    build_extensions()
    result.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="accelkit-bench-") as out:
        results, errs, codes = spawn_ranks([script, "--rank"], ranks, Path(out), args,
                                           timeout=TIMEOUT_S)
    if any(codes) or results[0] is None:
        for rank, (code, err) in enumerate(zip(codes, errs, strict=True)):
            print(f"rank {rank}: {exit_text(code)}\n{err[-3000:]}", file=sys.stderr)
        return None
    result.write_text(json.dumps(results[0]))
    return results[0]


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
        env = worker_env({"MASTER_PORT": str(made.port())})
        procs = [made.popen(r * hosts // ranks,
                            [sys.executable, script, "--rank", str(r), str(ranks), str(result),
                             *args, made.address(0), IFNAME], env=env)
                 for r in range(ranks)]
        codes = [p.wait() for p in procs]
    if any(codes):
        print(f"rank exit {', '.join(exit_text(c) for c in codes)}", file=sys.stderr)
        return None
    return json.loads(result.read_text())
