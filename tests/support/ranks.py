"""Rank processes for tests and benchmarks: build the mock's extensions once, then start
``world_size`` processes of a script, in one process group (accelkit's launcher,
:func:`accelkit.conformance.launchers.processes.spawn`) so a timeout leaves none behind."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from accelkit.conformance.launchers.processes import kill_group, spawn

#: A pool of ranks' time to finish, in seconds: a healthy run takes a few seconds.
TIMEOUT_S = 60


#: Where :func:`free_port` looks: below the kernel's ephemeral range (32768-60999 here), so no
#: process's outgoing connection takes a port between its pick and the store's bind, and a
#: slice per pytest-xdist worker (``PYTEST_XDIST_WORKER``, gw0, gw1, ...), so two tests running
#: at once never pick the same one.
PORTS_FROM, PORTS_PER_WORKER = 20000, 1000
_next_port = itertools.count()


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now, from this process's slice of
    :data:`PORTS_FROM` on (a port that cannot be bound is passed over)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = PORTS_FROM + (int(worker) if worker.isdigit() else 0) * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = base + next(_next_port) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {base}..{base + PORTS_PER_WORKER - 1}")


def build_extensions() -> None:
    """Build the mock and mockccl extensions once, in a child process (importing the mock claims
    PrivateUse1 for the whole process), so the ranks do not all compile at the same time."""
    code = "import accelkit.backends.mock; from accelkit.backends.mock import mockccl; mockccl.extension()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"building the mock's extensions failed:\n{proc.stderr[-3000:]}")


def spawn_ranks(script, world_size: int, out_dir: Path, extra_args=(), timeout=TIMEOUT_S,
                env=None, prefix=None, hosts=None):
    """Start ``world_size`` processes of ``script`` (a path, or a path and the arguments that
    come first: ``script RANK WORLD OUT [extra_args]``, with
    ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` set); return (the JSON each
    rank wrote to ``OUT``, None where it wrote none; stderr per rank; exit codes). ``prefix(rank)``
    may prepend a command (e.g. unshare); ``hosts``, the host each rank runs as (:func:`as_host`),
    is that prefix for ranks on several hosts of this machine. Past ``timeout`` every rank is killed and its stderr
    starts with ``TIMEOUT``."""
    if hosts is not None:
        prefix = lambda rank: as_host(hosts[rank])  # noqa: E731
    port = free_port()
    procs: list[subprocess.Popen] = []
    for rank in range(world_size):
        rank_env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                    "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size), **(env or {})}
        cmd = [sys.executable, *([script] if isinstance(script, (str, Path)) else script),
               str(rank), str(world_size),
               str(out_dir / f"rank{rank}.json"), *extra_args]
        if prefix is not None:
            cmd = prefix(rank) + cmd
        procs.append(spawn(cmd, group=procs[0].pid if procs else 0, env=rank_env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    errs, codes = [], []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(procs[0].pid, [])
            _, err = p.communicate()
            err = f"TIMEOUT after {timeout}s\n{err}"
        errs.append(err)
        codes.append(p.returncode)
    results = []
    for rank in range(world_size):
        path = out_dir / f"rank{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
    return results, errs, codes


def as_host(name: str) -> list[str]:
    """The command prefix that runs a rank as if on host ``name`` of this machine
    (ACCELKIT_MOCKCCL_HOSTID), its TCP on loopback: every rank runs here, and mockccl uses a
    loopback address only when told to (it would name each host itself)."""
    return ["env", f"ACCELKIT_MOCKCCL_HOSTID={name}", "ACCELKIT_MOCKCCL_SOCKET_IFNAME=lo"]
