"""Helpers shared by the catalogue's area modules: deterministic inputs that every rank can
rebuild (so each rank computes the single-device reference itself), comparisons whose failure
message says what differed, and a temporary directory shared by the ranks."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager

import torch
import torch.distributed as dist

#: World sizes besides its default (4) that a catalogue check is written for and verified at
#: on mock and cpu (``--world-size 2`` on a 2-device machine, a torchrun launch of 8 ranks);
#: a check that is not says so in its decorator.
ALSO_AT = (2, 8)


def host_tensor(shape, seed: int, dtype: torch.dtype = torch.float32, *,
                low: int | None = None, high: int | None = None) -> torch.Tensor:
    """A CPU tensor that is the same on every rank for the same ``seed``. With ``low``/``high``
    it holds small integers (stored as ``dtype``) so that sums and products are exact in any
    order; otherwise standard-normal floats."""
    gen = torch.Generator().manual_seed(seed)
    if low is not None and high is not None:
        return torch.randint(low, high, tuple(shape), generator=gen).to(dtype)
    return torch.randn(tuple(shape), generator=gen).to(dtype)


def rank_input(shape, rank: int, seed: int = 0, dtype: torch.dtype = torch.float32,
               low: int = -8, high: int = 9) -> torch.Tensor:
    """Rank ``rank``'s small-integer input (CPU); any rank can rebuild any other rank's input."""
    return host_tensor(shape, seed * 1000 + rank, dtype, low=low, high=high)


def local_chunk(tensor: torch.Tensor, rank: int, world_size: int, dim: int = 0) -> torch.Tensor:
    """Rank ``rank``'s block of ``tensor`` sharded on ``dim`` over ``world_size`` ranks, as
    DTensor's ``Shard(dim)`` lays it out: ``torch.chunk``'s pieces, and an empty block (size 0
    on ``dim``) for the ranks past the last piece (a dimension shorter than the world)."""
    pieces = tensor.chunk(world_size, dim)
    return pieces[rank] if rank < len(pieces) else tensor.narrow(dim, 0, 0)


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bitwise equality of values, shape and dtype (``actual`` may live on any device)."""
    actual = actual.detach().cpu()
    expected = expected.detach().cpu()
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    if not torch.equal(actual, expected):
        raise AssertionError(f"{what}: {_difference(actual, expected)}")


def _difference(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """How two same-shape tensors differ: how many elements, and the first one (observed
    next to expected)."""
    wide = torch.complex128 if actual.is_complex() else torch.float64
    differs = actual.to(wide) != expected.to(wide)
    index = tuple(int(i) for i in differs.nonzero()[0])  # () for a 0-dim tensor
    return (f"{int(differs.sum())} of {expected.numel()} elements differ; first at "
            f"[{', '.join(map(str, index))}]: got {actual[index].item()!r}, "
            f"expected {expected[index].item()!r}")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, *,
                 rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """Equality within a tolerance (default rtol 1e-5, atol 1e-5), for results whose float
    reduction order differs from the single-device reference (sharded matmuls, reductions
    across ranks)."""
    actual = actual.detach().cpu()
    expected = expected.detach().cpu()
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def assert_on_device(ctx, tensor: torch.Tensor, what: str) -> None:
    """``tensor`` lives on this rank's own device (type and index)."""
    assert tensor.device == ctx.device, f"{what}: on {tensor.device}, expected {ctx.device}"


def all_ranks_object(obj, group=None) -> list:
    """Every rank's ``obj`` (a small picklable value), gathered on every rank."""
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


class Raised:
    """What ``expect_raises`` caught: the message, for checks beyond the fragments."""

    message: str = ""


@contextmanager
def expect_raises(exc_type: type[BaseException], *fragments: str, what: str):
    """The block must raise ``exc_type`` whose message contains every one of ``fragments``;
    the failure says ``what`` did not. Yields a ``Raised`` holding the message."""
    raised = Raised()
    try:
        yield raised
    except exc_type as exc:
        raised.message = str(exc)
    else:
        raise AssertionError(f"{what} did not raise {exc_type.__name__}")
    missing = [f for f in fragments if f not in raised.message]
    assert not missing, f"{what} raised {exc_type.__name__} without {missing}: {raised.message}"


@contextmanager
def shared_tmpdir(prefix: str = "accelkit-check-"):
    """A temporary directory whose path rank 0 chooses and broadcasts over the default group;
    rank 0 removes it after every rank has left the block (at once when the block raised on
    rank 0)."""
    path = [tempfile.mkdtemp(prefix=prefix) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(path, src=0)
    try:
        yield path[0]
    except BaseException:
        # no barrier: the other ranks may wait for this one in a collective (a pipeline's
        # point-to-point); the engine sees the failure and tears the ranks down
        if dist.get_rank() == 0:
            shutil.rmtree(path[0], ignore_errors=True)
        raise
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(path[0], ignore_errors=True)


def assert_value(actual, expected, what: str) -> None:
    """``actual == expected`` for plain values (ints, tuples, lists, names); the failure says
    ``what`` was observed next to what was expected."""
    assert actual == expected, f"{what} is {actual!r}, expected {expected!r}"
