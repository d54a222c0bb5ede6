"""The processes the suite starts and stops: the engine's rank pools, the upstream runner's
pytest processes, the benchmarks' ranks.

Every such process starts in a process group of its own making or joins one
(:func:`spawn`), so that one :func:`kill_group` stops it with everything it started (the
ranks torch's test harness spawns, a check's helper processes), reaps the children and removes
the shared-memory segments mockccl keeps in ``/dev/shm`` for the processes it killed (a killed
rank cannot unlink its own). A child's exit reads as text through :func:`exit_text`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Where mockccl's shared-memory segments live, and the prefix of their names: mockccl's
#: ``kSegmentPrefix`` (backends/mock/csrc/mockccl.cpp) without its slash, which
#: tests/engine/test_engine_units.py holds to this one.
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "accelkit_mockccl_"


def spawn(cmd: Sequence[str], *, group: int = 0, **popen) -> subprocess.Popen:
    """Start ``cmd`` (``subprocess.Popen`` keywords in ``popen``; stdin from /dev/null unless
    given) in process group ``group``: 0 makes a new group that the child leads (its pid is
    the group's id, for :func:`kill_group`), another value joins that group."""
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(list(cmd), process_group=group, **popen)


def group_pids(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:  # fields after the name: state ppid pgrp session
                pids.append(int(entry.name))
    return pids


def kill_group(pgid: int | None, children: Iterable[subprocess.Popen]) -> list[str]:
    """SIGKILL process group ``pgid`` (None: no group was made yet), reap ``children`` (this
    process's children in it) and remove the mockccl segments of every process the group
    held; returns the segments removed. Never signals group 0 (the caller's own)."""
    children = list(children)
    pids = {c.pid for c in children}
    if pgid:
        pids.update(group_pids(pgid))
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for child in children:
        child.wait()
    return sweep_shm(sorted(pids))


def sweep_shm(pids: list[int]) -> list[str]:
    """Remove ``/dev/shm/accelkit_mockccl_<pid>_<n>_<random>`` segments whose ``<pid>`` (the
    process that created it; nothing else in the name) is one of ``pids``, left behind by ranks
    that were killed; returns the names removed. A segment this process may not remove (another
    user's) is left where it is."""
    removed = []
    wanted = {str(p) for p in pids}
    try:
        names = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(SHM_PREFIX)]
    except OSError:
        return removed
    for name in names:
        if name[len(SHM_PREFIX):].split("_", 1)[0] in wanted:
            try:
                (SHM_DIR / name).unlink()
                removed.append(name)
            except (FileNotFoundError, PermissionError):
                pass
    return removed


def exit_text(returncode: int | None) -> str:
    """A child's end as ``Popen.returncode`` gives it, in words: ``exit code 3``, ``SIGKILL``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"
