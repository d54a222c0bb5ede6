"""The mock device itself: registration and autoload, device count and index
errors, device mismatch errors, the allocator (capacity, OOM, statistics), streams and
events, torch.accelerator, pin_memory, storage resize, torch.save/torch.load.

The module runs inside the mock, in each of its modes (tests/support/mock_process.py); the tests that
need a fresh interpreter each (autoload, first use, environment variables) are in
tests/mock/test_mock_device_first_use.py."""

from __future__ import annotations

import io
import os
import re

import accelkit.backends.mock  # noqa: F401
import pytest
import torch

pytestmark = pytest.mark.mock_process(modes=("default", "discrete", "async", "discrete-async"),
                                      env={"ACCELKIT_MOCK_MEMORY": "64MiB"})


MiB = 2**20


def test_registered_as_accelerator():
    assert torch._C._get_privateuse1_backend_name() == "mock"
    assert torch.accelerator.current_accelerator() == torch.device("mock")
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.mock.device_count() == 8
    assert torch.mock.is_available()
    assert torch.ones(1).mock().is_mock
    assert torch.mock.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]


def test_module_to_keeps_parameter_identity():
    """nn.Module.to / Tensor.data swap device tensors into existing Parameters, as on CUDA
    (the PrivateUse1 kernel of _has_compatible_shallow_copy_type)."""
    assert torch._has_compatible_shallow_copy_type(torch.empty(2), torch.empty(2, device="mock"))
    assert torch._has_compatible_shallow_copy_type(torch.empty(2, device="mock"), torch.empty(2))
    assert not torch._has_compatible_shallow_copy_type(torch.empty(2, device="mock"),
                                                       torch.empty(2, device="meta"))
    lin = torch.nn.Linear(2, 2)
    w = lin.weight
    lin.to("mock")
    assert lin.weight is w and w.device.type == "mock"
    emb, head = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False)
    head.weight = emb.weight
    m = torch.nn.Sequential(emb, head).to("mock")
    assert m[1].weight is m[0].weight and len(list(m.parameters())) == 1
    p = torch.nn.Parameter(torch.randn(3))
    p.data = p.data.to("mock")
    assert p.device.type == "mock"
    opt_model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(opt_model.parameters(), lr=0.1)  # built before .to()
    opt_model.to("mock")
    before = opt_model.weight.detach().cpu().clone()
    opt_model(torch.ones(2, 3, device="mock")).sum().backward()
    opt.step()
    assert not torch.equal(opt_model.weight.detach().cpu(), before)


def test_sdpa_choice_matches_what_sdpa_runs():
    """scaled_dot_product_attention on the device takes the math path; _fused_sdp_choice
    says so (it would answer the CPU's choice through the fallback)."""
    q = torch.randn(1, 2, 4, 8, device="mock")
    assert torch._fused_sdp_choice(q, q, q) == 0  # SDPBackend.math
    ref = torch.nn.functional.scaled_dot_product_attention(q.cpu(), q.cpu(), q.cpu())
    torch.testing.assert_close(
        torch.nn.functional.scaled_dot_product_attention(q, q, q).cpu(), ref)


def test_native_kernel_hands_other_cases_to_the_fallback():
    """The mock's add/sub/mul kernels (csrc/kernels/binary_ops.cpp) take dense same-shape
    floating tensors; broadcasting, promotion and views go to accelkit's fallback."""
    a = torch.arange(6.0).reshape(2, 3)
    b = torch.full((2, 3), 0.5)
    ma, mb = a.to("mock"), b.to("mock")
    for got, want in [(ma + mb, a + b), (ma - mb, a - b), (ma * mb, a * b),
                      (ma + mb[0], a + b[0]), (ma.t() * mb.t(), a.t() * b.t()),
                      (ma.int() + 1, a.int() + 1), (torch.add(ma, mb, alpha=2), a + 2 * b),
                      (ma.double() * mb, a.double() * b)]:
        assert got.device.type == "mock"
        assert torch.equal(got.cpu(), want), (got, want)


