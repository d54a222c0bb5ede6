"""What the in-process mock benchmarks share: timing a batch of calls until they return and until
the device has run them."""

from __future__ import annotations

import time
from collections.abc import Callable


def returned_and_done(fn: Callable[[], object], calls: int, batches: int,
                      synchronize: Callable[[], object]) -> tuple[list[float], list[float]]:
    """Per batch of ``calls`` calls of ``fn``: the seconds until the calls returned and until
    ``synchronize()`` returned after them (both from the batch's start)."""
    returned, done = [], []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        returned.append(time.perf_counter() - start)
        synchronize()
        done.append(time.perf_counter() - start)
    return returned, done
