"""mockccl's network against peers that do not play by its rules (backends/mock/csrc/mockccl_net.h,
the wire format in mockccl_wire.h, re-implemented here from its comment so the two are checked
against each other).

Two legitimate ranks, 0 on host "a" and 1 on host "b", create one mockccl group per case, each
through its own prefix of one TCPStore that a process of its own serves. A hostile process takes
part in each case:

- outsiders, while rank 0 admits connections: one without the group's secret, one with random
  bytes for a handshake, one that connects and stays silent, one that holds the secret but
  connects from an address rank 1 did not publish: each is turned away and the group forms,
  promptly and with the right result;
- an insider that holds the secret and claims rank 1's connection before rank 1 does: the
  group's creation fails on both ranks, naming the double claim, with no socket left open;
- a rank 0 whose address drops connection attempts: rank 1's creation fails at the group's
  deadline;
- an insider that plays rank 1 through the handshake, then sends a frame claiming 96 GiB, a
  message beyond the kept-message budget, garbage on either connection, rank 0's own collective
  message reflected back, a frame cut short, and seeded random bytes and mutations of a valid
  frame: every one fails rank 0's call with an error naming what was wrong, within seconds,
  with no memory taken for the sizes claimed, and rank 0 lives on.

A last case freezes the store's process (SIGSTOP) and aborts rank 0's group while rank 1 waits
in a collective with it: abort() returns within mockccl_net.h's kPublishWait and rank 1's call
fails within its documented bound, neither waiting for the store.

It runs on one machine (ranks told apart by ACCELKIT_MOCKCCL_HOSTID, on loopback: the outsider
from another address binds 127.0.0.2) and across two simulated hosts (conformance.hosts:
network namespaces; the store, rank 0 and one hostile process on host 0, rank 1 and another on
host 1). ``python tests/mockccl/test_mockccl_hostile.py ROLE OUT`` is the program of every process.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
from support.python import TIME_SCALE

#: The cases in the order they run; each: (name, who takes part besides rank 0).
LEGIT = ("no_secret", "garbage_hello", "silent", "wrong_address")
CLAIM = ("second_claim",)
#: Rank 1 only, against a rank 0 whose published address drops connection attempts.
BLACK_HOLE = ("black_hole",)
INSIDER = ("huge_frame", "kept_budget", "garbage_p2p", "garbage_collective", "reflect",
           "truncated")
FUZZ_ROUNDS = 12
CASES = [*LEGIT, *CLAIM, *BLACK_HOLE, *INSIDER, *(f"fuzz{i}" for i in range(FUZZ_ROUNDS))]
#: Rank 0's budget for messages kept for receives not posted yet (64 MiB; the default is 1 GiB).
KEPT_BYTES = 64 << 20
GROUP_TIMEOUT = timedelta(seconds=10)
BLACK_HOLE_TIMEOUT = timedelta(seconds=3)

# -- mockccl's wire format (mockccl_wire.h) --------------------------------------------------------
HELLO_MAGIC, FRAME_MAGIC, PIECE_MAGIC, VERSION = 0x4D43434E, 0x4D434346, 0x4D434350, 1
COLLECTIVE, P2P = 0, 1


def hello(channel: int, rank: int, size: int, secret: bytes) -> bytes:
    return struct.pack(">IHHII16s", HELLO_MAGIC, VERSION, channel, rank, size, secret)


def frame(sender: int, tag: int, nbytes: int) -> bytes:
    return struct.pack(">IHHIiQ", FRAME_MAGIC, 0, 0, sender, tag, nbytes)


def recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += more
    return data


# -- the processes ------------------------------------------------------------------------------

def _store():
    from torch.distributed import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    timeout=timedelta(seconds=60))


def _case_store(store, case: str):
    from torch.distributed import PrefixStore

    return PrefixStore(f"hostile/{case}", store)


def _outcome(fn):
    start = time.monotonic()
    try:
        value = fn()
        return {"raised": None, "value": value, "seconds": time.monotonic() - start}
    except Exception as e:  # noqa: BLE001  (reported to the test)
        return {"raised": type(e).__name__, "message": str(e), "seconds": time.monotonic() - start}


def store_main(out: str) -> None:
    """Serve the store until every other process said it is done."""
    from torch.distributed import TCPStore

    store = TCPStore("0.0.0.0", int(os.environ["MASTER_PORT"]), is_master=True,
                     wait_for_workers=False, timeout=timedelta(seconds=60))
    Path(os.environ["HOSTILE_STORE_PID_FILE"]).write_text(str(os.getpid()))
    Path(out).write_text("{}")
    while store.add("finished", 0) < int(os.environ["HOSTILE_PROCESSES"]):
        time.sleep(0.1)


def legit_main(rank: int, out: str) -> None:
    import accelkit.backends.mock  # noqa: F401  (the device, and mockccl's module)
    import torch
    from accelkit.backends.mock import mockccl

    dev = torch.device("mock", rank)
    torch.mock.set_device(rank)
    store = _store()
    seen: dict = {}
    mine = [c for c in CASES if c not in BLACK_HOLE] if rank == 0 else [*LEGIT, *CLAIM,
                                                                          *BLACK_HOLE]
    for case in mine:
        s = _case_store(store, case)
        if rank == 1:  # slow to connect: its host known (rank 0 waits for that first), the rest
            s.set("mockccl/host/1", os.environ["ACCELKIT_MOCKCCL_HOSTID"])  # once the hostile
            s.wait(["go"])  # process made its move
        fds = len(os.listdir("/proc/self/fd"))
        timeout = BLACK_HOLE_TIMEOUT if case in BLACK_HOLE else GROUP_TIMEOUT
        connected = _outcome(lambda s=s, t=timeout: mockccl.connect(s, rank, 2, t))
        backend = connected.pop("value", None)
        seen[case] = {"connect": connected}
        if backend is None:  # a failed creation leaves no socket open
            seen[case]["fds_left"] = len(os.listdir("/proc/self/fd")) - fds
        if backend is None:
            continue
        if case in LEGIT:
            t = torch.full((4,), float(rank + 1), device=dev)
            seen[case]["op"] = _outcome(lambda b=backend, t=t: (b.allreduce([t]).wait(),
                                                                t.cpu().tolist())[1])
        elif case in ("garbage_collective", "reflect"):
            t = torch.ones(4, device=dev)
            seen[case]["op"] = _outcome(lambda b=backend, t=t: b.allreduce([t]).wait())
        else:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t = torch.zeros(4, device=dev)
            seen[case]["op"] = _outcome(lambda b=backend, t=t: (b.recv([t], 1, 0).wait(),
                                                                t.cpu().tolist())[1])
            seen[case]["rss_growth_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        del backend
    seen["frozen_store"] = _frozen_store(rank, dev, store)
    Path(out).write_text(json.dumps(seen))
    store.add("finished", 1)


def _frozen_store(rank, dev, store) -> dict:
    """Rank 1 waits in an all_reduce with rank 0; rank 0 freezes the store's process and
    aborts its group: both without waiting for the store."""
    import torch
    from accelkit.backends.mock import mockccl

    s = _case_store(store, "frozen_store")
    if rank == 0:  # the hostile processes are done with the store
        while store.add("hostile/done", 0) < int(os.environ["HOSTILE_HOSTILES"]):
            time.sleep(0.05)
    backend = mockccl.connect(s, rank, 2, timedelta(seconds=60))
    t = torch.ones(4, device=dev)
    backend.allreduce([t]).wait()  # connected and working
    if rank == 1:
        work = backend.allreduce([t])
        s.set("waiting", "1")
        outcome = _outcome(work.wait)
        outcome["at"] = time.time()
        return outcome
    s.wait(["waiting"])
    time.sleep(0.3)  # rank 1 is inside the transport
    store_pid = int(Path(os.environ["HOSTILE_STORE_PID_FILE"]).read_text())
    os.kill(store_pid, signal.SIGSTOP)
    try:
        began = time.time()
        backend.abort()
        aborted = time.time()
        time.sleep(2.0)  # rank 1 fails meanwhile, the store still frozen
    finally:
        os.kill(store_pid, signal.SIGCONT)
    return {"abort_at": began, "abort_s": aborted - began}


def _insider(store, case: str, ip: str, host: str = "b"):
    """Play rank 1 of a 2-rank group through mockccl's handshake: publish a host and an address
    (a listener on `ip`), dial rank 0 on both channels from `ip` with the group's secret.
    Returns {channel: connection}."""
    s = _case_store(store, case)
    s.set("mockccl/host/1", host)
    s.wait(["mockccl/net/secret"])
    secret = s.get("mockccl/net/secret")
    listener = socket.socket()
    listener.bind((ip, 0))
    listener.listen()
    s.set("mockccl/net/1", f"{ip} {listener.getsockname()[1]}")
    s.wait(["mockccl/net/0"])
    address, port = s.get("mockccl/net/0").decode().split()
    conns = {}
    for channel in (P2P, COLLECTIVE):
        conn = socket.socket()
        conn.bind((ip, 0))
        conn.connect((address, int(port)))
        conn.sendall(hello(channel, 1, 2, secret))
        answer = recv_exact(conn, 32)
        assert answer == hello(channel, 0, 2, secret), answer
        conns[channel] = conn
    conns["listener"] = listener
    return conns


def _outsider(store, case: str, ip: str, payload) -> dict:
    """Connect to rank 0 from `ip` while it admits connections, send `payload(secret)` (None:
    nothing), let rank 1 go, and see whether rank 0 answers."""
    s = _case_store(store, case)
    s.wait(["mockccl/net/0", "mockccl/net/secret"])
    address, port = s.get("mockccl/net/0").decode().split()
    conn = socket.socket()
    conn.bind((ip, 0))
    conn.connect((address, int(port)))
    data = payload(s.get("mockccl/net/secret"))
    if data:
        conn.sendall(data)
    s.set("go", "1")
    conn.settimeout(15)
    began = time.monotonic()
    try:
        answer = conn.recv(64)
    except (TimeoutError, ConnectionError):
        answer = b"?"
    conn.close()
    return {"answered": len(answer), "closed_after_s": time.monotonic() - began}


def hostile_main(out: str) -> None:
    store = _store()
    roles = os.environ["HOSTILE_ROLES"].split(",")  # which hosts' parts this process plays
    ip, other_ip = os.environ["HOSTILE_IP"], os.environ.get("HOSTILE_OTHER_IP", "")
    seen: dict = {}
    rng = random.Random(1234)
    for case in CASES:
        if case == "wrong_address":
            if "other" in roles:  # the secret, from an address rank 1 did not publish
                seen[case] = _outsider(store, case, other_ip,
                                       lambda secret: hello(P2P, 1, 2, secret))
            continue
        if "peer" not in roles:
            continue
        if case == "no_secret":
            seen[case] = _outsider(store, case, ip, lambda _: hello(P2P, 1, 2, os.urandom(16)))
        elif case == "garbage_hello":
            seen[case] = _outsider(store, case, ip, lambda _: os.urandom(32))
        elif case == "silent":
            seen[case] = _outsider(store, case, ip, lambda _: b"")
        elif case == "second_claim":
            seen[case] = _outsider(store, case, ip, lambda secret: hello(P2P, 1, 2, secret))
        elif case == "black_hole":
            seen[case] = _black_hole(store, case, ip)
        else:
            seen[case] = _attack(store, case, ip, rng)
    Path(out).write_text(json.dumps(seen))
    store.add("hostile/done", 1)
    store.add("finished", 1)


def _black_hole(store, case: str, ip: str) -> dict:
    """Play rank 0 of a 2-rank group with an address that drops connection attempts (a
    listener whose backlog is full, so the kernel drops SYNs, as a firewall does), until rank 1
    gave up."""
    s = _case_store(store, case)
    s.set("mockccl/host/0", "a")
    s.set("mockccl/net/secret", os.urandom(16))
    listener = socket.socket()
    listener.bind((ip, 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):  # fill the accept queue; further SYNs are dropped
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(listener.getsockname())
        fillers.append(c)
    s.set("mockccl/net/0", f"{ip} {listener.getsockname()[1]}")
    s.set("go", "1")
    s.wait(["mockccl/net/1"])  # rank 1 is dialing
    time.sleep(BLACK_HOLE_TIMEOUT.total_seconds() + 2)
    for c in [*fillers, listener]:
        c.close()
    return {}


def _attack(store, case: str, ip: str, rng: random.Random) -> dict:
    """An insider's misdeed after a valid handshake; what it sent."""
    conns = _insider(store, case, ip)
    p2p, coll = conns[P2P], conns[COLLECTIVE]
    sent: dict = {}
    if case == "huge_frame":
        p2p.sendall(frame(1, 0, 96 << 30))
    elif case == "kept_budget":
        p2p.sendall(frame(1, 7, 100 << 20))
    elif case == "garbage_p2p":
        p2p.sendall(os.urandom(64))
    elif case == "garbage_collective":
        coll.sendall(os.urandom(96))
    elif case == "reflect":  # rank 0's first collective message (its agree-step header) back
        head = recv_exact(coll, 32)
        body = recv_exact(coll, struct.unpack(">Q", head[24:32])[0])
        coll.sendall(head + body)
    elif case == "truncated":
        p2p.sendall(frame(1, 0, 16)[:10])
    else:  # fuzz: random bytes, a mutated valid message, or one cut short; then close
        body = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
        valid = frame(1, 0, len(body)) + body
        how = rng.choice(["random", "mutated", "cut"])
        if how == "random":
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
        elif how == "mutated":  # the header: a body's bytes are the sender's to choose
            data = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(24)] ^= 1 << rng.randrange(8)
            data = bytes(data)
        else:
            data = valid[:rng.randrange(0, len(valid))]
        p2p.sendall(data)
        sent = {"how": how, "valid": data == valid}
    time.sleep(0.5)  # rank 0 reads it before the connections close
    for conn in conns.values():
        conn.close()
    return sent


