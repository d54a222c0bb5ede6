"""The simulated hosts themselves (``accelkit.conformance.launchers.hosts``), without torch: each host has
its own network namespace, hostname, /dev/shm and PID namespace, shared by every process
started on it, every host reaches the others' addresses, and leaving the ``with`` block
(normally or on an exception) kills everything the hosts started and deletes every namespace. SKIPped, with the reason, where namespaces cannot be made (not root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import engine_env  # tests/fixtures (tests/conftest.py)
import pytest
from accelkit.conformance.launchers import hosts as hosts_mod
from accelkit.conformance.launchers.hosts import Hosts, HostsError

_REASON = hosts_mod.unavailable(hosts=3)
needs_hosts = pytest.mark.skipif(_REASON is not None, reason=str(_REASON))

# Echo one line back on ADDRESS:PORT, once (the server side of a reachability test).
_SERVE = """
import socket, sys
with socket.create_server((sys.argv[1], int(sys.argv[2]))) as server:
    print("listening", flush=True)
    conn, _ = server.accept()
    with conn:
        conn.sendall(conn.recv(100) + b" back from " + socket.gethostname().encode())
"""
_ASK = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as conn:
    conn.sendall(sys.argv[3].encode())
    print(conn.recv(200).decode())
"""


def _machine_links() -> list[str]:
    proc = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return sorted(line.split(":")[1].strip() for line in proc.stdout.splitlines())


def _ours(hosts: Hosts) -> list[str]:
    names = {hosts.namespace(i) for i in range(hosts.n)}
    prefix = hosts.namespace(0).rsplit("-", 1)[0] + "-"
    return [n for n in hosts_mod.namespaces() if n in names or n.startswith(prefix)]


