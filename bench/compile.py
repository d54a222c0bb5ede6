"""torch.compile on the mock vs eager mock vs compiled CPU, same process, same thread count.

Run: ``python bench/compile.py`` (``--repeat N``, ``--rounds N``, ``--cache-dir DIR``,
``--json``). Two programs, each timed eager on mock, compiled (Inductor, the default backend)
on mock and compiled on CPU, interleaved round by round (best of the rounds' medians):

- ``chain_16M``: 9 elementwise ops on two 16M-element float32 tensors (eager: 9 kernels and 8
  temporaries; compiled: one fused C++ kernel);
- ``mlp_step``: forward, loss and backward of a 256-512-256 MLP on a batch of 64.

Targets: compiled mock at least 2x faster than eager mock on the chain; compiled mock at most
1.2x compiled CPU on both. The first compiled call's time (tracing, Inductor, the C++ build)
is printed too: by default Inductor's caches start empty in a temporary directory, so it is a
cold compile; ``--cache-dir`` reuses a directory (a second run then measures a warm one).
Single-threaded (``torch.set_num_threads(1)``) like ``bench/ops.py``; exit status 1 if a ratio
misses its target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _chain(x, y):
    a = x * 1.5 + y          # mul, add
    b = (a - 0.25).abs()     # sub, abs
    c = b.clamp(max=3.0) * y  # clamp, mul
    return (c + x).relu().sin()  # add, relu, sin: 9 ops in all


def _median_seconds(fn: Callable[[], object], repeat: int, inner: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def _programs(device: str, compiled: bool) -> dict[str, tuple[Callable[[], object], int, float]]:
    """name -> (one run of the program on ``device``, inner loop count, first-call seconds)."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(0)
    x = torch.rand(1 << 24, generator=g).to(device)
    y = torch.rand(1 << 24, generator=g).to(device)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
    model = model.to(device)
    batch = torch.rand(64, 256, generator=g).to(device)

    def loss(inputs):
        return model(inputs).pow(2).mean()

    chain = torch.compile(_chain) if compiled else _chain
    forward = torch.compile(loss) if compiled else loss

    def step():
        model.zero_grad(set_to_none=True)
        forward(batch).backward()

    out = {}
    for name, fn, inner in (("chain_16M", lambda: chain(x, y), 1), ("mlp_step", step, 20)):
        start = time.perf_counter()
        fn()
        first = time.perf_counter() - start
        out[name] = (fn, inner, first)
    return out


#: Targets: eager mock / compiled mock (at least), compiled mock / compiled CPU (at most).
SPEEDUP_TARGETS = {"chain_16M": 2.0}
VS_CPU_TARGETS = {"chain_16M": 1.2, "mlp_step": 1.2}


def run(repeat: int, rounds: int) -> dict[str, dict[str, float]]:
    import accelkit.backends.mock  # noqa: F401  (registers torch.mock)
    import torch

    torch.set_num_threads(1)
    sides = {"eager_mock": _programs("mock", False), "compiled_mock": _programs("mock", True),
             "compiled_cpu": _programs("cpu", True), "eager_cpu": _programs("cpu", False)}
    out = {}
    for name in sides["eager_mock"]:
        best = {side: float("inf") for side in sides}
        for _ in range(rounds):  # interleaved, so the sides share the machine's noise
            for side, programs in sides.items():
                fn, inner, _ = programs[name]
                best[side] = min(best[side], _median_seconds(fn, repeat, inner))
        out[name] = {f"{side}_s": s for side, s in best.items()}
        out[name]["compile_mock_s"] = sides["compiled_mock"][name][2]
        out[name]["compile_cpu_s"] = sides["compiled_cpu"][name][2]
        out[name]["speedup"] = best["eager_mock"] / best["compiled_mock"]
        out[name]["vs_cpu"] = best["compiled_mock"] / best["compiled_cpu"]
    return out


def _misses(results: dict[str, dict[str, float]]) -> list[str]:
    misses = [f"{n}: compiled mock only {results[n]['speedup']:.2f}x faster than eager "
              f"(target {t}x)" for n, t in SPEEDUP_TARGETS.items() if results[n]["speedup"] < t]
    misses += [f"{n}: compiled mock {results[n]['vs_cpu']:.2f}x compiled CPU (target {t}x)"
               for n, t in VS_CPU_TARGETS.items() if results[n]["vs_cpu"] > t]
    return misses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed batches per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="Inductor cache directory to use (default: a new, empty one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.rounds < 1:
        parser.error("--repeat and --rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="accelkit-bench-inductor-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.cache_dir or tmp
        results = run(args.repeat, args.rounds)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'case':<11}{'eager mock':>12}{'comp. mock':>12}{'comp. cpu':>12}"
              f"{'eager cpu':>12}{'speedup':>9}{'vs cpu':>8}{'compile mock/cpu':>18}")
        for name, r in results.items():
            print(f"{name:<11}{r['eager_mock_s'] * 1e3:>10.2f}ms{r['compiled_mock_s'] * 1e3:>10.2f}ms"
                  f"{r['compiled_cpu_s'] * 1e3:>10.2f}ms{r['eager_cpu_s'] * 1e3:>10.2f}ms"
                  f"{r['speedup']:>8.2f}x{r['vs_cpu']:>7.2f}x"
                  f"{r['compile_mock_s']:>9.1f}s/{r['compile_cpu_s']:.1f}s")
    misses = _misses(results)
    for miss in misses:
        print(f"MISS {miss}", file=sys.stderr)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