# -- the test side ------------------------------------------------------------------------------

def _roles(layout: str) -> list[tuple[str, int, dict]]:
    """(role, host, environment) of each process."""
    hostid = layout == "one-machine"
    env0 = {"ACCELKIT_MOCKCCL_KEPT_BYTES": str(KEPT_BYTES)}
    if hostid:
        local = {"ACCELKIT_MOCKCCL_SOCKET_IFNAME": "lo"}
        return [("store", 0, {}),
                ("rank0", 0, {**env0, **local, "ACCELKIT_MOCKCCL_HOSTID": "a"}),
                ("rank1", 0, {**local, "ACCELKIT_MOCKCCL_HOSTID": "b"}),
                ("hostile", 0, {"HOSTILE_ROLES": "peer,other", "HOSTILE_IP": "127.0.0.1",
                                "HOSTILE_OTHER_IP": "127.0.0.2"})]
    from accelkit.conformance.launchers.hosts import SUBNET

    return [("store", 0, {}), ("rank0", 0, {**env0, "ACCELKIT_MOCKCCL_HOSTID": "a"}),
            ("rank1", 1, {"ACCELKIT_MOCKCCL_HOSTID": "b"}),
            ("hostile", 0, {"HOSTILE_ROLES": "other", "HOSTILE_IP": f"{SUBNET}.1",
                            "HOSTILE_OTHER_IP": f"{SUBNET}.1"}),
            ("hostile", 1, {"HOSTILE_ROLES": "peer", "HOSTILE_IP": f"{SUBNET}.2"})]


