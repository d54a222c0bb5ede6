"""How the backend is registered with torch: the device's default collective library (PR 102468
added a default backend per device so DeviceMesh can pick it), the default group's backend for
the device (PR 102336: DeviceMesh only sees a dispatchable process group), the device handle
``torch.<device>`` that DeviceMesh / DTensor / the RNG tracker call (PR 102468), the
``torch.accelerator`` API, and seeding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from accelkit.conformance.api import Defaults, check
from accelkit.conformance.checks._util import (
    ALSO_AT,
    all_ranks_object,
    assert_equal,
    assert_value,
)

CHECK_DEFAULTS = Defaults(also_at=ALSO_AT, any_world_size=True)


def _handle(ctx):
    return getattr(torch, ctx.device_type)


@check
def default_backend_for_device(ctx):
    """Backend.default_device_backend_map and get_default_backend_for_device name the backend's
    collective library for its device type (given as a str and as a torch.device), and the
    library is a known Backend (PR 102468: a default backend per device)."""
    be = ctx.spec.collective_backend
    mapped = dist.Backend.default_device_backend_map.get(ctx.device_type)
    assert mapped == be, f"default_device_backend_map[{ctx.device_type!r}] is {mapped!r}, expected {be!r}"
    for device in (ctx.device_type, ctx.device):
        got = dist.get_default_backend_for_device(device)
        assert got == be, f"get_default_backend_for_device({device!r}) is {got!r}, expected {be!r}"
    assert be in dist.Backend.backend_list, f"{be!r} is not in Backend.backend_list"
    capability = dist.Backend.backend_capability.get(be, [])
    assert ctx.device_type in capability, f"Backend.backend_capability[{be!r}] = {capability}"


@check
def group_backend_for_device(ctx):
    """The default group's backend for the device is the backend's library and reports its own
    name (the device Backend's name(), e.g. "mockccl"), and the group's backend config maps the
    device type to it. torch 2.13 limit, documented rather than failed: for an out-of-tree
    library ProcessGroup.name() / _get_backend_name() say "custom" (they name the BackendType,
    and every out-of-tree library is BackendType.CUSTOM), so only that is accepted there
    (PR 102336: the dispatchable process group)."""
    pg = dist.group.WORLD
    be = ctx.spec.collective_backend
    device_backend = pg._get_backend(torch.device(ctx.device_type))
    assert device_backend.name() == be, (
        f"the default group's {ctx.device_type} backend reports {device_backend.name()!r}, expected {be!r}")
    config = dist.get_backend_config(pg)
    assert f"{ctx.device_type}:{be}" in config, f"get_backend_config() is {config!r}"
    builtin = be.upper() in ("GLOO", "NCCL", "XCCL", "UCC", "MPI")
    expected_type = (dist.ProcessGroup.BackendType.CUSTOM if not builtin
                     else getattr(dist.ProcessGroup.BackendType, be.upper()))
    assert dist.Backend.backend_type_map[be] == expected_type, dist.Backend.backend_type_map[be]
    if not builtin:
        assert pg.name() in ("custom", be), f"ProcessGroup.name() is {pg.name()!r}"
    t = torch.tensor([1.0], device=ctx.device)
    pg.allreduce([t]).wait()
    assert_equal(t, torch.tensor([float(ctx.world_size)]), "ProcessGroup.allreduce on the device")


_CHECKER_PROBE = r"""
import json, sys
from accelkit.core import check_device_handle, registry

spec = registry.get(sys.argv[1])
spec.setup()
report = check_device_handle(spec.device_type)
print(json.dumps({"errors": len(report.errors), "render": report.render()}))
"""


@check(timeout=120, covers=("torch.<device>.is_available", "torch.<device>.is_initialized",
       "torch.<device>.device_count", "torch.<device>.current_device", "torch.<device>.set_device",
       "torch.<device>.synchronize", "torch.<device>.get_rng_state", "torch.<device>.set_rng_state",
       "torch.<device>.manual_seed", "torch.<device>.manual_seed_all",
       "torch.<device>.initial_seed", "torch.<device>._is_in_bad_fork",
       "torch.<device>.get_amp_supported_dtype", "torch.<device>.Event"))
def device_handle_contract(ctx):
    """accelkit's device-handle checker (accelkit.core.check_device_handle), run by rank 0 in a
    fresh process after the backend's setup() (the checker needs a device nobody has used
    yet), finds no errors in torch.<device>: every member DeviceMesh, DTensor and fork_rng call
    behaves (PR 102468's cuda-like device handle); on cpu torch's own limits are reported as
    unsupported, not errors."""
    if ctx.rank != 0:
        return
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-c", _CHECKER_PROBE, ctx.spec.name], env=env,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, f"the checker process exited {proc.returncode}: {proc.stderr[-2000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0, (
        f"check_device_handle({ctx.device_type!r}) found errors:\n{result['render']}")


@check(requires=("accelerator",), covers=("torch.<device>.device_count",
       "torch.<device>.current_device", "guard.getDevice", "guard.setDevice", "guard.deviceCount",
       "guard.synchronizeDevice", "Runtime::device_count"))
def accelerator_api(ctx):
    """torch.accelerator reports the device: available, current_accelerator() is the device
    type, device_count() matches torch.<device>, the current index is the rank's device, and
    set_device_index / synchronize work (torch.accelerator on the registered device)."""
    acc = torch.accelerator
    assert acc.is_available(), "torch.accelerator.is_available() is False"
    current = acc.current_accelerator()
    assert current is not None and current.type == ctx.device_type, f"current_accelerator() is {current}"
    assert acc.device_count() == _handle(ctx).device_count(), (
        f"torch.accelerator.device_count() {acc.device_count()} != "
        f"torch.{ctx.device_type}.device_count() {_handle(ctx).device_count()}")
    assert acc.current_device_index() == ctx.device.index, (
        f"current_device_index() {acc.current_device_index()}, expected {ctx.device.index}")
    other = (ctx.device.index + 1) % acc.device_count()
    acc.set_device_index(other)
    try:
        assert_value(_handle(ctx).current_device(), other,
                     f"torch.{ctx.device_type}.current_device() after set_device_index({other})")
    finally:
        acc.set_device_index(ctx.device.index)
    torch.ones(4, device=ctx.device).add_(1)
    acc.synchronize()
    assert_value(torch._C._get_accelerator().type, ctx.device_type,
                 "torch._C._get_accelerator().type")


#: random_() with no bounds draws from [0, to], to by dtype (torch.Tensor.random_: 2^digits for
#: floating types, every integer up to it exact; the maximum for integral ones; 1 for bool).
_RANDOM_TO = {torch.bool: 1, torch.uint8: 255, torch.int8: 127, torch.int16: (1 << 15) - 1,
              torch.int32: (1 << 31) - 1, torch.int64: (1 << 63) - 1, torch.float16: 1 << 11,
              torch.bfloat16: 1 << 8, torch.float32: 1 << 24, torch.float64: 1 << 53}


@check
def random_ranges(ctx):
    """The device's integer random ops draw from the ranges torch documents, reaching both
    ends: random_() with no bounds over [0, 2^digits] for floating dtypes and [0, max] for
    integral ones ([0, 1] for bool), whole numbers only; random_(to) over [0, to) and
    random_(from, to) over [from, to), negative from included, every value drawn; torch.randint
    alike (torch.Tensor.random_; aten/src/ATen/native/DistributionTemplates.h, random_impl and
    random_from_to_impl). 16384 draws each: a range's top decile is reached unless the draws
    are wrong. torch.bernoulli of a device tensor of probabilities (``bernoulli_.Tensor``)
    draws 0 where p is 0 and 1 where p is 1, both where p is 1/2; ``bernoulli_(p)`` alike."""
    n = 1 << 14
    probs = torch.tensor([0.0, 1.0, 0.5], device=ctx.device).repeat_interleave(n // 4)
    for what, drawn in (("torch.bernoulli(p)", torch.bernoulli(probs)),
                        ("Tensor.bernoulli_(p)", torch.empty_like(probs).bernoulli_(probs))):
        zeros, ones, half = drawn.cpu().split(n // 4)
        assert drawn.device == probs.device, f"{what} drew on {drawn.device}"
        assert bool((zeros == 0).all()) and bool((ones == 1).all()), (
            f"{what} drew {zeros.unique().tolist()} where p is 0 and {ones.unique().tolist()} "
            "where p is 1")
        assert sorted(half.unique().tolist()) == [0.0, 1.0], (
            f"{what} drew {half.unique().tolist()} where p is 1/2")
    for p in (0.0, 1.0):
        drawn = torch.empty(n // 4, device=ctx.device).bernoulli_(p).cpu()
        assert drawn.unique().tolist() == [p], f"bernoulli_({p}) drew {drawn.unique().tolist()}"
    for dtype, top in _RANDOM_TO.items():
        got = torch.empty(n, dtype=dtype, device=ctx.device).random_().cpu()
        wide = got.to(torch.float64) if dtype.is_floating_point else got.to(torch.int64)
        low, high = wide.min().item(), wide.max().item()
        assert 0 <= low and high <= top, (
            f"random_() on {dtype} drew values in [{low}, {high}], outside [0, {top}]")
        assert high >= top * 0.9, (
            f"random_() on {dtype} drew at most {high} in {n} draws: the range is [0, {top}]")
        if dtype.is_floating_point:
            assert bool((wide == wide.round()).all()), f"random_() on {dtype} drew fractions"
    for dtype in (torch.int32, torch.int64, torch.float32):
        cases = {"random_(10)": (torch.empty(n, dtype=dtype, device=ctx.device).random_(10), 0, 10),
                 "random_(-5, 5)": (torch.empty(n, dtype=dtype, device=ctx.device).random_(-5, 5),
                                    -5, 5),
                 "torch.randint(3, 9)": (torch.randint(3, 9, (n,), dtype=dtype, device=ctx.device),
                                         3, 9)}
        for what, (drawn, low, high) in cases.items():
            values = sorted(int(v) for v in drawn.cpu().unique().tolist())
            assert values == list(range(low, high)), (
                f"{what} on {dtype} drew the values {values}, expected every one of "
                f"{list(range(low, high))}")


@check(requires=("accelerator",), covers=("torch.<device>.manual_seed_all",
       "torch.<device>.initial_seed", "torch.<device>._is_in_bad_fork"))
def manual_seed_reaches_device(ctx):
    """torch.manual_seed(s) seeds the device generator too (initial_seed() is s and the device
    draws repeat after reseeding, differ for another seed), so every rank seeding alike draws
    alike on its device (torch.manual_seed; needs manual_seed_all and _is_in_bad_fork on
    torch.<device>)."""
    handle = _handle(ctx)
    torch.manual_seed(2024)
    assert_value(handle.initial_seed(), 2024, f"torch.{ctx.device_type}.initial_seed()")
    first = torch.rand(16, device=ctx.device).cpu()
    torch.manual_seed(2024)
    assert_equal(torch.rand(16, device=ctx.device), first, "device draw after reseeding")
    torch.manual_seed(2025)
    assert not torch.equal(torch.rand(16, device=ctx.device).cpu(), first), "another seed drew the same values"
    torch.manual_seed(2024)
    draws = all_ranks_object(torch.rand(16, device=ctx.device).cpu())
    for r, d in enumerate(draws):
        assert_equal(d, first, f"rank {r}'s device draw at the same seed")


@check(requires=("accelerator",), covers=("torch.<device>._lazy_init",))
def device_module(ctx):
    """The device is usable through the normal torch surface: torch.<device> is registered,
    tensors move to and from it with their values, and for a PrivateUse1 device the backend is
    renamed to the device and Tensor.is_<device> is generated (torch.utils
    .rename_privateuse1_backend / generate_methods_for_privateuse1_backend, PR 102468)."""
    assert torch.get_device_module(ctx.device_type) is _handle(ctx)
    host = torch.arange(6.0).reshape(2, 3)
    on_device = host.to(ctx.device)
    assert on_device.device == ctx.device and on_device.device.type == ctx.device_type
    assert_equal(on_device.cpu(), host, "round trip through the device")
    if ctx.device_type not in ("cuda", "xpu", "mps", "hpu"):
        name = torch._C._get_privateuse1_backend_name()
        assert name == ctx.device_type, f"PrivateUse1 is named {name!r}, expected {ctx.device_type!r}"
        flag = getattr(on_device, f"is_{ctx.device_type}", None)
        assert flag is True, f"Tensor.is_{ctx.device_type} is {flag!r}"


@check
def module_to_identity(ctx):
    """Moving a module to the device keeps its Parameters (nn.Module._apply swaps the data in
    when torch._has_compatible_shallow_copy_type says the tensors are compatible, as for CUDA;
    a PrivateUse1 device must register that op, c10/core/TensorImpl.h): Parameter identity,
    weight tying (one Parameter, not two with diverging gradients), `p.data = t.to(device)`,
    and an optimizer built before `.to()` still training the model. On cpu the move is a no-op
    and the check passes trivially."""
    assert torch._has_compatible_shallow_copy_type(torch.empty(2), torch.empty(2, device=ctx.device))
    lin = torch.nn.Linear(2, 2)
    weight = lin.weight
    lin.to(ctx.device)
    assert lin.weight is weight, "Linear.to(device) replaced its weight Parameter"
    assert weight.device == ctx.device, f"the weight is on {weight.device}, expected {ctx.device}"
    emb, head = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False)
    head.weight = emb.weight
    tied = torch.nn.Sequential(emb, head).to(ctx.device)
    assert tied[1].weight is tied[0].weight, "tying broken by .to(device): two Parameters"
    assert len(list(tied.parameters())) == 1, "tied model has more than one Parameter"
    p = torch.nn.Parameter(torch.ones(3))
    p.data = p.data.to(ctx.device)
    assert p.device == ctx.device, f"Parameter.data = device tensor left it on {p.device}"
    model, ref = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # built before the move, as users do
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    model.to(ctx.device)
    x = torch.arange(6.0).reshape(2, 3)
    model(x.to(ctx.device)).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    opt.step()
    ref_opt.step()
    assert_equal(model.weight.detach(), ref.weight.detach(),
                 "weight after one SGD step of an optimizer built before .to(device)")


@check(requires=("accelerator",), covers=("Runtime::allocate / release",
       "Runtime::allocate_pinned / release_pinned", "Runtime::copy (host to device, pageable)",
       "Runtime::copy (host to device, pinned)", "Runtime::copy (device to host)",
       "Runtime::copy (device to device, same device)", "Runtime::copy (device to device, peer)"))
def runtime_copies(ctx):
    """Copies host (pageable and pinned) to device, device to host, device to device and to
    another device, at sizes from 1 byte to 16 MiB + 3 with unaligned offsets, arrive byte for
    byte, through torch (``Tensor.copy_``) and through the runtime's own ``Runtime::copy``,
    which the layer never calls where device memory is host memory, so a broken copy of the
    driver shows in every mode (accelkit.core.checker.check_copies; ``accelkit doctor`` runs it
    up to 64 MiB)."""
    from accelkit.core.checker import check_copies

    _, findings = check_copies(ctx.device_type, max_bytes=(16 << 20) + 3)
    assert not findings, "\n".join(f.render() for f in findings)


def _other_device(ctx) -> torch.device:
    """A second device of this rank's process, or SKIP saying there is none."""
    count = _handle(ctx).device_count()
    if count < 2:
        ctx.skip(f"one {ctx.device_type} device in this process: what happens on another device "
                 "needs a second one")
    return torch.device(ctx.device_type, (ctx.device.index + 1) % count)


@check(requires=("accelerator",), covers=(
    "guard.exchangeDevice", "guard.getDevice", "guard.setDevice", "guard.getStream",
    "guard.exchangeStream", "guard.record", "guard.synchronizeEvent", "guard.queryEvent",
    "guard.queryStream", "guard.synchronizeStream", "guard.synchronizeDevice",
    "guard.uncheckedSetDevice", "guard.getNewStream", "Runtime::stream_synchronize"))
def guard_restores_device(ctx):
    """Work on another device of the process leaves the current device, and each device's
    current stream, as it found them: an op and copies both ways between the devices, torch.
    accelerator.device_index(other), a torch.Stream of the other device as a context (and
    torch.accelerator.set_stream making it and its device current), an event recorded, queried
    and synchronized there, and
    synchronize of that stream and device. torch's guards (c10::DeviceGuard, StreamGuard, the
    accelerator's context managers) put back what the device guard's exchangeDevice /
    exchangeStream returned: a guard that returns the device it switched to leaves the caller
    on the other device (CUDA's: c10/cuda/impl/CUDAGuardImpl.h)."""
    acc, here = torch.accelerator, ctx.device
    other = _other_device(ctx)
    acc.set_device_index(here.index)
    home_stream = acc.current_stream(other)

    def unchanged(what: str) -> None:
        got = acc.current_device_index()
        assert got == here.index, (
            f"after {what} on {other} the current device is {got}, expected {here.index}: the "
            "guard kept the device it switched to")

    x = torch.ones(1 << 12, device=other) * 2
    unchanged("an op")
    back = x.to(here)
    unchanged("a copy to this device")
    there = torch.arange(6.0, device=here).to(other)
    unchanged("a copy to the other device")
    with acc.device_index(other.index):
        assert_value(acc.current_device_index(), other.index,
                     f"the current device inside torch.accelerator.device_index({other.index})")
    unchanged("torch.accelerator.device_index")
    side = torch.Stream(device=other)
    with side:
        assert acc.current_stream(other) == side, "inside `with stream:` its stream is not current"
        y = torch.ones(8, device=other) + 1
    unchanged("a torch.Stream context")
    assert acc.current_stream(other) == home_stream, (
        f"after `with stream:` {other}'s current stream is {acc.current_stream(other)}, "
        f"expected {home_stream}")
    acc.set_stream(side)  # makes the stream's device current too (torch.accelerator.set_stream)
    try:
        assert acc.current_stream(other) == side, "set_stream did not make the stream current"
        assert_value(acc.current_device_index(), other.index,
                     "the current device after torch.accelerator.set_stream(a stream of it)")
    finally:
        acc.set_stream(home_stream)
        acc.set_device_index(here.index)
    event = torch.Event(device=other)
    event.record(side)
    event.synchronize()
    assert event.query(), "an event is not complete after Event.synchronize()"
    unchanged("an event recorded and synchronized")
    side.synchronize()
    assert side.query(), "a stream is busy after Stream.synchronize()"
    acc.synchronize(other.index)
    unchanged("Stream.synchronize and torch.accelerator.synchronize")
    assert_equal(back, torch.full((1 << 12,), 2.0), f"a copy from {other}")
    assert_equal(there, torch.arange(6.0), f"a copy to {other}")
    assert_equal(y, torch.full((8,), 2.0), f"an op on a stream of {other}")


@check(requires=("accelerator",), covers=(
    "Runtime::copy (device to device, peer)", "Runtime::copy_async (device to device, peer)",
    "Runtime::copy_async (host to device)", "Runtime::copy_async (device to host)",
    "Runtime::allocate_pinned / release_pinned", "guard.exchangeDevice"))
def device_copies(ctx):
    """Tensors cross between two devices of the process, and to and from pinned host memory,
    in every way torch moves them: .to() and copy_ both ways, non_blocking, contiguous and
    strided, 1 byte to 4 MiB + 3, and on a side stream of the destination that waited for the
    source; every byte arrives once the device is synchronized (a discrete device's peer copies
    are the runtime's: Runtime::copy and copy_async across devices, CUDA's cudaMemcpyPeer; an
    asynchronous device's non_blocking ones are queued: copy_async, cudaMemcpyAsync;
    torch.Tensor.to, torch.Tensor.copy_); afterwards the current device is the one it was."""
    here, other = ctx.device, _other_device(ctx)
    for nbytes in (1, 7, 4096 + 5, (4 << 20) + 3):
        src = torch.arange(nbytes, dtype=torch.uint8)
        mine = src.to(here)
        for non_blocking in (False, True):
            there = mine.to(other, non_blocking=non_blocking)
            home = torch.empty_like(mine)
            home.copy_(there, non_blocking=non_blocking)
            torch.accelerator.synchronize(other.index)
            torch.accelerator.synchronize(here.index)
            assert_equal(there, src, f"{nbytes} bytes to {other} (non_blocking={non_blocking})")
            assert_equal(home, src, f"{nbytes} bytes back from {other}")
        pinned = src.pin_memory()
        up = pinned.to(here, non_blocking=True)
        down = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        down.copy_(up, non_blocking=True)
        torch.accelerator.synchronize(here.index)
        assert_equal(down, src, f"{nbytes} bytes to the device and back, non_blocking, pinned")
    grid = torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48)
    strided = grid.to(here)[::3, 5:41:2]
    assert_equal(strided.to(other), grid[::3, 5:41:2], f"a strided view copied to {other}")
    landing = torch.zeros(48, 64, device=other).t()
    landing.copy_(grid.to(here))
    assert_equal(landing, grid, f"into a transposed tensor of {other}")
    side = torch.Stream(device=other)
    side.wait_stream(torch.accelerator.current_stream(here))
    with side:
        moved = (grid.to(here) * 3).to(other) + 1
    side.synchronize()
    assert_equal(moved, grid * 3 + 1, f"a copy on a side stream of {other}")
    assert_value(torch.accelerator.current_device_index(), here.index,
                 f"the current device after copies to and from {other} (a device guard puts "
                 "back the device it found)")


