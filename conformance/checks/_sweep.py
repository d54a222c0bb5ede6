"""Size and dtype sweeps for the collectives checks: where a collective library's bugs live
(at algorithm and protocol switches, for one dtype, for odd sizes, for views).

Every sweep runs one collective over :func:`counts` (element counts that straddle common
thresholds: 0, 1, a prime, 4 KiB - 1 element / 4 KiB / + 1, 64 KiB, 512 KiB - 1 / + 1 element
(the mock transport's 512 KiB rounds), 2 MiB + 3 elements) for every dtype c10d takes for it
(:data:`DTYPES`), all in one check invocation. Inputs are small integers stored as the dtype, so
every result is exact in any reduction order, and expected results are cheap:

- data movement (broadcast, gathers, scatters, all-to-all, send/recv): rank ``r``'s element
  ``i`` is :func:`rank_values` ``(r, i)``; every rank can rebuild any rank's input;
- reductions: rank ``r``'s element ``i`` is ``BASE[(p(i) + 2r) % 5]`` with the phase
  ``p(i) = (3i + seed) % 5``: the reduction over ranks depends on the phase only, so the
  expected result is a 5-entry table (:func:`reduction_table`) indexed by the phase.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
from accelkit.conformance.checks._util import assert_equal

#: Every dtype c10d moves for the sweeps (complex where torch views it as real pairs).
DTYPES: tuple[torch.dtype, ...] = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64,
                                   torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.complex64)
#: Dtypes a reduction (SUM, MIN, ...) is defined on, per reduce op.
ARITHMETIC = tuple(d for d in DTYPES if not d.is_complex)
FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64)
INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64)

KiB, MiB = 1024, 1024 * 1024


def counts(dtype: torch.dtype, *, largest: bool = True) -> list[int]:
    """Element counts of the sweep for ``dtype``: 0, 1, 7, 4 KiB - 1 element, 4 KiB, + 1,
    64 KiB, 512 KiB - 1 element, 512 KiB + 1 and (``largest``) 2 MiB + 3 elements."""
    size = torch.empty(0, dtype=dtype).element_size()
    sizes = [0, 1, 7, 4 * KiB // size - 1, 4 * KiB // size, 4 * KiB // size + 1,
             64 * KiB // size, 512 * KiB // size - 1, 512 * KiB // size + 1]
    if largest:
        sizes.append(2 * MiB // size + 3)
    return sorted(set(sizes))


def label(dtype: torch.dtype, n: int) -> str:
    """``float32 x 131073 (512 KiB + 4 B)``: what a failure names."""
    size = torch.empty(0, dtype=dtype).element_size()
    return f"{str(dtype).removeprefix('torch.')} x {n} ({n * size} B)"


def _scalar(value: int, dtype: torch.dtype):
    """The small integer ``value`` as an element of ``dtype``: a bool is ``value % 3 == 0``; a
    complex number gets an imaginary part of its own, so real/imaginary mix-ups show."""
    if dtype == torch.bool:
        return value % 3 == 0
    if dtype.is_complex:
        return complex(value, value % 3 - 1)
    return value


#: The longest tensor a sweep asks for, in elements (2 MiB + 3 one-byte elements) plus a period.
_LONGEST = 2 * MiB + 3 + 11


@functools.lru_cache(maxsize=64)
def _repeated(period: tuple, dtype: torch.dtype) -> torch.Tensor:
    """``period`` repeated up to :data:`_LONGEST` elements of ``dtype``, built once per process:
    every sweep input and expected result is a slice of one of these (read-only)."""
    wide = torch.bool if dtype == torch.bool else torch.complex128 if dtype.is_complex \
        else torch.float64
    values = torch.tensor(period, dtype=wide).to(dtype)
    return values.repeat(_LONGEST // len(period) + 1)[:_LONGEST].contiguous()


def _periodic(period: tuple, dtype: torch.dtype, n: int, shift: int) -> torch.Tensor:
    """Element ``i`` is ``period[(i + shift) % len(period)]`` as ``dtype``, ``n`` elements: a
    read-only view (copy it before a collective writes into it)."""
    start = shift % len(period)
    return _repeated(tuple(period), dtype)[start:start + n]


def rank_values(rank: int, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s data-movement input (CPU, read-only): small integers that differ from
    rank to rank and from element to element (element ``i`` is ``(3i + 7 * rank + seed) % 11``,
    centred on 0 for signed dtypes), never all zero."""
    centre = 0 if dtype in (torch.uint8, torch.bool) else 5
    period = tuple(_scalar((3 * i) % 11 - centre, dtype) for i in range(11))
    # (3i + c) % 11 == (3 (i + 4c)) % 11, as 4 = 3^-1 mod 11
    return _periodic(period, dtype, n, (7 * rank + seed) * 4)


#: Reduction inputs: ``BASE[op][kind]`` holds the 5 values a rank's elements cycle through.
_BASE = {
    "sum": {"signed": [2, -1, 0, -2, 1], "unsigned": [0, 3, 1, 4, 2]},
    "product": {"signed": [1, -1, 2, 1, 1], "unsigned": [1, 3, 1, 2, 1]},
    "bitwise": {"signed": [5, 3, 6, 9, 7], "unsigned": [5, 3, 6, 9, 7]},
}
_BOOL_BASE = [True, False, False, True, False]


