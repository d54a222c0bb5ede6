"""Simulated hosts on one machine, for proving that a launch works across hosts.

:class:`Hosts` makes N hosts out of Linux namespaces. Host ``i`` has

- its own network namespace (named ``accelkit-<pid>-<k>-<i>``, ``k`` counting the process's
  :class:`Hosts`), with loopback up and one interface, :data:`IFNAME`, holding the private
  address ``10.231.0.<i+1>/24`` (:meth:`Hosts.address`); two hosts are joined by one veth pair, three or more by veth pairs
  to a bridge in a namespace of its own (``accelkit-<pid>-<k>-sw``). Every namespace is new, so
  the subnet cannot collide with the machine's networks, and the machine's own interfaces are
  never touched;
- its own hostname (``accelkit-host<i>``, :meth:`Hosts.hostname`; a UTS namespace), which every
  host resolves to its address (an ``/etc/hosts`` of the simulated hosts, bind-mounted over
  the machine's in each host), as on a cluster (``name_on_loopback``: its own name on
  127.0.1.1, as Debian's installer maps it);
- its own ``/dev/shm`` (a tmpfs mounted in a private mount namespace), so shared-memory
  transports cannot reach across hosts;
- its own PID namespace (and ``/proc``), whose PID 1 is the host's init: a ``sh`` started when
  the ``with`` block is entered, that lives as long as the host and reaps the host's orphans.

A host is one set of these namespaces for its whole life, as a machine is: every process
started on host ``i`` (:meth:`Hosts.popen`, any number of calls) enters the namespaces of host
``i``'s init (``nsenter``), so all of them share its hostname, ``/dev/shm``, ``/etc/hosts``,
PIDs and network, and two ranks started on one host by two calls find each other's
shared-memory segments and processes, as on one machine.

What is shared between the hosts, as with a cluster's shared file system: the file system
itself (``/tmp``, caches, the virtual environment).

Leaving the ``with`` block (normally, on an exception or Ctrl-C) stops every process the hosts
started (SIGTERM to each process group, SIGKILL to what is left after a grace period), then
SIGKILLs each host's init, which takes every process left in the host's PID namespace with it
(even those that left the process group: torchrun starts its workers in new sessions), SIGKILLs
anything still in a namespace, and deletes the namespaces, which deletes their interfaces. A
process the hosts started is also killed when the thread that started it dies, and the hosts'
inits (with everything on the hosts) when the thread that entered the ``with`` block dies
(``setpriv --pdeathsig``), so a test runner killed outright leaves no process behind; its
namespaces are deleted by the next :class:`Hosts` made on the machine (:func:`sweep`).

:func:`unavailable` says why no hosts can be made here (not root, a missing tool, namespaces
refused), for tests to SKIP with. :func:`run_torchrun` runs one ``torchrun`` per host, joined
by a c10d rendezvous on host 0.

Needs root (``CAP_SYS_ADMIN``, ``CAP_NET_ADMIN``), ``ip`` (iproute2), ``unshare``, ``nsenter``,
``mount`` and ``setpriv`` (util-linux) and ``sh``.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The interface every host reaches the others through (the same name in each namespace).
IFNAME = "ak0"

#: The hosts' /24: host ``i`` is ``SUBNET.<i+1>``. Each :class:`Hosts` has namespaces of its own,
#: so two of them at once (or the machine's networks) never collide.
SUBNET = "10.231.0"

#: The most hosts one :class:`Hosts` makes (the /24's addresses).
MAX_HOSTS = 253

#: The ports :meth:`Hosts.port` hands out: below Linux's ephemeral range, so no port a process
#: bound to port 0 got can be handed out.
PORTS = range(29400, 32000)

#: The tools the hosts need.
TOOLS = ("ip", "unshare", "nsenter", "mount", "setpriv", "sh")

_PREFIX = "accelkit"
_NAME = re.compile(rf"^{_PREFIX}-(\d+)-\d+-(?:\d+|sw|probe)$")
_counter = iter(range(1, 1 << 30))
_counter_lock = threading.Lock()

# A host's init, PID 1 of its PID namespace for the host's life: sets the hostname, a private
# /dev/shm and /etc/hosts, says it is ready, then waits forever, reaping the host's orphans
# (`wait` reaps any child). PID 1 ignores the signals it has no handler for: only a SIGKILL from
# outside ends it, and with it every process of the host.
_INIT = ("set -e; printf '%s' {hostname} > /proc/sys/kernel/hostname; "
         "mount -t tmpfs -o mode=1777 tmpfs /dev/shm; mount --bind {hosts_file} /etc/hosts; "
         "echo ready; exec >/dev/null 2>&1 </dev/null; set +e; "
         "while :; do sleep 86400 & wait; done")

# What popen runs in a host's namespaces (nsenter --no-fork: this sh stays in the machine's PID
# namespace, its children are in the host's): the command as a child that dies with this sh
# (pdeathsig). It outlives a SIGTERM to its process group (the handler is reset for the command
# on exec, which gets its SIGTERM), waits for the command and exits with its status.
# "$@; exit $?" keeps sh from exec'ing its last command.
_RUN = 'trap : INT TERM; setpriv --pdeathsig KILL -- "$@"; exit $?'

# How long a host's init may take to get ready.
_INIT_TIMEOUT_S = 30


class HostsError(RuntimeError):
    """Making, using or cleaning up the simulated hosts failed; the message names the command
    and its error output."""


def _run(argv: Sequence[str], *, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a setup/cleanup command; :class:`HostsError` naming it and its stderr on failure."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise HostsError(f"`{shlex.join(argv)}` failed: {argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise HostsError(f"`{shlex.join(argv)}` did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        raise HostsError(f"`{shlex.join(argv)}` failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip() or proc.stdout.strip() or 'no output'}")
    return proc


def namespaces() -> list[str]:
    """The names of the machine's network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines()
            if line.strip()]


