"""Mock device vs CPU, same process, same thread count (the mock's speed targets).

Run: ``python bench/ops.py`` (``--repeat N``, ``--json``). Every case times the same op on
CPU tensors and on mock tensors (medians of N timed batches) and prints mock/CPU with the
target; exit status 1 if a ratio misses its target. Single-threaded (``torch.set_num_threads(1)``)
so the 2-core CI machines give stable ratios. The mock runs in the mode its environment sets
(``ACCELKIT_MOCK_ASYNC=1``: a batch's time includes waiting for its queued kernels, so queued
work is paid for, not hidden).

In the asynchronous mode it also measures that every op is a launch: for ops with a native
kernel, through the fallback, in place and random, 4 back-to-back calls on large tensors, the
time until the calls return over the time until ``torch.mock.synchronize()`` returns (target
below :data:`LAUNCH_TARGET`; a synchronous op scores 1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import accelkit.backends.mock  # noqa: E402,F401  (registers torch.mock)
import torch  # noqa: E402
from _timing import returned_and_done  # noqa: E402


def _median_seconds(fn: Callable[[], object], repeat: int, inner: int,
                    sync: Callable[[], object]) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def _alloc_free(device: str) -> Callable[[], object]:
    """Allocate and free a 4 MiB tensor (the caching allocator's reuse path on the mock)."""
    def once() -> None:
        t = torch.empty(1 << 20, device=device)
        del t
    return once


def _cases(device: str) -> dict[str, tuple[Callable[[], object], int]]:
    """name -> (op on `device`, inner loop count)."""
    g = torch.Generator().manual_seed(0)
    a = torch.rand(1 << 20, generator=g).to(device)
    b = torch.rand(1 << 20, generator=g).to(device)
    m1 = torch.rand(1024, 1024, generator=g).to(device)
    m2 = torch.rand(1024, 1024, generator=g).to(device)
    big = torch.empty(1 << 24, device=device)
    t1 = torch.rand(8, generator=g).to(device)
    t2 = torch.rand(8, generator=g).to(device)
    return {
        "add_1M_f32": (lambda: torch.add(a, b), 20),
        "matmul_1024": (lambda: torch.mm(m1, m2), 2),
        "uniform_16M": (lambda: big.uniform_(), 1),
        "add_8_tiny": (lambda: torch.add(t1, t2), 2000),
        "alloc_free_4M": (_alloc_free(device), 2000),
    }


#: name -> the largest mock/CPU ratio the mock's speed targets accept.
TARGETS = {"add_1M_f32": 1.3, "matmul_1024": 1.1, "uniform_16M": 1.0, "add_8_tiny": 3.0,
           "alloc_free_4M": 1.5}

#: The asynchronous mode's tiny op: a launch hands the kernel to the stream's thread (a queued
#: closure that keeps the output's memory alive, a lock shared with that thread), which costs
#: a few microseconds as a CUDA launch does; the other targets are the same in both modes.
ASYNC_TARGETS = {**TARGETS, "add_8_tiny": 6.0}


#: Largest share of the time to completion the calls may take to return, in the asynchronous mode.
LAUNCH_TARGET = 0.3
#: Back-to-back calls per launch measurement.
LAUNCH_CALLS = 4


def _launch_cases() -> dict[str, Callable[[], object]]:
    """name -> an op on 16M-element float32 mock tensors (matmul: 1024x1024)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1 << 24, generator=g).to("mock")
    y = torch.rand(1 << 24, generator=g).to("mock")
    m = torch.rand(1024, 1024, generator=g).to("mock")
    return {
        "matmul_1024": lambda: torch.mm(m, m),
        "relu_16M": lambda: torch.relu(x),
        "sum_16M": lambda: x.sum(),
        "exp_16M": lambda: torch.exp(x),
        "mul__16M": lambda: y.mul_(1.0),
        "uniform__16M": lambda: y.uniform_(),
        "add_16M": lambda: torch.add(x, y),
    }


def launch_ratios(repeat: int) -> dict[str, dict[str, float]]:
    """Per case, medians over ``repeat`` rounds of: seconds until LAUNCH_CALLS calls returned,
    seconds until synchronize() returned after them, and their ratio."""
    torch.set_num_threads(1)
    out = {}
    for name, fn in _launch_cases().items():
        fn()
        torch.mock.synchronize()
        returned, done = returned_and_done(fn, LAUNCH_CALLS, repeat, torch.mock.synchronize)
        ratios = [r / d for r, d in zip(returned, done, strict=True)]
        out[name] = {"returned_s": statistics.median(returned), "done_s": statistics.median(done),
                     "ratio": statistics.median(ratios), "target": LAUNCH_TARGET}
    return out


def run(repeat: int) -> dict[str, dict[str, float]]:
    """Median seconds per op on cpu and mock, interleaved per case, and the ratio."""
    torch.set_num_threads(1)
    cpu, mock = _cases("cpu"), _cases("mock")
    targets = ASYNC_TARGETS if torch.mock.is_async() else TARGETS
    out = {}
    for name in cpu:
        fc, inner = cpu[name]
        fm, _ = mock[name]
        tc, tm = [], []
        for _ in range(3):  # interleave to share the machine's noise
            tc.append(_median_seconds(fc, repeat, inner, lambda: None))
            tm.append(_median_seconds(fm, repeat, inner, torch.mock.synchronize))
        c, m = min(tc), min(tm)
        out[name] = {"cpu_s": c, "mock_s": m, "ratio": m / c, "target": targets[name]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed batches per measurement")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    results = run(args.repeat)
    launches = launch_ratios(args.repeat) if torch.mock.is_async() else {}
    if args.json:
        print(json.dumps({"ops": results, "launches": launches,
                          "host_accessible": torch.mock.host_accessible(),
                          "async": torch.mock.is_async(), "torch": torch.__version__,
                          "load": os.getloadavg()}, indent=2))
    else:
        mode = ("discrete" if not torch.mock.host_accessible() else "host memory") + \
            (", asynchronous" if torch.mock.is_async() else ", synchronous")
        print(f"mock: {mode}")
        print(f"{'case':<14}{'cpu':>12}{'mock':>12}{'mock/cpu':>10}{'target':>8}")
        for name, r in results.items():
            ok = "ok" if r["ratio"] <= r["target"] else "MISS"
            print(f"{name:<14}{r['cpu_s'] * 1e6:>10.1f}us{r['mock_s'] * 1e6:>10.1f}us"
                  f"{r['ratio']:>10.2f}{r['target']:>7.1f}x {ok}")
        if launches:
            print(f"\n{LAUNCH_CALLS} calls: until they return / until synchronize() returns")
            print(f"{'case':<14}{'returned':>12}{'done':>12}{'ratio':>10}{'target':>8}")
            for name, r in launches.items():
                ok = "ok" if r["ratio"] < r["target"] else "MISS"
                print(f"{name:<14}{r['returned_s'] * 1e3:>10.1f}ms{r['done_s'] * 1e3:>10.1f}ms"
                      f"{r['ratio']:>10.3f}{r['target']:>7.2f} {ok}")
    ok = all(r["ratio"] <= r["target"] for r in results.values()) and \
        all(r["ratio"] < r["target"] for r in launches.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