def _base(op: str, dtype: torch.dtype) -> list:
    if dtype == torch.bool:
        return _BOOL_BASE
    table = _BASE["product" if op == "product" else "bitwise" if op in ("band", "bor", "bxor")
                  else "sum"]
    return table["unsigned" if dtype == torch.uint8 else "signed"]


def reduction_input(op: str, rank: int, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input for a reduction by ``op`` (sum, product, min, max, avg, band, bor,
    bxor), CPU, read-only: element ``i`` is ``BASE[(p(i) + 2 * rank) % 5]``,
    ``p(i) = (3i + seed) % 5``."""
    base = _base(op, dtype)
    period = tuple(base[(3 * i) % 5] if dtype == torch.bool else _scalar(base[(3 * i) % 5], dtype)
                   for i in range(5))
    # (3i + seed + 2 rank) % 5 == (3 (i + 2 (seed + 2 rank))) % 5, as 2 = 3^-1 mod 5
    return _periodic(period, dtype, n, 2 * (seed + 2 * rank))


def _fold(op: str, values: list):
    out = values[0]
    for v in values[1:]:
        out = {"sum": lambda a, b: a + b, "avg": lambda a, b: a + b, "product": lambda a, b: a * b,
               "min": min, "max": max, "band": lambda a, b: a & b, "bor": lambda a, b: a | b,
               "bxor": lambda a, b: a ^ b}[op](out, v)
    return out


def reduction_table(op: str, world_size: int, dtype: torch.dtype) -> list:
    """The reduction over ``world_size`` ranks of each phase's inputs (5 values)."""
    base = _base(op, dtype)
    if dtype == torch.bool:
        # c10d's bool reductions: SUM and MAX are "any", PRODUCT and MIN "all"
        bool_op = {"sum": "bor", "max": "bor", "product": "band", "min": "band"}.get(op, op)
        return [bool(_fold(bool_op, [base[(p + 2 * r) % 5] for r in range(world_size)]))
                for p in range(5)]
    table = []
    for p in range(5):
        values = [base[(p + 2 * r) % 5] for r in range(world_size)]
        if dtype.is_complex:
            values = [complex(v, v % 3 - 1) for v in values]
        folded = _fold(op, values)
        table.append(folded / world_size if op == "avg" else folded)
    return table


def reduction_expected(op: str, world_size: int, n: int, dtype: torch.dtype,
                       seed: int = 0) -> torch.Tensor:
    """What a reduction by ``op`` over ``world_size`` ranks of :func:`reduction_input` gives."""
    table = reduction_table(op, world_size, dtype)
    period = tuple(table[(3 * i) % 5] for i in range(5))
    return _periodic(period, dtype, n, 2 * seed)


def ops_for(dtype: torch.dtype) -> list[str]:
    """The all_reduce ops c10d defines on ``dtype`` (AVG: floating point only; bitwise:
    integers and bool; complex: SUM and AVG)."""
    if dtype.is_complex:
        return ["sum", "avg"]
    ops = ["sum", "product", "min", "max"]
    ops += ["avg"] if dtype.is_floating_point else ["band", "bor", "bxor"]
    return ops


REDUCE_OPS: dict[str, dist.ReduceOp] = {
    "sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG, "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR,
}


def in_view(tensor: torch.Tensor, kind: str, fill) -> tuple[torch.Tensor, torch.Tensor]:
    """``tensor`` copied into a view of a larger buffer filled with ``fill``: ``"offset"`` (a
    slice starting 3 elements in: contiguous, with a storage offset) or ``"strided"`` (every
    second element: not contiguous). Returns (view, buffer)."""
    n = tensor.numel()
    if kind == "offset":
        buffer = torch.full((n + 5,), fill, dtype=tensor.dtype, device=tensor.device)
        view = buffer[3:3 + n]
    else:
        buffer = torch.full((2 * n + 1,), fill, dtype=tensor.dtype, device=tensor.device)
        view = buffer[1::2]
    view.copy_(tensor)
    return view, buffer


def either_correct_or_refused(collective: Callable, *args, what: str) -> bool:
    """Run ``collective(*args)`` on a non-contiguous view: True when it ran (the caller then
    checks the values); a refusal must name contiguity (never a silently wrong result)."""
    try:
        collective(*args)
    except (RuntimeError, ValueError) as exc:
        assert "contiguous" in str(exc).lower(), (
            f"{what} on a non-contiguous view raised an error not naming contiguity, expected "
            f"a correct result or such an error: {exc}")
        return False
    return True


class Comparisons:
    """A sweep's comparisons, reported together at the end of the check: a rank that stopped
    at its first wrong result would leave the others waiting for it in the next collective,
    and the whole list shows the pattern (one dtype, every size above a threshold, ...)."""

    shown = 10

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def equal(self, actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
        self.count += 1
        try:
            assert_equal(actual, expected, what)
        except AssertionError as exc:
            self.failures.append(str(exc))

    def done(self) -> None:
        """Fail with every wrong result (the first :attr:`shown` in full)."""
        if self.failures:
            more = len(self.failures) - self.shown
            raise AssertionError(
                f"{len(self.failures)} of {self.count} results wrong:\n"
                + "\n".join(self.failures[:self.shown])
                + (f"\n... and {more} more" if more > 0 else ""))