def _pids(namespace: str) -> list[int]:
    """The processes in ``namespace`` (``ip netns pids``; [] once it is gone)."""
    proc = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=30)
    return [int(p) for p in proc.stdout.split() if p.isdigit()] if proc.returncode == 0 else []


def _empty(namespace: str, timeout: float = 15) -> list[int]:
    """SIGKILL every process in ``namespace`` until none is left; the pids left at
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        pids = _pids(namespace)
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _delete(namespace: str) -> str | None:
    """Kill what is in ``namespace`` and delete it; what is left behind, or None."""
    left = _empty(namespace)
    if left:
        return f"processes {left} in network namespace {namespace} survived SIGKILL"
    try:
        _run(["ip", "netns", "del", namespace])
    except HostsError as exc:
        if namespace in namespaces():
            return str(exc)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _children() -> dict[int, list[int]]:
    """The machine's processes by parent, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...)."""
    children = _children()
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def sweep() -> list[str]:
    """Delete the namespaces a :class:`Hosts` of a process that no longer runs left behind (it
    was killed before it could clean up), killing what runs in them, and its folder (the hosts
    file) in the temporary directory; the namespaces' names deleted."""
    deleted = []
    for name in namespaces():
        found = _NAME.match(name)
        if found and not _alive(int(found.group(1))) and _delete(name) is None:
            deleted.append(name)
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}-hosts-*-*"):
        owner = folder.name.split("-")[2]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
    return deleted