def test_current_device_per_thread_and_context():
    import threading

    torch.mock.set_device(2)
    assert torch.mock.current_device() == 2 and torch.accelerator.current_device_index() == 2
    assert torch.empty(1, device="mock").device == torch.device("mock:2")
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.mock.current_device()))
    t.start()
    t.join()
    assert seen == [0]  # a new thread starts on device 0, as CUDA
    with torch.mock.device(5):
        assert torch.mock.current_device() == 5
    assert torch.mock.current_device() == 2
    torch.accelerator.set_device_index(1)
    assert torch.mock.current_device() == 1
    torch.mock.set_device("mock:0")
    assert torch.mock.current_device() == 0


@pytest.mark.parametrize("action", [
    lambda: torch.empty(1, device="mock:8"),
    lambda: torch.mock.set_device(8),
    lambda: torch.ones(1).to("mock:99"),
])
def test_invalid_index(action):
    with pytest.raises(RuntimeError, match=re.escape(
            "mock error: invalid device ordinal: device ") + r"\d+" + re.escape(
            " requested but 8 mock devices are available (valid indices 0..7). Set "
            "ACCELKIT_MOCK_DEVICES to change the number of mock devices.")):
        action()


def test_device_mismatch_errors():
    a = torch.ones(4, device="mock:0")
    with pytest.raises(RuntimeError, match=re.escape(
            "Expected all tensors to be on the same device, but found at least two devices, "
            "mock:0 and cpu!")):
        torch.add(a, torch.ones(4))
    with pytest.raises(RuntimeError, match=re.escape(
            "Expected all tensors to be on the same device, but found at least two devices, "
            "mock:0 and mock:1!")):
        torch.mul(a, torch.ones(4, device="mock:1"))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, 4, device="mock") @ torch.ones(4, 2)
    # 0-dim CPU tensors are scalars, as on CUDA; CPU index tensors are accepted by indexing.
    assert (a * torch.tensor(2.0)).sum().item() == 8
    assert a[torch.tensor([0, 2])].device == a.device


def _layouts(device):
    """A sparse COO, a CSR, a CSC and a nested tensor built on ``device`` (its factory's
    ``device=``), with their CPU twins."""
    import warnings

    warnings.filterwarnings("ignore", "The PyTorch API of nested tensors")
    warnings.filterwarnings("ignore", "Sparse (CSR|invariant)")
    i, v = torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3.0, 4.0, 5.0])
    crow, col = torch.tensor([0, 1, 3]), torch.tensor([2, 0, 2])
    parts = [torch.arange(6.0).reshape(2, 3), torch.arange(3.0).reshape(1, 3)]
    return {
        "coo": (torch.sparse_coo_tensor(i, v, (2, 3)),
                torch.sparse_coo_tensor(i, v, (2, 3), device=device)),
        "csr": (torch.sparse_csr_tensor(crow, col, v, (2, 3)),
                torch.sparse_csr_tensor(crow, col, v, (2, 3), device=device)),
        "csc": (torch.sparse_csr_tensor(crow, col, v, (2, 3)).to_sparse_csc(),
                torch.sparse_csr_tensor(crow, col, v, (2, 3), device=device).to_sparse_csc()),
        "nested": (torch.nested.nested_tensor(parts),
                   torch.nested.nested_tensor(parts, device=device)),
    }


def _parts(t):
    """Where a sparse or nested tensor's data lives: its member tensors' devices."""
    if t.is_nested:
        return {t.values().device}
    if t.layout == torch.sparse_coo:
        return {t._indices().device, t._values().device}
    if t.layout == torch.sparse_csc:
        return {t.ccol_indices().device, t.row_indices().device, t.values().device}
    return {t.crow_indices().device, t.col_indices().device, t.values().device}


def _dense(t):
    return torch.nested.to_padded_tensor(t, 0.0) if t.is_nested else t.to_dense()


