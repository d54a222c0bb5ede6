"""mockccl vs gloo, same run, same 4 rank processes.

One process group ``mock:mockccl,cpu:gloo``: the same collective on mock tensors goes through mockccl
and on CPU tensors through gloo. all_reduce, all_gather and reduce_scatter from 8 B to 256 MiB
(the size is the largest buffer: all_reduce's tensor, all_gather's output, reduce_scatter's
input, as nccl-tests counts it). Each size runs `--rounds` timed rounds in which mockccl and gloo
alternate; the median round is reported (the machine is shared: alternating exposes both to
the same load, the median drops bursts). Prints latency and bus bandwidth per size (nccl-tests
definitions: all_reduce busbw = size/time * 2(n-1)/n, the others size/time * (n-1)/n), the
machine's memcpy bandwidth measured in the same run, and the targets (all_reduce busbw >= 2x
gloo's at >= 1 MiB, 8 B latency <= gloo's). Saves a PNG plot and the raw numbers as JSON.

``--hosts 2``: the ranks on two simulated hosts (network namespaces joined by a veth pair,
:mod:`accelkit.conformance.launchers.hosts`; needs root), ranks 0..n/2-1 on the first: all_reduce across
hosts, mockccl (shared memory within a host, one TCP exchange between the hosts' leaders) vs
gloo (a ring over TCP through every rank). Also counts the bytes that cross between the hosts
(host 0's interface, both directions) per element reduced, and checks mockccl's bus bandwidth
is at least gloo's from 1 MiB up. Results in ``collectives-hosts.{json,png}`` and the section
of bench/README.md between its markers.

    python bench/collectives.py [--out bench/results] [--max-mib 256] [--ranks 4] [--rounds 5]
                                [--hosts 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _ranks import run_on_hosts, run_ranks
from _results import environment, write_section

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
MIB = 1 << 20
#: Where the README section of the run across hosts goes.
HOSTS_BEGIN, HOSTS_END = "<!-- collectives.py --hosts: begin -->", "<!-- collectives.py --hosts: end -->"


def sizes(max_bytes: int, min_bytes: int = 8) -> list[int]:
    out, s = [], 8
    while s <= max_bytes:
        if s >= min_bytes:
            out.append(s)
        s *= 4 if s < 64 * MIB else 2
    if not out or out[-1] != max_bytes:
        out.append(max_bytes)
    return out


def iterations(nbytes: int) -> tuple[int, int]:
    """(warmup, timed per round) iterations: a round moves about 32 MiB (20 calls at most), so
    one descheduling of a rank weighs about as much at every size."""
    timed = max(1, min(20, 32 * MIB // max(nbytes, 1)))
    return max(1, min(10, timed // 2)), timed


def bus_factor(coll: str, n: int) -> float:
    return 2 * (n - 1) / n if coll == "all_reduce" else (n - 1) / n


def memcpy_gbps() -> float:
    """Host memcpy bandwidth (bytes copied per second, GB/s) with 256 MiB buffers."""
    import torch

    src = torch.ones(256 * MIB // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return src.numel() * 4 / min(times) / 1e9


def make_op(coll, nbytes, device, world):
    """The collective on fresh tensors of `device` (mock: mockccl, cpu: gloo), and its size."""
    import torch
    import torch.distributed as dist

    elems = max(1, nbytes // 4)
    elems -= elems % world if coll != "all_reduce" else 0
    elems = max(elems, world if coll != "all_reduce" else 1)
    big = torch.ones(elems, device=device)
    small = torch.ones(elems // world if coll != "all_reduce" else 1, device=device)
    if coll == "all_reduce":
        def op():
            dist.all_reduce(big)
    elif coll == "all_gather":
        def op():
            dist.all_gather_single(big, small)
    else:
        def op():
            dist.reduce_scatter_single(small, big)
    return op, elems * 4


def interface_bytes(ifname: str) -> int:
    """Bytes sent plus received so far on this network namespace's interface `ifname`."""
    stats = Path("/sys/class/net") / ifname / "statistics"
    return int((stats / "tx_bytes").read_text()) + int((stats / "rx_bytes").read_text())