def unavailable(hosts: int = 2) -> str | None:
    """Why ``hosts`` simulated hosts cannot be made on this machine, or None when they can.

    Checks what the machine must allow, not the harness: root, the tools (:data:`TOOLS`), and
    that a network namespace, a veth pair in it (and a bridge, for three hosts or more) and a
    process in new mount, UTS and PID namespaces with its own tmpfs can be made, and those
    namespaces entered (a probe namespace, deleted again). The reason names the failing command and its error."""
    if os.geteuid() != 0:
        return (f"simulated hosts need root (network, mount and PID namespaces); this process "
                f"runs as uid {os.geteuid()}")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return (f"simulated hosts need {', '.join(missing)} (iproute2, util-linux) on PATH; "
                "not found")
    with _counter_lock:
        probe = f"{_PREFIX}-{os.getpid()}-{next(_counter)}-probe"
    try:
        _run(["ip", "netns", "add", probe])
    except HostsError as exc:
        return f"cannot make a network namespace here: {exc}"
    try:
        _run(["ip", "-n", probe, "link", "add", "name", "probe0", "type", "veth", "peer", "name",
              "probe1"])
        if hosts > 2:
            _run(["ip", "-n", probe, "link", "add", "probebr", "type", "bridge"])
        _run(["ip", "netns", "exec", probe, "unshare", "--mount", "--uts", "--pid", "--fork",
              "--kill-child", "--mount-proc", "--propagation", "private", "sh", "-c",
              "mount -t tmpfs tmpfs /dev/shm && nsenter --target 1 --mount --uts --pid --net "
              "-- true"])
    except HostsError as exc:
        return f"cannot make simulated hosts here: {exc}"
    finally:
        _delete(probe)
    return None


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) while cleaning up, then raise KeyboardInterrupt; a second Ctrl-C
    must not leave namespaces behind. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