# Drift checks: behaviours of torch's registration surface that moved, or may move, between
# releases. Each runs where the installed torch has the feature, and says why not elsewhere.

def _probe_creator(dist_backend_opts, backend_options):  # never called: registration only
    raise AssertionError("the probe backend is registered, never used")


@check
def register_backend_devices_list(ctx):
    """Backend.register_backend(name, creator, extended_api=True, devices=[...]) with devices
    as a list, as accelkit.core.register_accelerator passes them: Backend.backend_capability
    [name] is the list (a str was iterated per character up to torch 2.14: torch/distributed/
    distributed_c10d.py, Backend.register_backend), a listed device type nobody claimed maps to
    the new backend in default_device_backend_map, and the device's own backend keeps its
    claim (the first registration for a device wins, torch 2.13 to 2.15). A probe backend is
    registered, examined and removed again."""
    name = f"accelkit_probe_{os.getpid()}"
    unclaimed = f"{name}_device"
    devices = [ctx.device_type, unclaimed]
    dist.Backend.register_backend(name, _probe_creator, extended_api=True, devices=devices)
    try:
        assert_value(dist.Backend.backend_capability.get(name), devices,
                     f"Backend.backend_capability[{name!r}] after devices={devices}")
        assert_value(dist.Backend.default_device_backend_map.get(unclaimed), name,
                     f"default_device_backend_map[{unclaimed!r}], a device type nobody claimed")
        assert_value(dist.Backend.default_device_backend_map.get(ctx.device_type),
                     ctx.spec.collective_backend,
                     f"default_device_backend_map[{ctx.device_type!r}] after another backend "
                     "listed the device")
        assert name in dist.Backend.backend_list, f"{name!r} is not in Backend.backend_list"
    finally:
        dist.Backend.default_device_backend_map.pop(unclaimed, None)
        dist.Backend.backend_capability.pop(name, None)
        if name in dist.Backend.backend_list:
            dist.Backend.backend_list.remove(name)
        dist.Backend._plugins.pop(name.upper(), None)
        delattr(dist.Backend, name.upper())


