"""Runs upstream test files: one pytest process per file, ``jobs`` files at a time.

A process per file keeps PyTorch's test files apart as their own CI runs them (many share a
basename, e.g. ``test_utils.py``, which one pytest process cannot import twice; harness state
such as the default process group or ``PrivateUse1TestBase`` does not leak from file to
file) and gives each file its wall time and its timeout. Inside a file tests run one after
the other: the harness's multi-process tests already start ``world_size`` ranks each.
Parallel files (``--jobs``) are safe for the harness (its rendezvous go through temporary
files) but not for the few upstream tests that bind a fixed TCP port; the default is 1.

A file that outlives its timeout is killed with its whole process group (the ranks included)
and mockccl's shared-memory segments of the killed processes are removed; its tests that did
was running is TIMEOUT, the one of a pytest process that died is CRASH, and the tests that
never started are NOT-RUN (named after the test that was running). While a file runs, each
finished test is reported as it finishes (``on_test``). A file (or class) that
does not collect is one ERROR test named by its node id, so that the counts and junit.xml show
it. Ctrl-C kills every running file the same way before it propagates.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.conformance.launchers.processes import exit_text, kill_group, spawn
from accelkit.conformance.upstream.hook import CONFIG_ENV

STARTUP_DIR = Path(__file__).resolve().parent / "startup"
PLUGIN = "accelkit.conformance.upstream.plugin"


@dataclass
class FileRun:
    """What one file's pytest process left: its results and how it ended."""

    path: str
    directory: Path
    duration_s: float = 0.0
    exit_code: int | None = None
    status: str = "ok"                 # ok, timeout, crash, pytest-error
    tests: list[dict] = field(default_factory=list)
    collected: list[dict] = field(default_factory=list)
    collect_errors: list[dict] = field(default_factory=list)
    matched: dict[str, int] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.directory / "pytest.log"

    @property
    def records(self) -> Path:
        return self.directory / "groups"


def slug(path: str) -> str:
    """A file's name for directories and report areas: ``a/b/test_x.py`` -> ``a/b/test_x``
    with dots replaced (report areas may not contain dots)."""
    return re.sub(r"\.py$", "", path).replace(".", "_")


_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()


def run_file(root: Path, rel: str, out_dir: Path, config: dict, pytest_args: list[str],
             timeout_s: float, env_extra: dict[str, str], on_test=None) -> FileRun:
    run = FileRun(rel, out_dir / "files" / slug(rel))
    shutil.rmtree(run.directory, ignore_errors=True)  # records of an earlier run
    run.records.mkdir(parents=True)
    results = run.directory / "results.jsonl"
    results.write_text("")
    config_file = run.directory / "config.json"
    config_file.write_text(json.dumps({**config, "records": str(run.records),
                                       "results": str(results)}))
    pythonpath = os.pathsep.join(p for p in (str(STARTUP_DIR), os.environ.get("PYTHONPATH"))
                                 if p)
    # The file's temporary files (torch's MultiProcessTestCase puts its FileStore there, which
    # a rank killed mid-test leaves behind) go to a folder of its own, removed when it ends.
    scratch = tempfile.TemporaryDirectory(prefix="accelkit-upstream-", ignore_cleanup_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_extra, "PYTHONPATH": pythonpath,
           CONFIG_ENV: str(config_file), "TMPDIR": scratch.name}
    cmd = [sys.executable, "-m", "pytest", rel, "--rootdir", str(root), "-p", PLUGIN,
           "-p", "no:cacheprovider", "-q", *pytest_args]
    start = time.monotonic()
    with scratch, open(run.log, "w") as log:
        log.write(f"$ (cd {root} && {' '.join(cmd)})\n")
        log.flush()
        proc = spawn(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        with _live_lock:
            _live.add(proc)
        try:
            run.exit_code = _wait(proc, start + timeout_s, results,
                                  (lambda record: on_test(rel, record)) if on_test else None)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, [proc])
            run.status = "timeout"
        finally:
            with _live_lock:
                _live.discard(proc)
    run.duration_s = round(time.monotonic() - start, 3)
    _read_results(run, results, timeout_s)
    return run


#: How often a running file's results are read for per-test progress.
POLL_S = 1.0


def _wait(proc: subprocess.Popen, deadline: float, results: Path, on_test) -> int:
    """Wait for ``proc`` until ``deadline`` (``TimeoutExpired`` after), passing each test
    record the plugin appends to ``results`` to ``on_test`` as it appears."""
    offset = 0
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
        finally:
            if on_test is not None:
                with open(results) as f:
                    f.seek(offset)
                    chunk = f.read()
                complete = chunk[:chunk.rfind("\n") + 1]
                offset += len(complete)
                for line in complete.splitlines():
                    record = json.loads(line)
                    if record["kind"] == "test":
                        on_test(record)


def _read_results(run: FileRun, results: Path, timeout_s: float) -> None:
    running = None  # the test that started last and has no result
    for line in results.read_text().splitlines():
        record = json.loads(line)
        kind = record.pop("kind")
        if kind == "collected":
            run.collected, run.matched = record["tests"], record["matched"]
        elif kind == "collect_error":
            run.collect_errors.append(record)
        elif kind == "start":
            running = record["nodeid"]
        elif kind == "test":
            run.tests.append(record)
            running = None
    if run.status == "ok" and run.exit_code not in (0, 1, 5):
        # 2 interrupted (also: collection errors), 3 internal error, 4 usage error, < 0 signal
        if run.exit_code is None or run.exit_code < 0:
            run.status = "crash"
        else:
            run.status = "collect-error" if run.collect_errors else "pytest-error"
    for error in run.collect_errors:  # a file (or class) that did not collect: one ERROR
        run.tests.append({"nodeid": error["nodeid"] or run.path, "outcome": "error",
                          "reason": f"collection error: {error['reason']}",
                          "details": error["details"], "duration_s": 0.0, "expectation": None})
    done = {t["nodeid"] for t in run.tests}
    ended = (f"the file ran past its {timeout_s:g} s timeout" if run.status == "timeout"
             else f"pytest ended ({exit_text(run.exit_code)})")
    for test in run.collected:
        if test["nodeid"] in done:
            continue
        if test["nodeid"] == running:
            outcome = "timeout" if run.status == "timeout" else "crash"
            reason = f"{ended} while the test ran"
        else:
            outcome = "not-run"
            reason = f"never started: {ended}" + (f" during {running}" if running else "")
        run.tests.append({"nodeid": test["nodeid"], "outcome": outcome, "reason": reason,
                          "details": "", "duration_s": 0.0, "expectation": None})


def run_files(root: Path, files: list[str], out_dir: Path, config: dict,
              pytest_args: list[str], timeout_s: float, env_extra: dict[str, str], jobs: int,
              progress=None, on_test=None) -> list[FileRun]:
    """Run ``files`` (``jobs`` at a time); results in the order of ``files``; ``progress``
    is called with each finished file, ``on_test`` with (file, test record) as each test
    finishes. An exception (Ctrl-C) kills the files still running, then propagates."""
    from concurrent.futures import ThreadPoolExecutor

    def one(rel: str) -> FileRun:
        run = run_file(root, rel, out_dir, config, pytest_args, timeout_s, env_extra, on_test)
        if progress is not None:
            progress(run)
        return run

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = [pool.submit(one, rel) for rel in files]
    try:
        return [f.result() for f in futures]
    except BaseException:
        for future in futures:
            future.cancel()
        with _live_lock:
            running = list(_live)
        for proc in running:
            kill_group(proc.pid, [proc])
        raise
    finally:
        pool.shutdown(wait=True)