@pytest.mark.parametrize("layout", ["coo", "csr", "csc", "nested"])
def test_sparse_and_nested_tensors_go_to_the_device_asked_for(layout):
    """Sparse, compressed-sparse and nested tensors land on the device an op asks for, as
    dense ones do: ``.cpu()`` on the CPU, ``.to("mock:1")`` on device 1 (their indices and
    values too), factories on their ``device=`` (not the current device), an op on device
    1's tensors on device 1; in-place ops return the tensor itself; no op leaves another
    device current."""
    torch.mock.set_device(0)
    cpu, on0 = _layouts("mock:0")[layout]
    moved = on0.cpu()
    assert moved.device == torch.device("cpu") and _parts(moved) == {torch.device("cpu")}
    assert torch.equal(_dense(moved), _dense(cpu))
    on1 = on0.to("mock:1")
    assert on1.device == torch.device("mock:1"), on1.device
    assert _parts(on1) == {torch.device("mock:1")}, _parts(on1)
    assert torch.equal(_dense(on1.cpu()), _dense(cpu))
    assert torch.mock.current_device() == 0
    twice = on1 * 2
    assert twice.device == torch.device("mock:1") and _parts(twice) == {torch.device("mock:1")}
    assert torch.equal(_dense(twice.cpu()), _dense(cpu * 2))
    if layout != "csc":  # torch has no in-place mul_ for CSC on any device
        same = on1.clone()
        assert same.mul_(3) is same
        assert same.device == torch.device("mock:1")
        assert torch.equal(_dense(same.cpu()), _dense(cpu * 3))
    assert torch.mock.current_device() == 0, "an op left another device current"
    made = _layouts("mock:1")[layout][1]  # current device 0, factory asks for 1
    assert made.device == torch.device("mock:1") and _parts(made) == {torch.device("mock:1")}
    with torch.mock.device(1):
        here = _layouts("mock")[layout][1]
    assert here.device == torch.device("mock:1") and _parts(here) == {torch.device("mock:1")}
    back = cpu.to("mock:1")
    assert back.device == torch.device("mock:1") and _parts(back) == {torch.device("mock:1")}
    assert torch.equal(_dense(back.cpu()), _dense(cpu))
    if layout == "coo":
        zeros = torch.zeros(2, 3, layout=torch.sparse_coo, device="mock:1")
        assert zeros.device == torch.device("mock:1") and _parts(zeros) == {torch.device("mock:1")}
    assert torch.mock.current_device() == 0