def _backend_options():
    """c10d's ``Backend.Options`` (torch/csrc/distributed/c10d/Backend.hpp, bound in
    torch/csrc/distributed/c10d/init.cpp)."""
    return torch._C._distributed_c10d.Backend.Options


@check
def backend_options_cache_key(ctx):
    """Where torch.distributed.device_mesh caches process groups by layout and backend options
    (pytorch/pytorch#175571: _DeviceMeshUniverse, keyed by (_MeshLayout, BackendConfig), with
    operator== and std::hash on c10d::Backend::Options), the options of identical groups of the
    backend compare and hash equal, and options that differ do not: otherwise every
    DeviceMesh unflatten creates its groups again. SKIP, naming the PR, on a torch whose
    Backend.Options compare by identity (no such cache there)."""
    options = _backend_options()
    if options.__eq__ is object.__eq__:
        ctx.skip(f"unsupported by torch {torch.__version__.split('+')[0]}: c10d "
                 "Backend.Options compare by identity, so "
                 "DeviceMesh has no process-group cache keyed by them (pytorch/pytorch#175571 "
                 "adds both); nothing to check on this torch")
    first, second = options(ctx.spec.collective_backend), options(ctx.spec.collective_backend)
    assert first == second and hash(first) == hash(second), (
        f"two identical {ctx.spec.collective_backend} Backend.Options differ as cache keys")
    other = options(ctx.spec.collective_backend)
    other._timeout = first._timeout * 2
    assert other != first, "Backend.Options with different timeouts compare equal"


