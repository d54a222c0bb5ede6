"""One rank of the engine's worker pool: ``python -m accelkit.conformance.launchers.worker FD CONFIG``.

Started by :class:`accelkit.conformance.launchers.pool.Pool` as a fresh interpreter (spawn, never fork).
It imports torch and the check modules once, sets ``OMP_NUM_THREADS=1``, calls
``spec.setup()``, selects its device (``LOCAL_RANK``), joins the pool's TCPStore (rank 0 hosts
it on a free port of 127.0.0.1 and reports the port) and ``init_process_group`` once, then
runs checks on command over its socket until told to exit. A worker started with
``simulate=N`` (the one-rank pool of simulated checks) joins no store and initialises no
process group: each check gets a fake one of N ranks
(:mod:`accelkit.conformance.launchers.simulate`). It dies with the engine
(``PR_SET_PDEATHSIG``) and dumps every thread's stack on ``SIGUSR1`` (the engine asks for it
before killing a hung pool).
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import json
import os
import resource
import signal
import sys
import traceback
from multiprocessing.connection import Connection


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the engine is already gone
        os._exit(1)


def _flush_native_output() -> None:
    """Flush C stdio buffers (a native runtime's printf to a log file is block-buffered and
    would be lost at ``os._exit``) and Python's."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _limit_memory(limit_mb: int | None) -> None:
    """Cap this rank's data segment at its current size + ``limit_mb`` (RLIMIT_DATA), so a
    check that allocates more gets MemoryError instead of endangering the host."""
    if not limit_mb:
        return
    with open("/proc/self/status") as f:
        data_kb = next(int(line.split()[1]) for line in f if line.startswith("VmData:"))
    limit = (data_kb * 1024) + limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), None)
    except OSError:
        return None


def device_info(spec) -> dict:
    """The device as this rank sees it: type, count and name (the CPU model on cpu)."""
    import platform

    import torch
    from accelkit.conformance.engine.execute import device_handle

    handle = device_handle(spec.device_type)
    info = {"type": spec.device_type, "count": None, "name": _cpu_name() or platform.machine()}
    if handle is not None:
        for attr, key in (("device_count", "count"), ("get_device_name", "name")):
            fn = getattr(handle, attr, None)
            if fn is not None:
                try:
                    info[key] = fn()
                except Exception as exc:  # reported, never fatal
                    info[key] = f"<{attr}() failed: {exc}>"
    info["torch"] = torch.__version__
    return info


def _start(conn: Connection, config: dict):
    """Everything up to a ready default process group; returns (spec, checks, ctx args)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from accelkit.conformance.engine import loader
    from accelkit.core import registry

    rank, world_size = config["rank"], config["world_size"]
    checks = loader.load(config["modules"], builtin=config["builtin"])
    spec = registry.get(config["backend"])
    spec.setup()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    from accelkit.conformance.engine.execute import device_handle

    handle = device_handle(spec.device_type)
    if handle is not None and hasattr(handle, "set_device"):
        handle.set_device(local_rank)
    if config.get("simulate"):
        conn.send({"type": "store", "port": None})  # the pool's handshake, with no store
        return spec, checks, local_rank, device_info(spec)
    timeout = datetime.timedelta(seconds=config["pg_timeout_s"])
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=timeout,
                              wait_for_workers=False)
        conn.send({"type": "store", "port": store.port})
        port = store.port
    else:
        msg = conn.recv()
        port = msg["port"]
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timeout)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend=spec.process_group_backend, store=store, rank=rank,
                            world_size=world_size, timeout=timeout)
    from accelkit.core import torch_internals

    torch_internals.preload_distributed()  # imported once here, not in check 1

    _limit_memory(config.get("memory_limit_mb"))
    return spec, checks, local_rank, device_info(spec)


def serve(conn: Connection, config: dict) -> None:
    from accelkit.conformance.api import CheckContext

    try:
        spec, checks, local_rank, device = _start(conn, config)
    except BaseException as exc:  # noqa: BLE001 (reported to the engine, then exit)
        _flush_native_output()  # what the backend's C++ printed belongs in the log
        conn.send({"type": "failed", "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()})
        os._exit(1)
    conn.send({"type": "ready", "pid": os.getpid(), "device": device})
    import torch.distributed as dist
    from accelkit.conformance.engine.execute import run_on_rank

    rank, world_size = config["rank"], config.get("simulate") or config["world_size"]
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the engine went away
            os._exit(0)
        kind = msg["type"]
        if kind == "run":
            ctx = CheckContext(rank=rank, world_size=world_size, local_rank=local_rank, spec=spec)
            conn.send(run_on_rank(checks[msg["id"]], ctx, msg["group_count"]))
        elif kind == "sync":
            if dist.is_initialized():
                dist.barrier()
            conn.send({"type": "synced"})
        elif kind == "exit":
            if dist.is_initialized():
                dist.destroy_process_group()
            conn.send({"type": "bye"})
            os._exit(0)
        else:
            raise ValueError(f"worker got unknown command {kind!r}")


def main(argv: list[str]) -> None:
    _die_with_parent()
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    fd, config = int(argv[0]), json.loads(argv[1])
    conn = Connection(fd)
    serve(conn, config)


if __name__ == "__main__":
    main(sys.argv[1:])