class Hosts:
    """``n`` simulated hosts (see the module's docstring), made on entering the ``with`` block
    and removed, with everything they run, on leaving it::

        with Hosts(2) as hosts:
            proc = hosts.popen(1, ["python", "-c", "import socket; print(socket.gethostname())"])

    ``stop_grace_s``: how long a process gets between SIGTERM and SIGKILL at cleanup.
    ``name_on_loopback``: each host's ``/etc/hosts`` maps its own hostname to 127.0.1.1 first,
    as Debian's installer writes it (so a host resolves its own name to loopback, and the
    others to its address).
    """

    def __init__(self, n: int, *, stop_grace_s: float = 5.0,
                 name_on_loopback: bool = False) -> None:
        if not 2 <= n <= MAX_HOSTS:
            raise ValueError(f"Hosts(n): n must be 2..{MAX_HOSTS}, not {n}")
        self.n = n
        self.stop_grace_s = stop_grace_s
        self.name_on_loopback = name_on_loopback
        with _counter_lock:
            tag = f"{_PREFIX}-{os.getpid()}-{next(_counter)}"
        self._names = [f"{tag}-{i}" for i in range(n)]
        self._switch = f"{tag}-sw" if n > 2 else None
        self._procs: list[subprocess.Popen] = []
        self._inits: list[subprocess.Popen] = []  # each host's init (its unshare, PID 1's parent)
        self._init_pids: list[int] = []            # each host's PID 1, as the machine numbers it
        self._lock = threading.Lock()
        self._ports = iter(PORTS)
        self._dir: Path | None = None
        self._open = False
        self._closed = False

    # -- what a host is ----------------------------------------------------------------------
    def namespace(self, i: int) -> str:
        """Host ``i``'s network namespace (``ip netns exec NAME ...`` enters it alone;
        :meth:`popen` runs in all of the host's namespaces)."""
        return self._names[self._index(i)]

    def hostname(self, i: int) -> str:
        """Host ``i``'s hostname, as its processes see it (``socket.gethostname()``)."""
        return f"{_PREFIX}-host{self._index(i)}"

    def address(self, i: int) -> str:
        """Host ``i``'s IPv4 address on :data:`IFNAME`; every host reaches it."""
        return f"{SUBNET}.{self._index(i) + 1}"

    def port(self) -> int:
        """A TCP port no process of these hosts has been given yet, free on every host: the
        namespaces are new, and only their own processes listen in them."""
        with self._lock:
            try:
                return next(self._ports)
            except StopIteration:
                raise HostsError(f"every port of {PORTS} was handed out") from None

    def _index(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"host {i}: these hosts are 0..{self.n - 1}")
        return i

    # -- making and removing -----------------------------------------------------------------
    def __enter__(self) -> Hosts:
        if self._open or self._closed:
            raise HostsError("a Hosts object is entered once")
        self._open = True
        try:
            sweep()
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _make(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}-hosts-{os.getpid()}-"))
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{self.address(i)} {self.hostname(i)}" for i in range(self.n)]
        # Not also as IPv4-mapped IPv6 addresses (how a dual-stack server, e.g. c10d's TCPStore,
        # sees its clients, and warns that it cannot name them): the hostnames would then
        # resolve to those first.
        for i in range(self.n):
            own = [f"127.0.1.1 {self.hostname(i)}"] if self.name_on_loopback else []
            (self._dir / f"hosts{i}").write_text("\n".join([*lines[:2], *own, *lines[2:]]) + "\n")
        for name in self._names:
            self._add_namespace(name)
        if self._switch is None:  # two hosts: one cable
            _run(["ip", "link", "add", "name", IFNAME, "netns", self._names[0], "type", "veth",
                  "peer", "name", IFNAME, "netns", self._names[1]])
        else:  # a switch: a bridge, one cable from each host to one of its ports
            sw = self._switch
            self._add_namespace(sw)
            _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", sw, "link", "set", "br0", "up"])
            for i, name in enumerate(self._names):
                _run(["ip", "link", "add", "name", IFNAME, "netns", name, "type", "veth",
                      "peer", "name", f"port{i}", "netns", sw])
                _run(["ip", "-n", sw, "link", "set", f"port{i}", "master", "br0", "up"])
        for i, name in enumerate(self._names):
            _run(["ip", "-n", name, "addr", "add", f"{self.address(i)}/24", "dev", IFNAME])
            _run(["ip", "-n", name, "link", "set", IFNAME, "up"])
        for i in range(self.n):
            self._start_init(i)

    def _start_init(self, i: int) -> None:
        """Start host ``i``'s init (:data:`_INIT`) in new mount, UTS and PID namespaces in the
        host's network namespace, and wait until it is ready; its PID goes to ``_init_pids``.
        It dies with the thread that entered the ``with`` block (``setpriv --pdeathsig``: its
        unshare, then ``--kill-child``)."""
        init = _INIT.format(hostname=shlex.quote(self.hostname(i)),
                            hosts_file=shlex.quote(str(self._dir / f"hosts{i}")))
        argv = ["setpriv", "--pdeathsig", "KILL", "ip", "netns", "exec", self.namespace(i),
                "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc",
                "--propagation", "private", "sh", "-c", init, self.hostname(i)]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        self._inits.append(proc)
        out, deadline = b"", time.monotonic() + _INIT_TIMEOUT_S
        while not out.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                data = os.read(proc.stdout.fileno(), 100)
                if not data:
                    break
                out += data
        if out != b"ready\n":
            late = proc.poll() is None and not out.endswith(b"\n")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            err = (out + proc.communicate(timeout=30)[1]).decode(errors="replace").strip()
            why = (f"was not ready within {_INIT_TIMEOUT_S:g} s" if late else
                   f"failed (exit {proc.returncode}): {err or 'no output'}")
            raise HostsError(f"the init of {self.hostname(i)}, `{shlex.join(argv)}`, {why}")
        proc.stdout.close()
        proc.stderr.close()
        pids = _children().get(proc.pid, [])  # unshare's one child: the init
        if len(pids) != 1:
            raise HostsError(f"the init of {self.hostname(i)}: unshare (pid {proc.pid}) has "
                             f"the children {pids}, not one")
        self._init_pids.append(pids[0])

    def close(self) -> None:
        """Stop every process the hosts started, delete their namespaces and files. Runs once
        (later calls do nothing); HostsError naming what could not be removed."""
        if self._closed:
            return
        self._closed = True
        with _interrupts_deferred():
            with self._lock:
                procs = list(self._procs)
            self.stop(*procs)
            for init in self._inits:  # the host's PID 1: every process of the host with it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(init.pid, signal.SIGKILL)
            for init in self._inits:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    init.wait(30)
            ours = [*self._names, *([self._switch] if self._switch else [])]
            made = set(namespaces())  # those made, even if an interrupt hid it from _make
            left = [why for name in ours if name in made and (why := _delete(name))]
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
        if left:
            raise HostsError("simulated hosts left behind: " + "; ".join(left))

    # -- running -----------------------------------------------------------------------------
    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on host ``i`` (see :meth:`popen`): ``nsenter``
        into the namespaces of the host's init, in the current directory; the command is killed
        when the thread that runs this line dies."""
        if not self._open or self._closed or len(self._init_pids) != self.n:
            raise HostsError("the hosts exist inside their `with Hosts(n)` block only")
        if self._inits[self._index(i)].poll() is not None:  # its PID could be another's now
            raise HostsError(f"the init of {self.hostname(i)} is gone "
                             f"(exit {self._inits[i].returncode})")
        return ["setpriv", "--pdeathsig", "KILL",
                "nsenter", "--target", str(self._init_pids[i]), "--mount", "--uts", "--pid",
                "--net", "--no-fork", "--wd=.",
                "sh", "-c", _RUN, self.hostname(i), *argv]

    def popen(self, i: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``i`` (``subprocess.Popen`` keyword arguments, e.g. ``env``,
        ``stdout``, ``cwd``), in a process group of its own; it is stopped at cleanup if still
        running. It runs in the host's namespaces, with every other process of the host. Its
        exit status is the command's. The process is killed if the calling thread ends
        first."""
        if kwargs.pop("start_new_session", True) is not True:
            raise ValueError("Hosts.popen starts every process in a session of its own")
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        with self._lock:
            proc = subprocess.Popen(self.command(i, argv), start_new_session=True, **kwargs)
            self._procs.append(proc)
        return proc

    def run(self, i: int, argv: Sequence[str], *, timeout: float = 60,
            **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``i`` to its end, capturing its output as text (stopped and
        HostsError after ``timeout`` seconds)."""
        proc = self.popen(i, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(proc)
            raise HostsError(f"`{shlex.join(argv)}` on {self.hostname(i)} did not finish "
                             f"within {timeout:g} s") from None
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    def stop(self, *procs: subprocess.Popen) -> None:
        """Stop ``procs`` (started by :meth:`popen`): SIGTERM to each one's process group, then,
        after :attr:`stop_grace_s`, SIGKILL to it and to every process below it (those that
        left the group included). What the command started and left (an orphan, now the host
        init's) lives until the hosts end: the host's other processes go on."""
        running = [p for p in procs if p.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                below = _descendants(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                for pid in below:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait(30)


#: Variables a worker gets from this process's environment (and every ``ACCELKIT_*`` and
#: ``TORCH_*``); nothing else leaks into the hosts (no MASTER_ADDR, RANK, interface names).
#: The sanitizers' (a sanitizer run preloads its runtime in every process, tests/sanitize.py).
PASSED_VARIABLES = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH",
                    "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CC", "CXX", "LD_PRELOAD", "ASAN_OPTIONS",
                    "UBSAN_OPTIONS", "TSAN_OPTIONS", "PYTHONMALLOC")


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on a simulated host: :data:`PASSED_VARIABLES`, every
    ``ACCELKIT_*`` and ``TORCH_*`` variable, ``OMP_NUM_THREADS=1``, ``GLOO_SOCKET_IFNAME`` (the
    host's :data:`IFNAME`: gloo's sockets use the hosts' network), then ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k in PASSED_VARIABLES or k.startswith(("ACCELKIT_", "TORCH_"))}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=IFNAME)
    env.update(extra or {})
    return env


@dataclass
class HostRun:
    """How one host's torchrun ended."""

    host: int
    hostname: str
    returncode: int | None  # None: still running at the timeout, then stopped
    output: str             # the end of its stdout and stderr (its workers' included)
    duration_s: float
    stopped: str | None = None  # why it was stopped, when it was

    def __str__(self) -> str:
        end = f"exit {self.returncode}" if self.returncode is not None else "no exit"
        stopped = f", stopped: {self.stopped}" if self.stopped else ""
        return (f"--- {self.hostname} (host {self.host}): {end} after {self.duration_s:.1f} s"
                f"{stopped} ---\n{self.output}")


def torchrun_command(hosts: Hosts, i: int, nproc_per_node: int, endpoint: str, rdzv_id: str,
                     args: Sequence[str], *, module: str = "accelkit.conformance",
                     join_timeout: float = 600) -> list[str]:
    """Host ``i``'s torchrun (``python -m torch.distributed.run``, torchrun's entry point, on
    this interpreter): ``--nnodes`` every host, a c10d rendezvous at ``endpoint``.

    Host 0 hosts the rendezvous store (``is_host``: torch would otherwise decide by whether the
    endpoint's address is one of the machine's, resolving its hostname). ``--local-addr`` makes
    each node known by its address: the node that becomes rank 0 publishes it as the workers'
    ``MASTER_ADDR`` (else its fully qualified hostname). torch numbers the nodes in the order of
    their addresses, as strings: host 0 gets the ranks 0..M-1."""
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(hosts.n), "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
            "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'},"
                           f"join_timeout={int(join_timeout)}",
            "--local-addr", hosts.address(i), "--max-restarts", "0",
            "-m", module, *args]


def run_torchrun(hosts: Hosts, nproc_per_node: int, args: Sequence[str], *, timeout: float,
                 module: str = "accelkit.conformance", env: Mapping[str, str] | None = None,
                 failed_grace_s: float = 60, tail_chars: int = 20_000) -> list[HostRun]:
    """Run ``torchrun --nnodes N --nproc-per-node M ... -m module args`` on every host (one
    torchrun each, :func:`torchrun_command`, environment :func:`worker_env` plus ``env``) and
    wait for all of them, at most ``timeout`` seconds; a torchrun still running then is stopped
    (``returncode`` None). When one exits non-zero, the others get ``failed_grace_s`` seconds
    to end (a launch that lost a node may otherwise wait for it). Returns each host's
    :class:`HostRun`, host 0 first."""
    endpoint = f"{hosts.address(0)}:{hosts.port()}"
    rdzv_id = f"{_PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    logs = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}-torchrun-{os.getpid()}-"))
    procs, started = [], time.monotonic()
    try:
        for i in range(hosts.n):
            argv = torchrun_command(hosts, i, nproc_per_node, endpoint, rdzv_id, args,
                                    module=module, join_timeout=timeout)
            with open(logs / f"host{i}.log", "wb") as log:
                # TMPDIR: torchrun's own log folders (torchelastic_*) and the ranks'
                # temporary files go with the launch's logs, removed when it ends
                procs.append(hosts.popen(i, argv, env=worker_env({"TMPDIR": str(logs),
                                                                  **(env or {})}),
                                         stdout=log, stderr=subprocess.STDOUT))
        ended = [None] * hosts.n
        stopped: list[str | None] = [None] * hosts.n
        deadline, failed_at = started + timeout, None
        while any(e is None for e in ended):
            for i, proc in enumerate(procs):
                if ended[i] is None and proc.poll() is not None:
                    ended[i] = time.monotonic() - started
                    if proc.returncode != 0 and failed_at is None:
                        failed_at = (i, time.monotonic())
            now = time.monotonic()
            late = now > deadline
            given_up = failed_at is not None and now > failed_at[1] + failed_grace_s
            if late or given_up:
                why = (f"still running after {timeout:g} s" if late else
                       f"still running {failed_grace_s:g} s after {hosts.hostname(failed_at[0])}'s"
                       " torchrun failed")
                for i, proc in enumerate(procs):
                    if ended[i] is None:
                        stopped[i] = why
                        hosts.stop(proc)
                        ended[i] = time.monotonic() - started
                break
            time.sleep(0.1)
        runs = []
        for i, proc in enumerate(procs):
            data = (logs / f"host{i}.log").read_bytes()[-tail_chars:]
            runs.append(HostRun(host=i, hostname=hosts.hostname(i),
                                returncode=None if stopped[i] else proc.returncode,
                                output=data.decode(errors="replace"),
                                duration_s=round(ended[i], 3), stopped=stopped[i]))
        return runs
    finally:
        hosts.stop(*procs)
        shutil.rmtree(logs, ignore_errors=True)
