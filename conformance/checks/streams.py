"""Streams, events and the caching allocator, as an asynchronous accelerator runs them and as
FSDP2 (torch/distributed/fsdp/_fully_shard) and DCP call them: collectives ordered with the
work around them through Work.wait() (NCCL's semantics, PR 102336's dispatchable groups), side
streams joined with events, Tensor.record_stream keeping memory from reuse, and the memory
statistics torch's tooling reads.

The ordering checks build hazards an asynchronous device exposes: a queue of kernels whose
intermediate values differ from their result, on tensors large enough to take a while, so work
that ran out of order reads a wrong value. A synchronous device (every call done when it
returns; the mock's default, gloo's CPU) cannot get them wrong, so there they SKIP with that
reason: they prove something only on an asynchronous device (the mock with ACCELKIT_MOCK_ASYNC=1,
CUDA, ...).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import ALSO_AT, assert_equal

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, requires=("accelerator",))

#: Elements of the tensors whose kernels take long enough to overlap (16 MiB of float32).
BIG = 1 << 22
#: memory_stats()'s families of counters, each with .all.current/.peak/.allocated/.freed
#: (c10::CachingAllocator::DeviceStats, as torch.cuda.memory_stats flattens them).
STAT_FAMILIES = ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes",
                 "active_bytes", "requested_bytes")
#: Kernels queued to produce a value (each adds one).
CHAIN = 8


def _handle(ctx):
    return getattr(torch, ctx.device_type)


def _slowly(x: torch.Tensor, ones: torch.Tensor) -> torch.Tensor:
    """x + CHAIN, as CHAIN queued tensor-tensor kernels (each result a fresh tensor)."""
    for _ in range(CHAIN):
        x = x + ones
    return x


#: The lengths, in chains of CHAIN kernels, a queue of work grows through when it ended before
#: a check could look at it (a fast device): a check that needs work still queued tries each.
LENGTHS = (1, 4, 16, 64)


def _queue(ctx, ones: torch.Tensor, length: int) -> torch.Tensor:
    """``length`` chains of CHAIN kernels on BIG elements, queued on the current stream."""
    x = torch.zeros(BIG, device=ctx.device)
    for _ in range(length):
        x = _slowly(x, ones)
    return x


def _asynchronous_only(ctx) -> None:
    """SKIP on a device that says it is synchronous (``torch.<device>.is_async()`` False, as
    accelkit's device module answers): there every call is done when it returns, so the
    ordering a check builds cannot go wrong. A handle without ``is_async`` (torch.cuda) is
    asynchronous."""
    is_async = getattr(_handle(ctx), "is_async", None)
    if is_async is not None and not is_async():
        ctx.skip(f"{ctx.device_type} is synchronous (torch.{ctx.device_type}.is_async() is "
                 "False): every call is done when it returns, so this ordering cannot go wrong; "
                 "run it on the device's asynchronous mode (the mock: ACCELKIT_MOCK_ASYNC=1)")


def _ends(t: torch.Tensor) -> torch.Tensor:
    """The first and last 1024 elements, on the host (what a check compares)."""
    return torch.cat([t[:1024], t[-1024:]]).cpu()


@check(covers=("torch.<device>.Stream", "torch.<device>.Event", "torch.<device>.current_stream",
       "torch.<device>.stream", "torch.<device>.synchronize", "guard.getNewStream", "guard.block",
       "guard.queryEvent", "guard.synchronizeEvent", "guard.queryStream", "Runtime::synchronize",
       "Runtime::stream_query", "Runtime::launch", "Runtime::event_synchronize"))
def device_handle_streams(ctx):
    """The device module's stream and event members as FSDP2 and DCP call them: Stream(priority)
    on the current device, current_stream() inside and outside `with stream(s):`,
    Stream.wait_stream / wait_event, Event(enable_timing) record / query / synchronize /
    elapsed_time, synchronize() (torch.cuda's API, StreamDeviceHandle)."""
    handle = _handle(ctx)
    high = handle.Stream(priority=-1)
    assert isinstance(high, torch.Stream), f"Stream() gave {type(high).__name__}, expected torch.Stream"
    assert high.device == ctx.device, f"Stream() is on {high.device}, expected {ctx.device}"
    default = handle.current_stream()
    assert high != default, "a new stream equals the current stream"
    with handle.stream(high):
        assert handle.current_stream() == high, "current_stream() inside `with stream(s)` is not s"
    assert handle.current_stream() == default, "`with stream(s)` did not restore the stream"
    start, end = handle.Event(enable_timing=True), handle.Event(enable_timing=True)
    start.record()
    ones = torch.ones(BIG, device=ctx.device)
    _slowly(ones, ones)
    end.record()
    high.wait_event(end)
    high.wait_stream(default)
    end.synchronize()
    assert start.query() and end.query(), "events not complete after Event.synchronize()"
    elapsed = start.elapsed_time(end)
    assert elapsed >= 0.0, f"elapsed_time {elapsed} ms, expected >= 0"
    with handle.stream(high):
        _slowly(ones, ones)  # still running when synchronize() is called
    handle.synchronize()
    assert high.query() and default.query(), "streams busy after synchronize()"


@check(covers=("async_op=True", "Runtime::stream_wait"))
def collective_ordering(ctx):
    """A collective starts after the work queued before it on the current stream, and
    Work.wait() makes the current stream (not necessarily the host) wait for its result: a
    queued chain produces the input, the all_reduce runs, a kernel after wait() consumes it
    (NCCL's semantics; torch.distributed Work.wait). SKIP on a synchronous device."""
    _asynchronous_only(ctx)
    ones = torch.ones(BIG, device=ctx.device)
    x = _slowly(torch.full((BIG,), float(ctx.rank), device=ctx.device), ones)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    y = x + ones
    total = float(sum(range(ctx.world_size)) + ctx.world_size * CHAIN)
    assert_equal(_ends(y), torch.full((2048,), total + 1), "a kernel after all_reduce + wait()")
    out = torch.empty(ctx.world_size * BIG // 4, device=ctx.device)
    z = _slowly(torch.full((BIG // 4,), float(ctx.rank), device=ctx.device), ones[: BIG // 4])
    dist.all_gather_into_tensor(out, z)  # a synchronous call: wait() inside
    gathered = out.view(ctx.world_size, -1)[:, :8].cpu()
    expected = (torch.arange(ctx.world_size, dtype=torch.float32) + CHAIN)[:, None].expand(-1, 8)
    assert_equal(gathered, expected, "all_gather of queued inputs")


@check(covers=("torch.<device>.Stream", "torch.<device>.stream", "torch.<device>.current_stream",
       "guard.block", "Runtime::stream_wait_event", "Runtime::launch"))
def side_stream_events(ctx):
    """Work on a side stream joined with events: the side stream waits for the producer
    (wait_stream), the current stream waits for the side stream's result (Event.record on the
    side stream, current_stream().wait_event) before using it (FSDP2's all-gather stream
    pattern, torch.distributed.fsdp._fully_shard). SKIP on a synchronous device."""
    _asynchronous_only(ctx)
    handle = _handle(ctx)
    ones = torch.ones(BIG, device=ctx.device)
    a = _slowly(torch.zeros(BIG, device=ctx.device), ones)  # CHAIN, on the current stream
    side = handle.Stream()
    side.wait_stream(handle.current_stream())
    with handle.stream(side):
        b = _slowly(a, ones)  # 2 * CHAIN, on the side stream
        done = handle.Event()
        done.record()
    handle.current_stream().wait_event(done)
    c = b + ones
    assert_equal(_ends(c), torch.full((2048,), float(2 * CHAIN + 1)),
                 "the current stream after waiting for the side stream's event")
    b.record_stream(handle.current_stream())


@check
def record_stream(ctx):
    """Tensor.record_stream: a tensor freed on the current stream while a side stream still
    reads it is not handed out again before the side stream is past that point (the caching
    allocator's stream semantics FSDP2 relies on, torch.Tensor.record_stream). The side stream
    reads it behind a queue of other work, so a new tensor given its memory is written before
    those reads run. SKIP on a synchronous device."""
    _asynchronous_only(ctx)
    handle = _handle(ctx)
    ones = torch.ones(BIG, device=ctx.device)
    t = torch.full((BIG,), 3.0, device=ctx.device)
    side = handle.Stream()
    side.wait_stream(handle.current_stream())
    with handle.stream(side):
        busy = _slowly(_slowly(torch.zeros(BIG, device=ctx.device), ones), ones)
        r = t
        for _ in range(CHAIN):
            r = r + t  # reads t, CHAIN times, on the side stream, behind the busy queue
    t.record_stream(side)
    del t
    overwrite = torch.full((BIG,), 7.0, device=ctx.device)  # may not take t's memory yet
    handle.current_stream().wait_stream(side)
    assert_equal(_ends(r), torch.full((2048,), 3.0 * (CHAIN + 1)),
                 "side stream's reads of a tensor freed after record_stream")
    assert_equal(_ends(busy), torch.full((2048,), float(2 * CHAIN)), "the side stream's queue")
    del overwrite


@check(covers=("Runtime::capacity", "Runtime::allocate / release",))
def memory_statistics(ctx):
    """The allocator's statistics as torch.cuda's: memory_reserved() >= memory_allocated()
    after frees (freed blocks may stay cached), max_memory_allocated() >= memory_allocated(),
    reset_peak_memory_stats() brings the peak to the current value, empty_cache() keeps
    reserved >= allocated, memory_stats() has the keys torch's memory tooling reads and its
    counters move with new tensors (allocations, active blocks, a new segment, the bytes asked
    for exactly) and frees, and a
    tensor one byte larger than the device's memory (mem_get_info's total, the runtime's
    capacity) raises torch.OutOfMemoryError and counts in num_ooms (torch.cuda.memory_stats,
    mem_get_info)."""
    handle = _handle(ctx)
    handle.synchronize()
    keep = torch.empty(BIG, device=ctx.device)
    held = handle.memory_allocated()
    assert held >= keep.numel() * 4, f"memory_allocated() {held} with {keep.numel() * 4} bytes held"
    temp = [torch.empty(BIG // 8, device=ctx.device) for _ in range(4)]
    del temp
    handle.synchronize()
    allocated, reserved = handle.memory_allocated(), handle.memory_reserved()
    assert reserved >= allocated, f"memory_reserved() {reserved} < memory_allocated() {allocated}"
    assert handle.max_memory_allocated() >= allocated + BIG // 2, (
        f"max_memory_allocated() {handle.max_memory_allocated()}, expected at least "
        f"{allocated + BIG // 2} (the freed temporaries were allocated)")
    handle.reset_peak_memory_stats()
    assert handle.max_memory_allocated() == handle.memory_allocated(), "peak not reset"
    handle.empty_cache()
    assert handle.memory_reserved() >= handle.memory_allocated(), "reserved < allocated"
    stats = handle.memory_stats()
    wanted = {f"{family}.all.{kind}" for family in STAT_FAMILIES
              for kind in ("current", "peak", "allocated", "freed")}
    missing = sorted(wanted - set(stats) | {"num_alloc_retries", "num_ooms"} - set(stats))
    assert not missing, f"memory_stats() lacks {missing}"
    # three fresh tensors, then a block that needs a new segment (the cache was just emptied)
    more = [torch.empty(1000 + i, device=ctx.device) for i in range(3)] + [
        torch.empty(BIG, device=ctx.device)]
    grown = handle.memory_stats()
    moved = {key: grown[key] - stats[key] for key in wanted}
    for family, least in (("allocation", 4), ("active", 4), ("segment", 1),
                          ("allocated_bytes", BIG * 4), ("active_bytes", BIG * 4),
                          ("reserved_bytes", BIG * 4)):
        assert moved[f"{family}.all.current"] >= least and moved[f"{family}.all.allocated"] >= least, (
            f"after 4 new tensors (one of {BIG * 4} bytes in a new segment) memory_stats()'s "
            f"{family}.all.current moved by {moved[f'{family}.all.current']} and .allocated by "
            f"{moved[f'{family}.all.allocated']}, expected at least {least}")
    requested = sum(t.numel() * 4 for t in more)
    assert moved["requested_bytes.all.current"] == requested, (
        f"requested_bytes.all.current moved by {moved['requested_bytes.all.current']} after "
        f"tensors of {requested} bytes in all were asked for")
    del more
    freed = handle.memory_stats()
    assert freed["allocation.all.freed"] - grown["allocation.all.freed"] == 4, (
        "allocation.all.freed did not count the 4 tensors freed")
    del keep
    free, total = handle.mem_get_info(ctx.device)
    assert 0 < total and 0 <= free <= total, f"mem_get_info() is ({free}, {total})"
    ooms = handle.memory_stats()["num_ooms"]
    try:
        torch.empty(total + 1, dtype=torch.uint8, device=ctx.device)
    except torch.OutOfMemoryError:
        pass
    else:
        raise AssertionError(f"a tensor of {total + 1} bytes, one more than the device's memory "
                             "(mem_get_info()), was allocated")
    assert handle.memory_stats()["num_ooms"] == ooms + 1, "num_ooms did not count the refusal"


@check(covers=("guard.queryStream", "guard.queryEvent", "Runtime::stream_query",
               "Runtime::event_query"))
def stream_query(ctx):
    """Stream.query() and Event.query() tell queued work from finished work: right after a
    queue of kernels is issued, the stream's query() is False and an event recorded behind them
    is not complete; once that event's synchronize() returns, its query() is True and so is the
    stream's after synchronize() (torch.cuda.Stream.query, Event.query: FSDP2 and DCP poll them,
    and a query that always says done lets them read results that are not there yet). A queue that ended before query() was asked is made
    four times longer, up to 64 times. SKIP on a synchronous device."""
    _asynchronous_only(ctx)
    handle = _handle(ctx)
    ones = torch.ones(BIG, device=ctx.device)
    stream = handle.current_stream()
    for length in LENGTHS:
        handle.synchronize()
        _queue(ctx, ones, length)
        event = handle.Event()
        event.record()
        stream_busy, event_pending = not stream.query(), not event.query()
        if stream_busy and event_pending:
            break
    queued = f"{length * CHAIN} kernels on {BIG * 4 // 2**20} MiB just queued"
    assert stream_busy, f"Stream.query() is True with {queued} on the stream"
    assert event_pending, f"Event.query() is True for an event recorded behind {queued}"
    event.synchronize()
    assert event.query(), "Event.query() is False once Event.synchronize() returned"
    stream.synchronize()
    assert stream.query(), "Stream.query() is False once Stream.synchronize() returned"


@check(covers=("guard.record", "torch.<device>.Event"))
def event_record_stream(ctx):
    """Event.record(stream) records on the stream it is given, not the current one: with a
    queue of work on one side stream and the current stream another, idle one, an event
    recorded on the current stream (torch.accelerator.current_stream(), as FSDP2 passes it)
    completes without waiting for that queue, and one recorded on the busy stream just before
    it is then still not complete (torch.Event.record(stream); torch.cuda.Event.record(stream)). The
    current stream is not the default one, which a device may order after every other stream
    (CUDA's legacy default stream). A queue that ended before the events were looked at is
    made four times longer, up to 64 times. SKIP on a synchronous device."""
    _asynchronous_only(ctx)
    handle = _handle(ctx)
    ones = torch.ones(BIG, device=ctx.device)
    busy, quiet = handle.Stream(), handle.Stream()
    for length in LENGTHS:
        handle.synchronize()
        with handle.stream(busy):
            _queue(ctx, ones, length)
        with handle.stream(quiet):
            current = torch.accelerator.current_stream()
            on_busy, on_current = torch.Event(ctx.device), torch.Event(ctx.device)
            on_busy.record(busy)
            on_current.record(current)
            on_current.synchronize()  # an idle stream's event: done in moments
            busy_pending, still_busy = not on_busy.query(), not busy.query()
        if busy_pending and still_busy:
            break
    queued = f"{length * CHAIN} kernels on {BIG * 4 // 2**20} MiB just queued on another stream"
    assert busy_pending, (f"an event recorded on a stream with {queued.replace(' on another stream', '')} "
                          "completed at once (recorded on the idle current stream instead?)")
    assert still_busy, (f"an event recorded on the idle current stream completed only with the "
                        f"work of the other stream ({queued}): recorded there?")
    on_busy.synchronize()
    assert on_busy.query(), "Event.query() is False once Event.synchronize() returned"


@check(covers=("Runtime::allocate / release",))
def op_result_memory(ctx):
    """Tensors a kernel returns are in the allocator's books as torch.empty's are (the layer
    may take a kernel's buffer as device memory without a copy, or allocate the result before
    queueing the kernel): while held, memory_allocated() counts at least their bytes; once they
    are freed, after synchronize() and empty_cache(), memory_allocated() and memory_reserved()
    are where they were, round after round (torch.cuda.memory_allocated / memory_reserved: a
    count that drifts reads as a leak in torch's memory tooling and, counted against the
    device's capacity, ends in an out-of-memory error with the memory free)."""
    handle = _handle(ctx)
    a = torch.randn(BIG, device=ctx.device)
    handle.synchronize()
    handle.empty_cache()
    allocated, reserved = handle.memory_allocated(), handle.memory_reserved()
    for round_ in range(3):
        results = [a * 2, a + 1, torch.sin(a), a.clone()]
        handle.synchronize()
        grew = handle.memory_allocated() - allocated
        assert grew >= len(results) * BIG * 4, (
            f"round {round_}: memory_allocated() grew by {grew} bytes while {len(results)} "
            f"kernel results of {BIG * 4} bytes each are held")
        del results
        handle.synchronize()
        handle.empty_cache()
        now = (handle.memory_allocated(), handle.memory_reserved())
        assert now == (allocated, reserved), (
            f"round {round_}: after the kernel results were freed (synchronize(), empty_cache()) "
            f"memory_allocated() and memory_reserved() are {now}, not {(allocated, reserved)} "
            "as before them")


#: Ops a training step issues, each queued on a stream by CUDA without the host waiting.
QUEUED_OPS = {
    "add": lambda a, b, i, w: a + b,
    "mm": lambda a, b, i, w: a @ b,
    "linear": lambda a, b, i, w: torch.nn.functional.linear(a, b, a[0]),
    "sum(dim)": lambda a, b, i, w: a.sum(0),
    "softmax": lambda a, b, i, w: a.softmax(-1),
    "layer_norm": lambda a, b, i, w: torch.nn.functional.layer_norm(a, a.shape[-1:]),
    "gelu": lambda a, b, i, w: torch.nn.functional.gelu(a),
    "dropout": lambda a, b, i, w: torch.nn.functional.dropout(a, 0.5),
    "cat": lambda a, b, i, w: torch.cat([a, b]),
    "index_select": lambda a, b, i, w: a.index_select(0, i),
    "embedding": lambda a, b, i, w: torch.nn.functional.embedding(i, w),
    "cross_entropy": lambda a, b, i, w: torch.nn.functional.cross_entropy(a, i.new_zeros(len(a))),
    "_foreach_add_": lambda a, b, i, w: torch._foreach_add_([a, b], 1.0),
    "clone": lambda a, b, i, w: a.clone(),
    # ops without an out= overload (the fallback allocates their results from the meta kernel's)
    "group_norm": lambda a, b, i, w: torch.nn.functional.group_norm(a.view(4, 16, 64), 4),
    "scaled_dot_product_attention": lambda a, b, i, w:
        torch.nn.functional.scaled_dot_product_attention(*[a.view(1, 4, 16, 64)] * 3),
}


@check(covers=("Runtime::launch",))
def ops_do_not_wait(ctx):
    """Ops are queued, not waited for: each of the ops a training step issues (QUEUED_OPS),
    called while the current stream still has a queue of work, returns with that queue still
    running (a torch.Event recorded at the queue's end not yet reached: Event.query() False right
    after the op, which may itself have queued more), as CUDA launches kernels. A host that waits
    for the device at every op gets the right values, but DDP's and FSDP's overlap of
    computation with communication is gone. Each op runs once first (a first call may load
    code); a queue that ends before an op returns is made four times longer, up to 64 times,
    before the op is said to wait. SKIP on a synchronous device."""
    _asynchronous_only(ctx)
    handle = _handle(ctx)
    ones = torch.ones(BIG, device=ctx.device)
    a, b = torch.randn(64, 64, device=ctx.device), torch.randn(64, 64, device=ctx.device)
    i, w = torch.tensor([0, 3, 5], device=ctx.device), torch.randn(10, 8, device=ctx.device)
    waited = []
    for name, op in QUEUED_OPS.items():
        op(a, b, i, w)
        handle.synchronize()
        for length in LENGTHS:
            _queue(ctx, ones, length)
            queued = torch.Event(ctx.device)
            queued.record()
            op(a, b, i, w)
            busy = not queued.query()
            handle.synchronize()
            if busy:
                break
        else:
            waited.append(name)
    assert not waited, (
        f"{', '.join(waited)} returned only once the stream's queue had run ({len(waited)} of "
        f"{len(QUEUED_OPS)} ops; the queue before each was up to {LENGTHS[-1] * CHAIN} kernels on "
        f"{BIG * 4 // 2**20} MiB): the host waits for the device at these ops")


#: Side of the float32 matmuls event_timing times (a few ms to a few hundred on any device).
TIMED = 1024


@check(covers=("torch.<device>.Event", "guard.elapsedTime"))
def event_timing(ctx):
    """Event.elapsed_time measures the time between two recorded events: with three
    torch.Event(device, enable_timing=True) recorded before, between and after two rounds of
    known work (two 1024x1024 matmuls each), both intervals are positive, the whole is their
    sum, and it agrees with the host's clock within a generous factor: at most the time the
    host waited for the work (plus 1 ms), at least a twentieth of it (torch.Event.elapsed_time,
    as torch.cuda.Event.elapsed_time: milliseconds between the events)."""
    handle = _handle(ctx)
    a = torch.randn(TIMED, TIMED, device=ctx.device) / TIMED ** 0.5
    b = torch.empty_like(a)
    handle.synchronize()
    events = [torch.Event(ctx.device, enable_timing=True) for _ in range(3)]
    started = time.perf_counter()
    events[0].record()
    for event in events[1:]:
        for _ in range(2):
            torch.mm(a, a, out=b)
        event.record()
    events[-1].synchronize()
    host_ms = (time.perf_counter() - started) * 1000
    first, second = events[0].elapsed_time(events[1]), events[1].elapsed_time(events[2])
    whole = events[0].elapsed_time(events[2])
    for name, ms in (("first", first), ("second", second)):
        assert ms > 0, (f"elapsed_time over the {name} round of matmuls is {ms} ms, expected > 0 "
                        "(events without timestamps?)")
    assert abs(whole - (first + second)) <= 0.01 * whole + 0.05, (
        f"elapsed_time from the first to the last event is {whole} ms, but the two rounds "
        f"between them took {first} + {second} ms (timestamps out of order?)")
    assert whole <= host_ms * 1.1 + 1.0, (
        f"elapsed_time {whole:.3f} ms for work the host saw finish in {host_ms:.3f} ms "
        "(elapsed_time must be in milliseconds)")
    assert whole >= host_ms / 20, (
        f"elapsed_time {whole:.3f} ms for work the host waited {host_ms:.3f} ms for: under a "
        "twentieth of it (elapsed_time must be in milliseconds of device time)")


#: The queued work event_timestamps records events around (ms).
QUEUED_MS = 200


def _chains_for(ctx, ones: torch.Tensor, ms: float) -> int:
    """How many CHAIN-kernel chains on BIG elements take at least ``ms`` on the device, from
    one chain timed on the host (at least one)."""
    handle = _handle(ctx)
    handle.synchronize()
    started = time.perf_counter()
    _queue(ctx, ones, 1)
    handle.synchronize()
    one = max((time.perf_counter() - started) * 1000, 1e-3)
    return max(1, int(ms / one) + 1)


@check(covers=("torch.<device>.Event", "guard.elapsedTime", "Runtime::event_create",
               "Runtime::event_record", "Runtime::event_elapsed_ms"))
def event_timestamps(ctx):
    """An event's timestamp is taken when its stream reaches the record, not when the host
    issues it: with QUEUED_MS (200 ms) of work queued between two timing events the interval is
    at least a quarter of the time the host waited for it however fast the host returned from
    queueing it, and two events
    recorded back to back behind that much queued work are less than a quarter of it apart
    (torch.Event.elapsed_time, as cudaEventElapsedTime's device timestamps; a driver that
    stamps events at issue measures the host's calls instead)."""
    ones = torch.ones(BIG, device=ctx.device)
    chains = _chains_for(ctx, ones, QUEUED_MS)
    start, end = (torch.Event(ctx.device, enable_timing=True) for _ in range(2))
    started = time.perf_counter()
    start.record()
    _queue(ctx, ones, chains)
    end.record()
    end.synchronize()
    host_ms = (time.perf_counter() - started) * 1000
    across = start.elapsed_time(end)
    assert across >= host_ms / 4, (
        f"elapsed_time across {chains * CHAIN} queued kernels is {across:.1f} ms, but the host "
        f"waited {host_ms:.1f} ms for them: under a quarter (timestamps taken when record() was "
        "called, not when the stream reached it?)")
    behind, after = (torch.Event(ctx.device, enable_timing=True) for _ in range(2))
    _queue(ctx, ones, chains)
    behind.record()
    after.record()
    after.synchronize()
    apart = behind.elapsed_time(after)
    assert 0 <= apart < host_ms / 4, (
        f"two events recorded back to back behind {chains * CHAIN} queued kernels are "
        f"{apart:.1f} ms apart, with the queue taking {host_ms:.1f} ms: expected under a quarter "
        "of it")


#: Kernels the high-priority stream runs in stream_priority, and the low-priority one.
HIGH_KERNELS, LOW_KERNELS = 32, 2


@check(requires=("accelerator", "serial-streams"),
       covers=("torch.<device>.Stream", "guard.getNewStream", "Runtime::stream_create",
               "Runtime::stream_priority_range"))
def stream_priority(ctx):
    """A high-priority stream's work runs before a low-priority stream's that became ready at
    the same time: both streams wait for an event behind a queue of work on the current stream,
    then the low-priority one (Stream(priority=least)) queues LOW_KERNELS copies of a counter
    and the high-priority one (Stream(priority=greatest)) HIGH_KERNELS increments of it; on a
    device that runs one stream's work at a time, highest priority first, every copy sees all
    the increments (torch.cuda.Stream(priority=...), cudaStreamCreateWithPriority; FSDP2 and
    pipelining put communication on high-priority streams). SKIP on a device with one priority
    (Stream.priority_range()), or whose streams run concurrently."""
    handle = _handle(ctx)
    least, greatest = handle.Stream.priority_range()
    if least == greatest:
        ctx.skip(f"torch.{ctx.device_type}.Stream.priority_range() is {(least, greatest)}: "
                 "the device has one stream priority")
    ones = torch.ones(BIG, device=ctx.device)
    counter = torch.zeros(1024, device=ctx.device)
    low, high = handle.Stream(priority=least), handle.Stream(priority=greatest)
    handle.synchronize()
    _queue(ctx, ones, 4)
    gate = torch.Event(ctx.device)
    gate.record()
    low.wait_event(gate)
    high.wait_event(gate)
    with handle.stream(low):
        seen = [counter.clone() for _ in range(LOW_KERNELS)]
    with handle.stream(high):
        for _ in range(HIGH_KERNELS):
            counter.add_(1)
    handle.synchronize()
    values = [float(t[0]) for t in seen]
    assert values == [float(HIGH_KERNELS)] * LOW_KERNELS, (
        f"the low-priority stream's copies of the counter saw {values} of the high-priority "
        f"stream's {HIGH_KERNELS} increments, queued after them and ready at the same time: "
        f"the priority {greatest} stream's work did not run first (priority ignored?)")