def _reach(hosts: Hosts, server: int, client: int) -> str:
    """What host ``client`` gets back from an echo server on host ``server``'s address."""
    port = hosts.port()
    proc = hosts.popen(server, [sys.executable, "-c", _SERVE, hosts.address(server), str(port)],
                       stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "listening\n"
    asked = hosts.run(client, [sys.executable, "-c", _ASK, hosts.address(server), str(port),
                               f"hello from {hosts.hostname(client)}"], timeout=30)
    assert proc.wait(30) == 0
    assert asked.returncode == 0, asked.stderr
    return asked.stdout.strip()


@needs_hosts
def test_each_host_has_its_own_hostname_shm_and_reaches_the_other():
    """Two hosts: each sees its own hostname (not the machine's) and resolves the other's to
    its address; a file put in one host's /dev/shm is visible there only (not in the other's,
    not in the machine's); each reaches the other's address over TCP; the machine has none of
    their interfaces or addresses."""
    links = _machine_links()
    with Hosts(2) as hosts:
        assert len(set(_ours(hosts))) == 2
        names = [hosts.run(i, ["cat", "/proc/sys/kernel/hostname"]).stdout.strip()
                 for i in range(2)]
        assert names == ["accelkit-host0", "accelkit-host1"]
        assert os.uname().nodename not in names
        resolved = hosts.run(1, ["getent", "hosts", hosts.hostname(0)]).stdout.split()
        assert resolved == [hosts.address(0), hosts.hostname(0)]

        shm = f"accelkit-hosts-test-{uuid.uuid4().hex}"
        try:
            made = hosts.run(0, ["sh", "-c", f"echo x > /dev/shm/{shm} && ls /dev/shm"])
            assert made.returncode == 0 and made.stdout.split() == [shm], made
            assert hosts.run(1, ["ls", "-A", "/dev/shm"]).stdout == ""
            assert not (Path("/dev/shm") / shm).exists()
        finally:  # where /dev/shm is not private, the file is the machine's
            (Path("/dev/shm") / shm).unlink(missing_ok=True)

        assert _reach(hosts, 0, 1) == "hello from accelkit-host1 back from accelkit-host0"
        assert _reach(hosts, 1, 0) == "hello from accelkit-host0 back from accelkit-host1"
        machine = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        assert hosts_mod.SUBNET not in machine
        assert _machine_links() == links
    assert _machine_links() == links


@needs_hosts
def test_processes_started_on_one_host_share_it(tmp_path):
    """A host is one machine for everything started on it: two processes started by two
    ``popen`` calls on host 0 see the same hostname, each other's /dev/shm files and PIDs (one
    PID namespace), while host 1 sees neither the files nor the hostname; a file stays in the
    host's /dev/shm after the process that made it ended. A ``popen`` runs in the caller's
    working directory (or ``cwd``), returns the command's exit status, and a SIGTERM from
    :meth:`Hosts.stop` reaches the command, whose exit status it returns."""
    shm = f"accelkit-hosts-test-{uuid.uuid4().hex}"
    maker = (f"trap 'exit 7' TERM; echo $$ > /dev/shm/{shm}; cat /proc/sys/kernel/hostname; "
             "sleep 600 & wait")
    try:
        with Hosts(2, stop_grace_s=10) as hosts:
            first = hosts.popen(0, ["sh", "-c", maker], stdout=subprocess.PIPE, text=True)
            assert first.stdout.readline().strip() == hosts.hostname(0)
            second = hosts.run(0, ["sh", "-c", f"cat /proc/sys/kernel/hostname; "
                                               f"pid=$(cat /dev/shm/{shm}); echo $pid; "
                                               "tr '\\0' ' ' < /proc/$pid/cmdline"])
            assert second.returncode == 0, second
            name, pid, cmdline = second.stdout.splitlines()
            assert name == hosts.hostname(0)
            assert cmdline.startswith("sh -c trap "), cmdline  # first's process, by its PID
            other = hosts.run(1, ["sh", "-c", "cat /proc/sys/kernel/hostname; ls -A /dev/shm"])
            assert other.stdout.split() == [hosts.hostname(1)], other

            hosts.stop(first)
            assert first.returncode == 7
            assert first.stdout.read() == ""
            assert hosts.run(0, ["ls", "-A", "/dev/shm"]).stdout.split() == [shm]
            assert not (Path("/dev/shm") / shm).exists()

            assert hosts.run(1, ["pwd"], cwd=tmp_path).stdout.strip() == str(tmp_path)
            assert hosts.run(0, ["sh", "-c", "pwd; exit 3"], cwd=tmp_path).returncode == 3
    finally:  # where /dev/shm is not private, the file is the machine's
        (Path("/dev/shm") / shm).unlink(missing_ok=True)


@needs_hosts
def test_three_hosts_through_a_switch():
    """Three hosts (a bridge in a namespace of its own): the first and the last reach each
    other; cleanup deletes the switch's namespace too."""
    with Hosts(3) as hosts:
        assert len(_ours(hosts)) == 4
        assert _reach(hosts, 2, 0) == "hello from accelkit-host0 back from accelkit-host2"
        assert _reach(hosts, 1, 2) == "hello from accelkit-host2 back from accelkit-host1"
    assert _ours(hosts) == []


@needs_hosts
@pytest.mark.parametrize("leave_by", ["end", "exception", "interrupt"])
def test_leaving_kills_every_process_and_deletes_every_namespace(leave_by):
    """Each host runs a process that ignores SIGTERM and one that left the process group
    (``setsid``, as torchrun's workers do); on leaving the block, normally, by an exception or
    by Ctrl-C (KeyboardInterrupt), none of them survives, and neither does any namespace or
    interface."""
    env, marker = engine_env.new_env()
    links = _machine_links()
    stubborn = "trap '' TERM; setsid sleep 600 & sleep 600 & wait"
    started = time.monotonic()
    leaving = pytest.raises((RuntimeError, KeyboardInterrupt)) if leave_by != "end" else (
        contextlib.nullcontext())
    with leaving:
        with Hosts(2, stop_grace_s=1) as hosts:
            for i in range(2):
                hosts.popen(i, ["sh", "-c", stubborn], env=env)
            deadline = time.monotonic() + 10
            while len(_sleeping(marker)) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(_sleeping(marker)) == 4, engine_env.marked_processes(marker)
            if leave_by == "exception":
                raise RuntimeError("a failing test")
            if leave_by == "interrupt":
                raise KeyboardInterrupt
    assert time.monotonic() - started < 30
    assert engine_env.marked_processes(marker) == []
    assert _ours(hosts) == []
    assert _machine_links() == links


def _sleeping(marker: str) -> list[str]:
    return [p for p in engine_env.marked_processes(marker)
            if p.split(" ", 2)[2].startswith("sleep 600")]


_OWNER = """
import sys
import tempfile
from accelkit.conformance.launchers.hosts import Hosts
hosts = Hosts(2).__enter__()
for i in range(2):
    hosts.popen(i, ["sleep", "600"])
print(" ".join(hosts.namespace(i) for i in range(2)), flush=True)
sys.stdin.read()
"""


@needs_hosts
def test_an_owner_killed_outright_leaves_no_process_and_its_namespaces_are_swept():
    """The process that made the hosts is SIGKILLed (no cleanup runs): what its hosts ran dies
    with it (``setpriv --pdeathsig``, then the PID namespaces), and the next :class:`Hosts`
    deletes the namespaces it left."""
    env, marker = engine_env.new_env()
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        names = owner.stdout.readline().split()
        assert len(names) == 2, owner.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while len(_sleeping(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_sleeping(marker)) == 2, engine_env.marked_processes(marker)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 10
    while engine_env.marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine_env.marked_processes(marker) == []
    assert set(names) <= set(hosts_mod.namespaces())  # nothing deleted them yet
    with Hosts(2):
        assert not set(names) & set(hosts_mod.namespaces())


@needs_hosts
def test_sweep_deletes_namespaces_of_a_dead_owner_only():
    """A namespace named for a process that no longer runs (killed before it cleaned up) is
    deleted by :func:`sweep`; one of a live process is left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"accelkit-{dead.pid}-1-0", f"accelkit-{os.getpid()}-999999-0"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert stale in hosts_mod.sweep()
        names = hosts_mod.namespaces()
        assert stale not in names and live in names
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@needs_hosts
def test_errors_name_the_command_and_its_error():
    """A failing setup command is reported with its command line and its stderr."""
    with pytest.raises(HostsError) as info:
        hosts_mod._run(["ip", "netns", "del", "accelkit-no-such-namespace"])
    assert "`ip netns del accelkit-no-such-namespace` failed (exit 1): " in str(info.value)
    assert "No such file or directory" in str(info.value)
    with pytest.raises(HostsError, match="inside their `with Hosts"):
        Hosts(2).popen(0, ["true"])
    for n in (1, hosts_mod.MAX_HOSTS + 1):
        with pytest.raises(ValueError, match=rf"Hosts\(n\): n must be 2\.\.253, not {n}"):
            Hosts(n)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run a process as another user")
def test_unavailable_names_why_for_a_user_that_is_not_root():
    """As an unprivileged user, :func:`unavailable` says that root is needed (tests SKIP with
    it) instead of failing later."""
    # The module alone (it needs the standard library only), where that user can read it: the
    # installed package may sit in a folder only root can enter (tox's .tox is 0700).
    folder = Path(tempfile.mkdtemp(prefix="accelkit-hosts-module-"))
    try:
        folder.chmod(0o755)
        shutil.copy(hosts_mod.__file__, folder / "hosts_module.py")
        (folder / "hosts_module.py").chmod(0o644)
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-I",
             "-c", f"import sys; sys.path.insert(0, {str(folder)!r}); "
             "from hosts_module import unavailable; print(unavailable())"],
            capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("simulated hosts need root (network, mount and PID "
                                   "namespaces); this process runs as uid 65534")