def test_oom_message_and_counters():
    torch.mock.reset_accumulated_memory_stats(0)
    keep = torch.empty(40 * MiB // 4, device="mock")  # capacity 64MiB in this process
    with pytest.raises(torch.OutOfMemoryError, match=re.escape(
            "mock out of memory. Tried to allocate 32.00 MiB. Device 0 has a total capacity "
            "of 64.00 MiB of which ") + r"[\d.]+ MiB" + re.escape(
            " is free. Of the allocated memory ") + r"[\d.]+ MiB" + re.escape(
            " is allocated by PyTorch, and ") + r"[\d.]+ (MiB|KiB|bytes)" + re.escape(
            " is reserved by PyTorch but unallocated. Set ACCELKIT_MOCK_MEMORY (e.g. "
            "ACCELKIT_MOCK_MEMORY=16GiB) to change the capacity of each mock device.")):
        torch.empty(32 * MiB // 4, device="mock")
    assert torch.mock.memory_stats()["num_ooms"] == 1
    # The fallback's adopted outputs count too: a CPU kernel's result over capacity fails.
    with pytest.raises(torch.OutOfMemoryError, match="mock out of memory"):
        torch.cat([keep, keep])
    del keep
    assert torch.empty(40 * MiB // 4, device="mock:1").numel() == 10 * MiB  # per device


def test_caching_allocator_statistics():
    """CUDA's semantics (torch.cuda.memory_stats): allocated counts blocks in use (a 1 MiB
    request takes a 2 MiB block), a freed block stays reserved and is reused, empty_cache
    gives it back; peaks and mem_get_info follow."""
    torch.mock.synchronize()
    torch.mock.empty_cache()
    base, reserved = torch.mock.memory_allocated(), torch.mock.memory_reserved()
    torch.mock.reset_peak_memory_stats()
    calls = torch.mock.memory_stats()["num_device_alloc"]
    x = torch.empty(MiB // 4, device="mock")
    assert torch.mock.memory_allocated() == base + 2 * MiB
    assert torch.mock.memory_reserved() == reserved + 2 * MiB
    y = x + 1  # a fallback output: adopted (1 MiB) on synchronous host memory, else a new
    extra = MiB if torch.mock.host_accessible() and not torch.mock.is_async() else 2 * MiB
    # block (allocated ahead of the queued kernel on an asynchronous device)
    assert torch.mock.memory_allocated() == base + 2 * MiB + extra
    assert torch.accelerator.memory_allocated() == base + 2 * MiB + extra
    ptr = x.data_ptr()
    del x, y
    torch.mock.synchronize()
    assert torch.mock.memory_allocated() == base
    assert torch.mock.memory_reserved() >= reserved + 2 * MiB  # cached, not returned
    z = torch.empty(MiB // 4, device="mock")
    assert z.data_ptr() == ptr  # the cached block again, no new device allocation
    assert torch.mock.memory_stats()["num_device_alloc"] - calls == (1 if extra == MiB else 2)
    del z
    assert torch.mock.max_memory_allocated() == base + 2 * MiB + extra
    stats = torch.mock.memory_stats()
    assert stats["allocated_bytes.all.peak"] == base + 2 * MiB + extra
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
    assert stats == dict(sorted(stats.items()))
    torch.mock.reset_peak_memory_stats()
    assert torch.mock.max_memory_allocated() == base
    torch.mock.empty_cache()
    assert torch.mock.memory_reserved() == reserved
    free, total = torch.mock.mem_get_info()
    assert total == 64 * MiB and free == total - reserved


def test_oom_releases_the_cache_first():
    """A request the cache stands in the way of succeeds: the cached blocks go back to the
    device and the allocation is retried (num_alloc_retries), as CUDA's allocator does."""
    torch.mock.empty_cache()
    retries = torch.mock.memory_stats()["num_alloc_retries"]
    cached = [torch.empty(8 * MiB // 4, device="mock") for _ in range(5)]
    del cached  # 40 MiB reserved, nothing allocated
    big = torch.empty(48 * MiB // 4, device="mock")
    assert torch.mock.memory_stats()["num_alloc_retries"] == retries + 1
    del big
    torch.mock.empty_cache()


def test_device_module_exports_torch_cuda_names_only():
    """torch.mock's public names are torch.cuda's (the cuda-like contract torch's
    distributed stack calls), get_amp_supported_dtype (what torch.autocast asks a
    PrivateUse1 module, torch/amp/autocast_mode.py) and the two accelkit adds to say the
    device's mode; a helper of the module's builder never becomes public API."""
    public = {k for k in vars(torch.mock) if not k.startswith("_")}
    extra = {"get_amp_supported_dtype", "host_accessible", "is_async"}
    assert public - set(dir(torch.cuda)) == extra
    assert set(torch.mock.__all__) == public


def test_streams_and_events():
    s = torch.mock.Stream()
    assert isinstance(s, torch.Stream) and isinstance(s, torch.mock.Stream)
    assert s.device == torch.device("mock:0") and s.query()
    default = torch.mock.current_stream()
    assert default.stream_id == 0 and torch.accelerator.current_stream() == default
    with torch.mock.stream(s):
        assert torch.mock.current_stream() == s
        assert torch.accelerator.current_stream() == s
    assert torch.mock.current_stream() == default
    start, end = torch.mock.Event(enable_timing=True), torch.Event(enable_timing=True)
    start.record()
    torch.ones(1000, device="mock").sum()
    end.record()
    end.synchronize()
    assert start.query() and start.elapsed_time(end) >= 0
    s.wait_event(end)
    s.wait_stream(default)
    s.synchronize()
    plain = torch.mock.Event()
    plain.record()
    with pytest.raises(ValueError, match="Both events must be created with argument "
                                         "'enable_timing=True'"):
        plain.elapsed_time(end)
    torch.accelerator.synchronize()


def test_stream_pool_priorities_and_external_streams():
    """Streams come from a pool of driver streams per priority level (as torch.cuda's): the
    mock's range is (0, -3); a priority outside it is clamped; 32 streams of one priority are
    handed out round-robin, so the 33rd is the first again; an ExternalStream queues work on a
    stream the driver made; a stream id the layer never handed out is refused, naming it."""
    from accelkit.backends.mock import _C

    assert torch.mock.Stream.priority_range() == (0, -3)
    ids = {p: torch.mock.Stream(priority=p).stream_id for p in (0, -1, -2, -3, -9, 5)}
    assert len({ids[0], ids[-1], ids[-2], ids[-3]}) == 4
    assert ids[-9] // 32 == ids[-3] // 32 and ids[5] // 32 == ids[0] // 32  # clamped levels
    ring = [torch.mock.Stream(priority=-1) for _ in range(33)]
    assert ring[32] == ring[0] and len({s.stream_id for s in ring}) == 32
    handle = _C._create_stream(-2)
    try:
        external = torch.mock.ExternalStream(handle)
        assert external == torch.mock.ExternalStream(handle)  # one id per driver stream
        assert external.stream_id not in {s.stream_id for s in ring}
        with torch.mock.stream(external):
            _C._sleep(200)
            assert external.query() is (not torch.mock.is_async())
        assert torch.mock.current_stream().query()  # the work went to the external stream
        external.synchronize()
        assert external.query()
    finally:
        _C._destroy_stream(handle)
    with pytest.raises(RuntimeError, match=r"a stream the driver created, not null"):
        torch.mock.ExternalStream(0)
    with pytest.raises(RuntimeError, match=r"stream id 12345 is not a stream of mock:0"):
        torch.mock.set_stream(torch.Stream(stream_id=12345, device_index=0,
                                           device_type=torch.mock.current_stream().device_type))


def test_work_is_queued_on_streams():
    """Asynchronous mock: a call returns before its kernel ran (the stream is busy), work on
    a stream runs in order, another stream sees it only after waiting on an event, and
    reading a result waits for it. A synchronous mock runs the same program with the same
    values (its work is done when a call returns), so there it checks only the values."""
    from accelkit.backends.mock import _C

    a = torch.ones(1 << 16, device="mock")
    _C._sleep(300)
    b = a + a  # the mock's native kernel, queued behind the sleep
    assert torch.mock.current_stream().query() is (not torch.mock.is_async())
    assert b.cpu()[0].item() == 2.0  # a copy to the host waits for the stream
    assert torch.mock.current_stream().query()
    side = torch.mock.Stream()
    _C._sleep(300)
    c = a * a  # default stream, behind the sleep
    done = torch.mock.Event()
    done.record()
    with torch.mock.stream(side):
        side.wait_event(done)
        d = c + c
        assert d.cpu().sum().item() == 2 * (1 << 16)


def test_streams_hold_no_thread_while_they_wait():
    """Asynchronous mock: streams run on a fixed set of worker threads (a stream costs a
    queue, not a thread), and a stream waiting on an event holds none of them: with 31
    streams waiting for an event behind a busy default stream, another stream's work still
    runs, and every waiting stream finishes once the event completes (32 pool streams in all:
    a 33rd would be the first again, as torch.cuda.Stream() hands them out)."""
    from accelkit.backends.mock import _C

    if not torch.mock.is_async():
        return
    threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
    before = threads()
    x = torch.ones(1024, device="mock")
    torch.mock.synchronize()
    _C._sleep(300)
    gate = torch.mock.Event()
    gate.record()
    outs = []
    for _ in range(31):
        waiting = torch.mock.Stream()
        with torch.mock.stream(waiting):
            waiting.wait_event(gate)
            outs.append(x * 2)
    free = torch.mock.Stream()
    with torch.mock.stream(free):
        y = x + x
    free.synchronize()
    assert not gate.query(), "a stream ran only after the waiting streams were resumed"
    torch.mock.synchronize()
    assert all(o.sum().item() == 2048 for o in outs) and y.sum().item() == 2048
    assert threads() - before <= 8, f"{threads() - before} threads for 33 streams"


def test_record_stream_keeps_memory_from_reuse():
    """A block another stream still reads is not handed out again before that stream has
    passed the free (Tensor.record_stream, CUDA's caching allocator). Without it, the new
    tensor's write would land before the side stream read the old values."""
    from accelkit.backends.mock import _C

    t = torch.full((1 << 18,), 3.0, device="mock")
    ptr = t.data_ptr()
    side = torch.mock.Stream()
    side.wait_stream(torch.mock.current_stream())
    with torch.mock.stream(side):
        _C._sleep(300)
        out = t * t  # reads t on the side stream, behind the sleep
    t.record_stream(side)
    del t
    u = torch.empty(1 << 18, device="mock")
    assert (u.data_ptr() != ptr) is torch.mock.is_async()
    u.fill_(7.0)
    side.synchronize()
    assert torch.equal(out.cpu(), torch.full((1 << 18,), 9.0))


def test_ops_without_a_native_kernel_are_launches():
    """Asynchronous mock: ops through the fallback (a reduction, a matmul, elementwise), in
    place (mul_), out= and random (uniform_) return before their work ran: queued behind a
    sleep, the stream is still busy when they return, and the values are right once it ran.
    A synchronous mock runs the same program and checks the values."""
    from accelkit.backends.mock import _C

    host = torch.arange(16.0).reshape(4, 4) / 4
    x = host.to("mock")
    y, out, u = x.clone(), torch.empty(4, 4, device="mock"), torch.empty(1 << 12, device="mock")
    torch.mock.synchronize()
    busy = []
    _C._sleep(500)  # each call below returns while the stream still sleeps, or after it ran
    e = torch.exp(x)
    busy.append(not torch.mock.current_stream().query())
    m = torch.mm(x, x)
    busy.append(not torch.mock.current_stream().query())
    total = x.sum()
    busy.append(not torch.mock.current_stream().query())
    r = torch.relu(x)
    busy.append(not torch.mock.current_stream().query())
    y.mul_(3.0)
    busy.append(not torch.mock.current_stream().query())
    torch.sqrt(x, out=out)
    busy.append(not torch.mock.current_stream().query())
    u.uniform_()
    busy.append(not torch.mock.current_stream().query())
    assert busy == [torch.mock.is_async()] * 7, busy
    torch.testing.assert_close(e.cpu(), torch.exp(host))
    torch.testing.assert_close(m.cpu(), torch.mm(host, host))
    torch.testing.assert_close(total.cpu(), host.sum())
    torch.testing.assert_close(r.cpu(), torch.relu(host))
    torch.testing.assert_close(y.cpu(), host * 3)
    torch.testing.assert_close(out.cpu(), torch.sqrt(host))
    drawn = u.cpu()
    assert 0.0 <= drawn.min().item() and drawn.max().item() < 1.0 and drawn.std().item() > 0.2


def test_ops_whose_composite_kernel_reads_memory_run_as_cpu_ops():
    """Ops whose composite kernel is the CPU's implementation (it reads tensor memory on the
    host: _grid_sampler_2d_cpu_fallback and its backward, _saturate_weight_to_fp16) give
    the CPU's values on mock inputs still being produced behind a sleep: run on the device
    tensors directly they crashed on discrete memory and, on an asynchronous device, read
    the inputs before their producers ran."""
    import warnings

    from accelkit.backends.mock import _C

    image, grid = torch.randn(1, 2, 5, 5), torch.rand(1, 3, 3, 2) * 2 - 1
    weight = torch.tensor([[1e6, -1e6], [0.5, 3.0]])
    x, g, w = image.to("mock"), grid.to("mock"), weight.to("mock")
    _C._sleep(300)
    x, g, w = x * 2, g * 0.5, w * 2  # the inputs, produced behind the sleep
    image, grid, weight = image * 2, grid * 0.5, weight * 2
    sampler = torch.ops.aten._grid_sampler_2d_cpu_fallback
    out = sampler(x, g, 0, 0, False)
    torch.testing.assert_close(out.cpu(), sampler(image, grid, 0, 0, False))
    backward = torch.ops.aten._grid_sampler_2d_cpu_fallback_backward
    grads = backward(torch.ones_like(out), x, g, 0, 0, False)
    expected = backward(torch.ones(out.shape), image, grid, 0, 0, False)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got.cpu(), want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "FOUND weight out of range": what it saturates
        saturate = torch.ops.aten._saturate_weight_to_fp16
        torch.testing.assert_close(saturate(w).cpu(), saturate(weight))


def test_a_queued_op_computes_on_the_memory_its_arguments_had_at_the_call():
    """FSDP2 frees an unsharded parameter (untyped_storage().resize_(0)) right after queueing
    the ops that read it: a queued op computes on the memory the tensor had when the op
    was called, as a kernel launch takes its pointers, not on what the tensor holds when
    the stream gets there (the freed block is reused only by work queued after)."""
    import math

    from accelkit.backends.mock import _C

    x = torch.ones(1 << 10, device="mock")
    _C._sleep(300)
    y = torch.exp(x)  # through the fallback: queued behind the sleep
    u = torch.empty_like(x).uniform_()
    x.untyped_storage().resize_(0)
    u_memory = u.untyped_storage()
    u.set_(torch.empty(0, device="mock"))  # the tensor re-pointed before its kernel ran
    torch.testing.assert_close(y.cpu(), torch.full((1 << 10,), math.e))
    drawn = torch.empty(0, device="mock").set_(u_memory).cpu()
    assert drawn.min().item() >= 0.0 and drawn.std().item() > 0.2


def test_a_queued_fallback_ops_error_surfaces_at_the_next_synchronization():
    """A CPU kernel that fails in a queued op (an index out of range, which no shape
    inference sees) is the stream's asynchronous error, naming the op, as a CUDA kernel's
    device-side assert; a synchronous mock raises it at the call."""
    x = torch.ones(4, 4, device="mock")
    index = torch.tensor([0, 99], device="mock")
    if not torch.mock.is_async():
        with pytest.raises((IndexError, RuntimeError), match="out of range"):
            torch.index_select(x, 0, index)
        return
    torch.index_select(x, 0, index)
    with pytest.raises(RuntimeError, match="index_select failed on device 0"):
        torch.mock.synchronize()
    assert torch.ones(2, device="mock").sum().item() == 2.0

#: Elements of the fallback outputs the next two tests free early (8 MiB of float32).
ADOPTED = 1 << 21


def _adopted(value: float):
    """A fallback output of ADOPTED elements equal to ``value``: masked_select's output
    size depends on the mask's values, so the op runs at the call even on an asynchronous
    device and its CPU kernel's buffer is adopted as device memory on host memory."""
    keep = torch.ones(ADOPTED, dtype=torch.bool, device="mock")
    return torch.masked_select(torch.full((ADOPTED,), value, device="mock"), keep)


def test_fallback_outputs_live_until_the_work_queued_on_their_stream_ran():
    """A fallback output (on host memory, a CPU kernel's buffer adopted as device memory)
    made on a side stream is freed only once that stream ran the work queued on it before
    the free (the block records the stream it was made on, as an allocation does): freed
    at once, the queued kernel would read memory the next adoptions took."""
    from accelkit.backends.mock import _C

    side = torch.mock.Stream()
    with torch.mock.stream(side):
        a = _adopted(1.0)
        _C._sleep(300)
        b = a * a  # queued behind the sleep, reads a
    del a
    reuse = [_adopted(5.0) for _ in range(4)]  # may take a's freed memory
    side.synchronize()
    assert torch.equal(b.cpu(), torch.ones(ADOPTED))
    del reuse


def test_record_stream_keeps_fallback_outputs_alive():
    """Tensor.record_stream on a fallback output (an adopted block): freed on the host while
    another stream still has to read it, its memory outlives that read."""
    from accelkit.backends.mock import _C

    a = _adopted(1.0)
    side = torch.mock.Stream()
    side.wait_stream(torch.mock.current_stream())
    with torch.mock.stream(side):
        _C._sleep(300)
        b = a * a
    a.record_stream(side)
    del a
    reuse = [_adopted(5.0) for _ in range(4)]
    side.synchronize()
    assert torch.equal(b.cpu(), torch.ones(ADOPTED))
    del reuse


def test_allocator_under_threads_streams_and_empty_cache():
    """The caching allocator used from several host threads at once, each on its own stream,
    with record_stream to a second stream, empty_cache() from another thread and requests
    past the capacity (64 MiB here: the OOM retry path releases the cache first): every result
    is right, nothing crashes, and a block freed while another thread releases the cache is
    not given back with work still queued on it."""
    import threading

    from accelkit.backends.mock import _C

    errors, stop = [], threading.Event()
    n = 1 << 20  # 4 MiB blocks: two threads hold at most 32 MiB of the 64

    def worker(seed):
        try:
            own, other = torch.mock.Stream(), torch.mock.Stream()
            for i in range(20):
                with torch.mock.stream(own):
                    x = torch.full((n,), float(seed + i), device="mock")
                    _C._sleep(2)
                    y = x + x  # queued, reads x
                other.wait_stream(own)
                with torch.mock.stream(other):
                    z = x * x
                x.record_stream(other)
                del x  # cached while y and z still read it
                with pytest.raises(torch.OutOfMemoryError):  # over the capacity: the
                    torch.empty(17 * n, device="mock")  # retry path releases the cache first
                own.synchronize()
                other.synchronize()
                v = float(seed + i)
                assert y[::4096].cpu().eq(2 * v).all(), f"thread {seed} step {i}: y"
                assert z[::4096].cpu().eq(v * v).all(), f"thread {seed} step {i}: z"
                del y, z
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    def emptier():
        while not stop.is_set():
            torch.mock.empty_cache()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in (1, 1000)]
    cleaner = threading.Thread(target=emptier)
    for t in [*threads, cleaner]:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    cleaner.join(60)
    assert not any(t.is_alive() for t in [*threads, cleaner]), "a thread hangs"
    assert not errors, errors
    torch.mock.synchronize()
    torch.mock.empty_cache()
    assert torch.mock.memory_reserved() == torch.mock.memory_allocated(), "blocks left cached"


def test_errors_of_queued_work_surface_at_the_next_synchronization():
    """An asynchronous kernel's error is raised by the next synchronizing call, naming the
    kernel (a synchronous device raises it at the call)."""
    from accelkit.backends.mock import _C

    if not torch.mock.is_async():
        with pytest.raises(RuntimeError, match="boom"):
            _C._fail("boom")
        return
    _C._fail("boom")
    with pytest.raises(RuntimeError, match="mock: an asynchronous operation failed: _fail "
                                           "failed on device 0: boom"):
        torch.mock.synchronize()
    torch.mock.synchronize()  # raised once; the device works again
    assert torch.ones(2, device="mock").sum().item() == 2.0
def test_every_wait_terminates_after_an_asynchronous_error():
    """After a queued kernel failed, the device drops the work queued behind it, event
    records included; the events complete all the same, so Event.synchronize(), a stream
    waiting on such an event and the host waiting on that stream all return, and the error
    is raised once, by the next synchronizing call."""
    import threading

    from accelkit.backends.mock import _C

    if not torch.mock.is_async():
        return
    side = torch.mock.Stream()
    _C._fail("first")
    done = torch.mock.Event()
    done.record()  # dropped: queued after the failure
    side.wait_event(done)
    finished = []
    waiter = threading.Thread(target=lambda: (done.synchronize(), finished.append(True)))
    waiter.start()
    waiter.join(30)
    assert finished, "Event.synchronize() blocks forever on a record dropped after an error"
    with pytest.raises(RuntimeError, match="_fail failed on device 0: first"):
        side.synchronize()
    torch.mock.synchronize()  # raised once
    assert torch.ones(2, device="mock").sum().item() == 2.0


def test_pin_memory_and_storage_resize():
    pinned = torch.arange(6.0).pin_memory()
    assert pinned.is_pinned() and not torch.arange(6.0).is_pinned()
    assert torch.equal(pinned.to("mock", non_blocking=True).cpu(), torch.arange(6.0))
    x = torch.arange(4.0, device="mock")
    st = x.untyped_storage()
    st.resize_(64)
    assert st.nbytes() == 64
    assert torch.equal(x.cpu(), torch.arange(4.0))  # the first bytes are kept
    y = torch.empty(0, device="mock")
    y.resize_(3, 5)
    assert y.shape == (3, 5) and y.untyped_storage().nbytes() == 60


def test_save_load_round_trip():
    x = torch.randn(3, 4).to("mock:1")
    buf = io.BytesIO()
    torch.save({"x": x, "view": x[1:]}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["x"].device == torch.device("mock:1")
    assert torch.equal(loaded["x"].cpu(), x.cpu())
    assert loaded["view"].untyped_storage().data_ptr() == loaded["x"].untyped_storage().data_ptr()
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["x"].device.type == "cpu" and torch.equal(on_cpu["x"], x.cpu())


def test_autocast_policies():
    a = torch.randn(4, 4, device="mock", requires_grad=True)
    with torch.autocast("mock", dtype=torch.bfloat16):
        mm = a @ a
        assert mm.dtype == torch.bfloat16
        assert torch.nn.functional.linear(a, a).dtype == torch.bfloat16
        assert torch.softmax(mm, 0).dtype == torch.float32  # fp32 policy
        assert (a + 1).dtype == torch.float32  # not listed: unchanged
    mm.float().sum().backward()
    assert a.grad.dtype == torch.float32 and a.grad.device.type == "mock"


def test_module_to_device_and_state_dict():
    model = torch.nn.Linear(3, 2).to("mock")
    assert all(p.device.type == "mock" for p in model.parameters())
    sd = model.state_dict()
    assert sd["weight"].device == torch.device("mock:0")
