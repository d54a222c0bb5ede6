"""Proof of where the tests ran: every process group created in an ``accelkit upstream`` run
is recorded, in the pytest process and in every rank.

c10d registers each new group (``init_process_group``, ``new_group``, DeviceMesh's groups,
``split_group``) through ``torch.distributed.distributed_c10d._register_pg_in_world``; the
start-up hook wraps it (:func:`install`) so that each registration appends one JSON line to
``<records dir>/groups-<pid>.jsonl``: the backend string (``mock:mockccl``, ``cpu:gloo``,
``threaded``...), the group's size and rank, its bound device and the rank's current device
(read only once the device is initialised, so recording never selects a device itself), and
the test it belongs to. When a test ends in a rank, the rank's current device is recorded too
(``kind: device``), so the report shows the backend *and* the device each test used:

- ``node``: the pytest node id, from the environment of a rank spawned for one test
  (``MultiProcessTestCase`` spawns per test) or set by the plugin in the pytest process;
- ``unittest``: the unittest id (``module.Class.test``) a ``MultiProcContinuousTest`` worker
  is running;
- ``class``: ``module.Class`` of a continuous worker between tests (its default group, made
  once for the whole class).
"""

from __future__ import annotations

import functools
import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

#: Environment variable carrying the current test's node id into spawned ranks.
TEST_ENV = "ACCELKIT_UPSTREAM_TEST"

_context = threading.local()
_records_dir: Path | None = None
_device_type = ""


def current() -> tuple[str, str] | None:
    """The test the calling code belongs to, as ``(kind, id)``."""
    explicit = getattr(_context, "value", None)
    if explicit is not None:
        return explicit
    node = os.environ.get(TEST_ENV)
    return ("node", node) if node else None


@contextmanager
def attributed_to(kind: str, ident: str):
    previous = getattr(_context, "value", None)
    _context.value = (kind, ident)
    try:
        yield
    finally:
        _context.value = previous


def _current_device() -> str | None:
    import torch

    handle = getattr(torch, _device_type, None) if _device_type != "cpu" else None
    if handle is None or not handle.is_initialized():
        return None
    return f"{_device_type}:{handle.current_device()}"


def _record(pg, backend_name: str, backend_config: str) -> None:
    if _records_dir is None:
        return
    test = current()
    bound = getattr(pg, "bound_device_id", None)
    entry = {"kind": "group", "pid": os.getpid(), "test": list(test) if test else None,
             "backend": str(backend_config or backend_name), "size": pg.size(),
             "rank": pg.rank(), "bound_device": str(bound) if bound is not None else None,
             "device": _current_device()}
    _append(entry)


def _append(entry: dict) -> None:
    with open(_records_dir / f"groups-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def record_device() -> None:
    """Record the device the calling rank is on (nothing before the device is initialised)."""
    if _records_dir is None:
        return
    try:
        device = _current_device()
    except Exception as exc:  # noqa: BLE001 (the proof must never break a test)
        _record_failure(exc)
        return
    test = current()
    if device is not None:
        _append({"kind": "device", "pid": os.getpid(), "test": list(test) if test else None,
                 "device": device})


def install(c10d_module, records_dir: str, device_type: str) -> None:
    """Wrap ``c10d_module._register_pg_in_world`` to record every group into ``records_dir``."""
    global _records_dir, _device_type
    _records_dir, _device_type = Path(records_dir), device_type
    original = c10d_module._register_pg_in_world

    @functools.wraps(original)
    def register(pg, backend_name, store, group_name, backend_config, *args, **kwargs):
        result = original(pg, backend_name, store, group_name, backend_config, *args, **kwargs)
        try:
            _record(pg, backend_name, backend_config)
        except Exception as exc:  # noqa: BLE001 (the proof must never break a test)
            _record_failure(exc)
        return result

    c10d_module._register_pg_in_world = register


def _record_failure(exc: Exception) -> None:
    if _records_dir is not None:
        _append({"kind": "error", "pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"})


def track_tests(common_distributed) -> None:
    """Attribute records in the ranks: a ``MultiProcContinuousTest`` worker's default group to
    its class and a test's groups to that test; record each rank's device when a test ends
    (``MultiProcessTestCase.run_test``, ``MultiProcContinuousTest._run_test_given_id``)."""
    base = common_distributed.MultiProcContinuousTest
    worker_loop = base._worker_loop.__func__
    run_test = base._run_test_given_id.__func__
    per_test = common_distributed.MultiProcessTestCase.run_test

    @functools.wraps(per_test)
    def run_test_recording_device(self, test_name, parent_pipe):
        try:
            return per_test(self, test_name, parent_pipe)
        finally:
            record_device()

    @functools.wraps(worker_loop)
    def _worker_loop(cls, *args, **kwargs):
        with attributed_to("class", f"{cls.__module__}.{cls.__qualname__}"):
            return worker_loop(cls, *args, **kwargs)

    @functools.wraps(run_test)
    def _run_test_given_id(cls, test_id, **kwargs):
        with attributed_to("unittest", test_id):
            try:
                return run_test(cls, test_id, **kwargs)
            finally:
                record_device()

    base._worker_loop = classmethod(_worker_loop)
    base._run_test_given_id = classmethod(_run_test_given_id)
    common_distributed.MultiProcessTestCase.run_test = run_test_recording_device


def load(records_dir: Path) -> list[dict]:
    """Every record written under ``records_dir`` (``kind``: group, device or error)."""
    records = []
    for path in sorted(records_dir.glob("groups-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def parse_backend(backend: str) -> dict[str, str]:
    """``'cpu:gloo,mock:mockccl'`` -> ``{'cpu': 'gloo', 'mock': 'mockccl'}``; a bare name
    (``'threaded'``) maps to ``{'*': name}``."""
    result = {}
    for part in backend.split(","):
        device, sep, name = part.strip().partition(":")
        if sep:
            result[device.strip()] = name.strip()
        elif device:
            result["*"] = device
    return result


def is_backends(backend: str, device_type: str, collective: str) -> bool:
    """Whether a group with backend string ``backend`` runs ``device_type`` tensors through
    ``collective``."""
    parsed = parse_backend(backend)
    return parsed.get(device_type, parsed.get("*")) == collective