def _torchcomms_reason() -> str | None:
    """Why TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 cannot be exercised here, or None."""
    try:
        import torchcomms  # noqa: F401
    except ImportError as exc:
        return (f"unsupported by torch {torch.__version__.split('+')[0]} here: TorchComms is "
                f"not installed ({exc}), and torch routes TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 "
                "groups through it only when `import torchcomms` works "
                "(distributed_c10d._TORCHCOMM_AVAILABLE)")
    return None


@check
def torchcomms_routing(ctx):
    """With TorchComms enabled (torch.distributed.config.use_torchcomms, set by
    TORCH_DISTRIBUTED_USE_TORCHCOMMS=1), a new group on the backend still runs the device's
    collectives on the backend's own library with right results: torch routes only the
    backends TorchComms can build through it, and a custom c10d backend falls through to its
    creator (torch/distributed/distributed_c10d.py, _torchcomms_handles_backend). SKIP, with
    the reason, where torch or the torchcomms package lacks TorchComms."""
    reason = _torchcomms_reason()
    if reason:
        ctx.skip(reason)
    config = dist.config
    before = config.use_torchcomms
    config.use_torchcomms = True
    try:
        group = dist.new_group(list(range(ctx.world_size)), backend=ctx.spec.process_group_backend)
    finally:
        config.use_torchcomms = before
    backend = group._get_backend(torch.device(ctx.device_type))
    assert_value(backend.name(), ctx.spec.collective_backend,
                 "the device backend of a group made with TorchComms enabled")
    t = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(t, group=group)
    assert_equal(t, torch.full((4,), float(sum(range(1, ctx.world_size + 1)))),
                 "all_reduce on a group made with TorchComms enabled")