def time_rounds(ops: dict, nbytes: int, rounds: int, ifname: str | None = None):
    """Seconds per call of each op, per round, and (with `ifname`) the interface's bytes per
    call, as this rank counts them. The backends alternate within every round, so a burst of
    load from other jobs on the machine hits both; the slowest rank defines a round's time."""
    import torch
    import torch.distributed as dist

    warmup, timed = iterations(nbytes)
    for op in ops.values():
        for _ in range(warmup):
            op()
    seconds = {name: [] for name in ops}
    wire = {name: [] for name in ops}
    for _ in range(rounds):
        for name, op in ops.items():
            dist.all_reduce(torch.ones(1))  # line the ranks up (through gloo)
            before = interface_bytes(ifname) if ifname else 0
            t0 = time.perf_counter()
            for _ in range(timed):
                op()
            t = torch.tensor([(time.perf_counter() - t0) / timed], dtype=torch.float64)
            if ifname:
                wire[name].append((interface_bytes(ifname) - before) / timed)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            seconds[name].append(t.item())
    return seconds, wire


def rank_main(rank: int, world: int, port: int, out: str, max_bytes: int, min_bytes: int,
              collectives: list[str], rounds: int, master: str = "127.0.0.1",
              ifname: str | None = None) -> None:
    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port))
    import accelkit.backends.mock  # noqa: F401
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.mock.set_device(rank)
    dist.init_process_group("mock:mockccl,cpu:gloo", rank=rank, world_size=world)
    rows = []
    for coll in collectives:
        for nbytes in sizes(max_bytes, min_bytes):
            ops, actual = {}, 0
            for backend, device in (("mockccl", torch.device("mock", rank)), ("gloo", "cpu")):
                ops[backend], actual = make_op(coll, nbytes, device, world)
            timings, wire = time_rounds(ops, nbytes, rounds, ifname if rank == 0 else None)
            for backend, per_round in timings.items():
                seconds = statistics.median(per_round)
                algbw = actual / seconds / 1e9
                rows.append({"collective": coll, "bytes": actual, "backend": backend,
                             "seconds": seconds, "rounds_seconds": per_round,
                             "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(coll, world)})
                if wire[backend]:
                    rows[-1]["interhost_bytes_per_element"] = \
                        statistics.median(wire[backend]) / (actual // 4)
                if rank == 0:
                    print(f"  {coll:15s} {human(actual):>8s} {backend}: {seconds * 1e6:12.1f} us "
                          f"(rounds {min(per_round) * 1e6:.1f}..{max(per_round) * 1e6:.1f})",
                          file=sys.stderr, flush=True)
            del ops
    mem = memcpy_gbps() if rank == 0 else 0.0
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({"world": world, "memcpy_gbps": mem,
                                         "collectives": collectives, "rows": rows}))


def human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def report(data: dict) -> tuple[str, bool]:
    """The results table (markdown) and whether the targets are met."""
    rows = data["rows"]
    by = {(r["collective"], r["bytes"], r["backend"]): r for r in rows}
    lines = ["| collective | size | mockccl latency | gloo latency | mockccl busbw | gloo busbw | "
             "mockccl/gloo busbw |", "|---|---|---|---|---|---|---|"]
    ok = True
    for coll in data["collectives"]:
        for nbytes in sorted({r["bytes"] for r in rows if r["collective"] == coll}):
            m, g = by[(coll, nbytes, "mockccl")], by[(coll, nbytes, "gloo")]
            ratio = m["busbw_gbps"] / g["busbw_gbps"]
            lines.append(f"| {coll} | {human(nbytes)} | {fmt_time(m['seconds'])} | "
                         f"{fmt_time(g['seconds'])} | {m['busbw_gbps']:.2f} GB/s | "
                         f"{g['busbw_gbps']:.2f} GB/s | {ratio:.1f}x |")
    targets = []
    allreduce = [r for r in rows if r["collective"] == "all_reduce"]
    for nbytes in sorted({r["bytes"] for r in allreduce if r["bytes"] >= MIB}):
        ratio = by[("all_reduce", nbytes, "mockccl")]["busbw_gbps"] / \
            by[("all_reduce", nbytes, "gloo")]["busbw_gbps"]
        targets.append((f"all_reduce busbw {human(nbytes)}: {ratio:.1f}x gloo (>= 2x)",
                        ratio >= 2))
    if allreduce:
        small = min(r["bytes"] for r in allreduce)
        m, g = by[("all_reduce", small, "mockccl")], by[("all_reduce", small, "gloo")]
        targets.append((f"all_reduce {small} B latency: mockccl {fmt_time(m['seconds'])} vs gloo "
                        f"{fmt_time(g['seconds'])} (<= gloo)", m["seconds"] <= g["seconds"]))
    lines.append("")
    lines.append(f"memcpy bandwidth (same run, 256 MiB copy_): {data['memcpy_gbps']:.2f} GB/s")
    for coll in data["collectives"]:
        top = max(r["bytes"] for r in rows if r["collective"] == coll)
        m = by[(coll, top, "mockccl")]
        lines.append(f"{coll} {human(top)}: algbw {m['algbw_gbps']:.2f} GB/s = "
                     f"{m['algbw_gbps'] / data['memcpy_gbps']:.0%} of memcpy, busbw "
                     f"{m['busbw_gbps']:.2f} GB/s")
    lines.append("")
    for text, met in targets:
        lines.append(f"{'PASS' if met else 'MISS'}  {text}")
        ok = ok and met
    return "\n".join(lines), ok


def report_hosts(data: dict) -> tuple[str, bool]:
    """The README section of a run across hosts (markdown, between its markers) and whether
    mockccl's all_reduce bus bandwidth is at least gloo's from 1 MiB up."""
    rows = [r for r in data["rows"] if r["collective"] == "all_reduce"]
    by = {(r["bytes"], r["backend"]): r for r in rows}
    env = data["environment"]
    lines = [HOSTS_BEGIN, "",
             f"`python bench/collectives.py --hosts {data['hosts']} --collectives all_reduce`: "
             f"{data['world']} ranks on {data['hosts']} simulated hosts (network namespaces "
             "joined by a veth pair, `accelkit.conformance.launchers.hosts`), measured "
             f"{env['date']} at {env['commit']} with torch {env['torch']} on {env['cpus']} "
             f"CPUs (load average {env['load_before'][0]:.1f} before, "
             f"{env['load_after'][0]:.1f} after); raw results in "
             "`bench/results/collectives-hosts.json`. *Bytes across* are the bytes host 0's "
             "interface sent and received per element reduced (fp32), as the kernel counts "
             "them (TCP/IP headers included).", "",
             "| size | mockccl | gloo | mockccl busbw | gloo busbw | ratio | bytes across, "
             "mockccl | bytes across, gloo |", "|---|---|---|---|---|---|---|---|"]
    ok, checked = True, 0
    for nbytes in sorted({r["bytes"] for r in rows}):
        m, g = by[(nbytes, "mockccl")], by[(nbytes, "gloo")]
        ratio = m["busbw_gbps"] / g["busbw_gbps"]
        if nbytes >= MIB:
            ok, checked = ok and ratio >= 1.0, checked + 1
        lines.append(f"| {human(nbytes)} | {fmt_time(m['seconds'])} | {fmt_time(g['seconds'])} "
                     f"| {m['busbw_gbps']:.2f} GB/s | {g['busbw_gbps']:.2f} GB/s | "
                     f"{ratio:.2f}x | {m['interhost_bytes_per_element']:.1f} | "
                     f"{g['interhost_bytes_per_element']:.1f} |")
    ok = ok and checked > 0
    lines += ["", f"{'PASS' if ok else 'MISS'}  all_reduce across hosts: mockccl's bus bandwidth "
              f">= gloo's at every size from 1 MiB up ({checked} sizes)", "",
              "Where the time goes: mockccl reduces within each host through shared memory and "
              "only the hosts' leaders exchange, each sending its host's partial sum once, so "
              "an element crosses between the hosts once each way (8 bytes per fp32 element, "
              "plus headers); gloo's ring runs over TCP between every pair of neighbours, and "
              "each of its two links between the hosts (one each way) carries 2(n-1)/n of the "
              "buffer (12 bytes per element at 4 ranks). The rest of mockccl's time is the "
              "copies and reductions through shared memory on each host, where gloo also goes "
              "through TCP.", "", HOSTS_END]
    return "\n".join(lines), ok


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = data["collectives"]
    fig, axes = plt.subplots(2, len(colls), figsize=(5 * len(colls), 8), squeeze=False)
    for i, coll in enumerate(colls):
        for backend, style in (("mockccl", "o-"), ("gloo", "s--")):
            rs = sorted((r for r in data["rows"] if r["collective"] == coll and
                         r["backend"] == backend), key=lambda r: r["bytes"])
            x = [r["bytes"] for r in rs]
            axes[0][i].loglog(x, [r["seconds"] * 1e6 for r in rs], style, label=backend)
            axes[1][i].semilogx(x, [r["busbw_gbps"] for r in rs], style, label=backend)
        axes[1][i].axhline(data["memcpy_gbps"], color="grey", linestyle=":", label="memcpy")
        axes[0][i].set_title(f"{coll}, {data['world']} ranks")
        axes[0][i].set_ylabel("latency (µs)")
        axes[1][i].set_ylabel("bus bandwidth (GB/s)")
        axes[1][i].set_xlabel("bytes")
        for ax in (axes[0][i], axes[1][i]):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed rounds per size (mockccl and gloo alternate); median reported")
    parser.add_argument("--collectives", default=None,
                        help="comma-separated subset of " + ",".join(COLLECTIVES) +
                        " (default: all; all_reduce with --hosts)")
    parser.add_argument("--hosts", type=int, default=1,
                        help="simulated hosts the ranks are spread over (network namespaces; "
                        "needs root); 2 or more also writes the README's section across hosts")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1 (the median of the rounds is reported), "
                     f"got {args.rounds}")
    if args.hosts < 1 or args.ranks % args.hosts:
        parser.error(f"--hosts must be at least 1 and divide --ranks ({args.ranks}), got "
                     f"{args.hosts}")
    start = time.monotonic()
    if args.hosts > 1:
        return main_hosts(args, start)
    args.collectives = args.collectives or ",".join(COLLECTIVES)
    raw = args.out / "collectives.json"
    data = run_ranks(__file__, args.ranks, raw, str(args.max_mib * MIB), str(args.min_bytes),
                     args.collectives, str(args.rounds))
    if data is None:
        return 2
    text, ok = report(data)
    print(text)
    plot(data, args.out / "collectives.png")
    print(f"\n{args.ranks} ranks, {time.monotonic() - start:.0f} s; plot: "
          f"{args.out / 'collectives.png'}, numbers: {raw}")
    return 0 if ok else 1


def main_hosts(args, start: float) -> int:
    raw = args.out / "collectives-hosts.json"
    env = environment()
    data = run_on_hosts(__file__, args.ranks, args.hosts, raw, str(args.max_mib * MIB),
                        str(args.min_bytes), args.collectives or "all_reduce", str(args.rounds))
    if data is None:
        return 2
    data.update(hosts=args.hosts, environment={**env, "load_after": os.getloadavg()})
    raw.write_text(json.dumps(data, indent=1))
    section, ok = report_hosts(data)
    print(section)
    write_section(section, HOSTS_BEGIN, HOSTS_END, "mockccl across hosts")
    plot(data, args.out / "collectives-hosts.png")
    print(f"\n{args.ranks} ranks on {args.hosts} hosts, {time.monotonic() - start:.0f} s; "
          f"numbers: {raw}; bench/README.md updated")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), int(os.environ["MASTER_PORT"]), sys.argv[4],
                  int(sys.argv[5]), int(sys.argv[6]), sys.argv[7].split(","), int(sys.argv[8]),
                  *sys.argv[9:11])
    else:
        sys.exit(main())