def _run(layout: str, out: Path, timeout: float = 240) -> dict:
    from support.ranks import build_extensions, free_port

    build_extensions()
    roles = _roles(layout)
    pid_file = out / "store.pid"
    common = {"OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
              "HOSTILE_STORE_PID_FILE": str(pid_file),
              "HOSTILE_PROCESSES": str(len(roles) - 1),
              "HOSTILE_HOSTILES": str(sum(role == "hostile" for role, _, _ in roles))}
    outputs = [out / f"{i}-{role}.json" for i, (role, _, _) in enumerate(roles)]
    if layout == "one-machine":
        common.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        procs = [subprocess.Popen([sys.executable, __file__, role, str(path)],
                                  env={**os.environ, **common, **env}, start_new_session=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for (role, _, env), path in zip(roles, outputs, strict=True)]
        return _collect(procs, roles, outputs, timeout, kill=lambda p: os.killpg(p.pid, 9))
    from accelkit.conformance.launchers.hosts import Hosts, worker_env

    with Hosts(2) as hosts:
        common.update(MASTER_ADDR=hosts.address(0), MASTER_PORT=str(hosts.port()))
        procs = [hosts.popen(host, [sys.executable, __file__, role, str(path)],
                             env=worker_env({**common, **env}), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
                 for (role, host, env), path in zip(roles, outputs, strict=True)]
        return _collect(procs, roles, outputs, timeout, kill=hosts.stop)


def _collect(procs, roles, outputs, timeout, kill) -> dict:
    """Wait for every process (all of them stopped at the timeout, or soon after one failed);
    each one's results, by role."""
    deadline, failed_at = time.monotonic() + timeout, None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + 20):
            for p in procs:
                if p.poll() is None:
                    kill(p)
            break
        time.sleep(0.1)
    logs = [p.communicate()[0] for p in procs]
    failed = [f"--- {role} (exit {p.returncode}):\n{log[-3000:]}"
              for (role, _, _), p, log in zip(roles, procs, logs, strict=True) if p.returncode]
    assert not failed, "\n".join(failed)
    seen = {}
    for (role, _, _), path in zip(roles, outputs, strict=True):
        data = json.loads(path.read_text())
        if role == "hostile":
            seen.setdefault("hostile", {}).update(data)
        elif role != "store":
            seen[role] = data
    return seen


def _hosts_unavailable() -> str | None:
    from accelkit.conformance.launchers.hosts import unavailable

    return unavailable()


LAYOUTS = ["one-machine", "two-hosts"]


@pytest.fixture(scope="module", params=LAYOUTS)
def run(request, tmp_path_factory):
    if request.param == "two-hosts" and (why := _hosts_unavailable()):
        pytest.skip(why)
    return _run(request.param, tmp_path_factory.mktemp(f"hostile-{request.param}"))


@pytest.mark.parametrize("case", LEGIT)
def test_an_outsider_is_turned_away_and_the_group_forms(run, case):
    """Each outsider gets no answer (closed within the handshake wait) while rank 0 admits
    rank 1: the group forms promptly (a silent connection holds nothing up: creation took less
    than the handshake wait) and all_reduce gives the right sum on both ranks."""
    hostile = run["hostile"][case]
    assert hostile["answered"] == 0, hostile
    assert hostile["closed_after_s"] < 5 * TIME_SCALE, hostile
    for rank in ("rank0", "rank1"):
        seen = run[rank][case]
        assert seen["connect"]["raised"] is None, seen
        assert seen["connect"]["seconds"] < 1.8 * TIME_SCALE, seen  # mockccl_net.h's kHelloWait is 2 s
        assert seen["op"] == {**seen["op"], "raised": None, "value": [3.0] * 4}, seen


def test_a_peer_whose_address_drops_connections_fails_the_creation_at_its_deadline(run):
    """Rank 0's published address drops connection attempts (a firewall): rank 1's creation
    fails at the group's deadline (3 s here), naming the connection that did not complete (a
    blocking connect() waited out the kernel's retries, about two minutes), and leaves no
    socket open."""
    seen = run["rank1"]["black_hole"]
    connect = seen["connect"]
    assert connect["raised"] == "DistBackendError", connect
    assert re.search(r"timed out after \d+ ms on rank 1: its point-to-point connection to rank 0 "
                     r"\(host 'a'\) at [\d.]+ \d+ did not complete", connect["message"]), connect
    assert connect["seconds"] < 3 + 2 * TIME_SCALE, connect
    assert seen["fds_left"] == 0, seen


def test_a_second_claim_on_a_rank_fails_the_creation_everywhere_naming_it(run):
    """An insider (the group's secret, rank 1's address) that claims rank 1's connection first
    is answered; rank 1's own claim then fails rank 0's creation naming the double claim, and
    rank 1's creation fails within seconds naming rank 0's failure (not at its timeout)."""
    zero, one = run["rank0"]["second_claim"]["connect"], run["rank1"]["second_claim"]["connect"]
    assert zero["raised"] == "DistBackendError", zero
    assert "a second connection claims to be rank 1 (host 'b')'s point-to-point connection" in \
        zero["message"], zero
    assert one["raised"] == "DistBackendError", one
    assert "rank 0 (host 'a') failed" in one["message"] and "a second connection claims" in \
        one["message"], one
    assert max(zero["seconds"], one["seconds"]) < 5 * TIME_SCALE, (zero, one)
    assert run["rank0"]["second_claim"]["fds_left"] == 0
    assert run["rank1"]["second_claim"]["fds_left"] == 0


#: What rank 0's call raises for each insider's misdeed.
INSIDER_ERRORS = {
    "huge_frame": "rank 1 (host 'b') sent a message of 103079215104 bytes (tag 0), more than the "
                  "largest receive this rank can post",
    "kept_budget": f"rank 1 (host 'b') sent 104857600 bytes with tag 7 that no receive has asked "
                   f"for, beyond the {KEPT_BYTES} bytes of such messages a peer may have waiting",
    "garbage_p2p": "rank 1 (host 'b') sent bytes that are not a mockccl message header",
    "garbage_collective": "rank 1 (host 'b') sent bytes that are not a mockccl collective message",
    "reflect": "rank 1 (host 'b') sent a collective message from rank 0 on its collective "
               "connection",
    "truncated": "the connection to rank 1 (host 'b') closed",
}


@pytest.mark.parametrize("case", INSIDER)
def test_an_admitted_peer_that_breaks_the_protocol_fails_the_call_naming_it(run, case):
    """Rank 0's call raises within seconds naming what the peer did; a size claimed on the wire
    takes no memory (rank 0's peak resident size grows by less than 64 MiB)."""
    seen = run["rank0"][case]
    assert seen["connect"]["raised"] is None, seen
    op = seen["op"]
    assert op["raised"] == "DistBackendError", op
    assert INSIDER_ERRORS[case] in op["message"], op
    assert op["seconds"] < 5 * TIME_SCALE, op
    if "rss_growth_kib" in seen:
        assert seen["rss_growth_kib"] < 64 << 10, seen


def test_fuzzed_bytes_give_the_right_message_or_a_named_error(run):
    """Seeded random bytes, bit flips of a valid frame and cuts of it: rank 0's receive either
    gets exactly the valid message or raises a DistBackendError naming rank 1; never another
    value, never a crash (rank 0 went on to the next round and exited cleanly)."""
    hows = set()
    for i in range(FUZZ_ROUNDS):
        case = f"fuzz{i}"
        sent, op = run["hostile"][case], run["rank0"][case]["op"]
        hows.add(sent["how"])
        if op["raised"] is None:
            assert sent["valid"] and op["value"] == [1.0, 2.0, 3.0, 4.0], (sent, op)
        else:
            assert op["raised"] == "DistBackendError" and "rank 1" in op["message"], (sent, op)
            assert op["seconds"] < 5 * TIME_SCALE, (sent, op)
    assert hows == {"random", "mutated", "cut"}, hows


def test_abort_and_a_peers_failure_do_not_wait_for_a_frozen_store(run):
    """The store's process stopped (SIGSTOP): rank 0's abort() returns within kPublishWait
    (250 ms, plus scheduling), and rank 1's all_reduce that waited on rank 0 fails within
    mockccl_net.h's bound (550 ms, plus scheduling) of the abort, naming the closed
    connection."""
    zero, one = run["rank0"]["frozen_store"], run["rank1"]["frozen_store"]
    assert zero["abort_s"] < 0.6 * TIME_SCALE, zero
    assert one["raised"] == "DistBackendError", one
    assert "the connection to rank 0 (host 'a') closed" in one["message"], one
    assert one["at"] - zero["abort_at"] < 1.5 * TIME_SCALE, (zero, one)


if __name__ == "__main__":
    role, out = sys.argv[1], sys.argv[2]
    try:
        {"store": store_main, "rank0": lambda o: legit_main(0, o),
         "rank1": lambda o: legit_main(1, o), "hostile": hostile_main}[role](out)
    except Exception:
        traceback.print_exc()
        raise
