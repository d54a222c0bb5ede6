"""What the catalogue covers: every member of the device-handle contract
(:mod:`accelkit.core.handle`), every parameter of the c10d operations accelkit's backends
implement, and every method of the C++ seams a backend implements (the device guard, the
runtime, the collective transport from each c10d entry point), each with the checks that fail
when a backend gets it wrong.

A check declares what it covers with ``@check(covers=(...))``, naming items of
:data:`CONTRACT`. ``docs/coverage.md`` is :func:`table` of the whole catalogue, written by
``python -m accelkit.conformance.reports.coverage docs/coverage.md``; ``tests/catalogue/test_coverage.py`` fails
when an item has no check or the file is out of date.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from accelkit.core.handle import DeviceHandle, StreamDeviceHandle, members

if TYPE_CHECKING:
    from accelkit.conformance.api import CheckDef

#: The device-handle contract: ``torch.<device>.<member>`` -> its torch caller (core/handle.py).
HANDLE: dict[str, str] = {f"torch.<device>.{name}": caller for protocol in
                          (DeviceHandle, StreamDeviceHandle)
                          for name, caller in members(protocol).items()}

#: Parameters of the c10d operations a backend implements (torch.distributed's API), as
#: ``op(parameter)`` -> what a backend that ignores it gets wrong.
C10D: dict[str, str] = {
    "all_reduce(op=SUM)": "sums",
    "all_reduce(op=PRODUCT)": "multiplies",
    "all_reduce(op=MIN)": "takes the minimum",
    "all_reduce(op=MAX)": "takes the maximum",
    "all_reduce(op=AVG)": "averages (a sum divided by the group size)",
    "all_reduce(op=BAND/BOR/BXOR)": "combines integers bitwise",
    "reduce_scatter_single(op=PREMUL_SUM)": "scales each contribution by the factor before "
                                            "summing (FSDP2's gradient divide factor)",
    "broadcast(src)": "sends the source rank's tensor",
    "broadcast(group_src)": "takes the source as a rank of the group, not of the world",
    "reduce(dst)": "leaves the result on the destination",
    "reduce(group_dst)": "takes the destination as a rank of the group",
    "gather(dst)": "collects on the destination",
    "gather(group_dst)": "takes the destination as a rank of the group",
    "scatter(src)": "distributes the source's list",
    "scatter(group_src)": "takes the source as a rank of the group",
    "send(dst)/recv(src)": "delivers to and takes from the named peer",
    "send(group_dst)/recv(group_src)": "take the peer as a rank of the group",
    "send/recv(tag)": "matches a send with the recv of its tag, not the next one posted",
    "isend/irecv(tag)": "matches non-blocking messages by tag",
    "send/recv(tag) order": "keeps messages of one tag in the order they were sent",
    "batch_isend_irecv(P2POp.tag)": "matches by tag inside one batch",
    "recv(src=None, tag)": "receives from any source only a message with the tag",
    "async_op=True": "returns a Work whose wait() orders the result before later work",
    "new_group(timeout)": "raises once the group's timeout passes instead of waiting forever",
}

#: The device guard (c10::impl::DeviceGuardImplInterface, accelkit's core/csrc/runtime/guard.cpp; a
#: vendor's own where it brings one): method -> what in torch reaches it.
GUARD: dict[str, str] = {
    "guard.exchangeDevice": "every device guard of torch's kernels and context managers "
                            "(c10::DeviceGuard, torch.accelerator.device_index): the device it "
                            "returns is the one put back",
    "guard.getDevice": "torch.accelerator.current_device_index, the guards",
    "guard.setDevice": "torch.accelerator.set_device_index, torch.<device>.set_device",
    "guard.uncheckedSetDevice": "a guard's destructor restoring the device",
    "guard.getStream": "torch.accelerator.current_stream, StreamGuard",
    "guard.exchangeStream": "a torch.Stream as a context, torch.accelerator.set_stream",
    "guard.getNewStream": "torch.Stream(device=...), torch.<device>.Stream",
    "guard.record": "Event.record(stream)",
    "guard.block": "Stream.wait_event, Stream.wait_stream",
    "guard.queryEvent": "Event.query",
    "guard.synchronizeEvent": "Event.synchronize",
    "guard.elapsedTime": "Event.elapsed_time",
    "guard.queryStream": "Stream.query",
    "guard.synchronizeStream": "Stream.synchronize",
    "guard.synchronizeDevice": "torch.accelerator.synchronize, torch.<device>.synchronize",
    "guard.deviceCount": "torch.accelerator.device_count",
}

#: The runtime (accelkit::Runtime, core/include/accelkit/runtime.h: the driver seam), function
#: and direction -> where the layer calls it (the modes named: where device memory is host
#: memory the layer copies without it; registration.runtime_copies calls the copies directly
#: in every mode).
RUNTIME: dict[str, str] = {
    "Runtime::device_count": "torch.<device>.device_count, every device index check",
    "Runtime::allocate / release": "the caching allocator: every tensor on the device",
    "Runtime::capacity": "out-of-memory errors, torch.<device>.mem_get_info",
    "Runtime::allocate_pinned / release_pinned": "Tensor.pin_memory(), pin_memory=True",
    "Runtime::copy (host to device, pageable)": "Tensor.to(device), copy_ (discrete modes)",
    "Runtime::copy (host to device, pinned)": "copies from pinned memory (discrete modes)",
    "Runtime::copy (device to host)": "Tensor.cpu(), item(), copy_ (discrete modes)",
    "Runtime::copy (device to device, same device)": "clone(), copy_ on one device (discrete "
                                                     "modes)",
    "Runtime::copy (device to device, peer)": "Tensor.to(another device) (discrete modes)",
    "Runtime::copy_async (host to device)": "non_blocking copies to the device (asynchronous "
                                            "modes)",
    "Runtime::copy_async (device to host)": "non_blocking copies to pinned memory "
                                            "(asynchronous modes)",
    "Runtime::copy_async (device to device, peer)": "non_blocking copies between devices "
                                                    "(asynchronous modes)",
    "Runtime::synchronize": "torch.<device>.synchronize, torch.accelerator.synchronize",
    "Runtime::launch": "every op, event record and collective on a stream (asynchronous modes)",
    "Runtime::stream_wait": "Work.wait on a stream, the default events' waits (asynchronous "
                            "modes)",
    "Runtime::stream_synchronize": "Stream.synchronize, copies to pageable host memory",
    "Runtime::stream_query": "Stream.query",
    "Runtime::stream_priority_range": "torch.<device>.Stream.priority_range, the priorities of "
                                      "the layer's stream pool",
    "Runtime::stream_create": "the layer's stream pool: torch.<device>.Stream(priority=...), "
                              "torch.Stream(device=...)",
    "Runtime::event_create": "torch.Event / torch.<device>.Event at their first record",
    "Runtime::event_record": "Event.record(stream), the allocator's frees on other streams",
    "Runtime::stream_wait_event": "Stream.wait_event / wait_stream",
    "Runtime::event_query": "Event.query",
    "Runtime::event_synchronize": "Event.synchronize",
    "Runtime::event_elapsed_ms": "Event.elapsed_time",
}

#: The collective transport (accelkit::c10d::Transport, core/include/accelkit/c10d/
#: transport.h: the collective library's seam), function <- the c10d entry point that reaches
#: it -> what the glue hands it.
TRANSPORT: dict[str, str] = {
    "Transport::barrier <- barrier(device_ids)": "a barrier on the device (the CPU's library "
                                                 "takes barrier() without device_ids)",
    "Transport::barrier <- barrier of a bound group": "a barrier on the device of a group "
                                                      "bound with device_id",
    "Transport::broadcast <- broadcast": "the buffer and the root",
    "Transport::allreduce <- all_reduce": "one buffer per call",
    "Transport::allreduce <- allreduce_coalesced": "several buffers in one coalesced call "
                                                  "(_coalescing_manager)",
    "Transport::reduce <- reduce": "the buffer and the root",
    "Transport::allgather <- all_gather": "a list of outputs, packed",
    "Transport::allgather <- all_gather_single": "one flat output (_allgather_base)",
    "Transport::allgather <- allgather_into_tensor_coalesced": "several flat outputs, coalesced",
    "Transport::allgather <- all_gather_coalesced": "an output list per rank, a tensor per "
                                                    "input, coalesced (the legacy call)",
    "Transport::gather <- gather": "the root's list of outputs",
    "Transport::scatter <- scatter": "the root's list of inputs, packed",
    "Transport::reduce_scatter <- reduce_scatter": "a list of inputs, packed",
    "Transport::reduce_scatter <- reduce_scatter_single": "one flat input "
                                                          "(_reduce_scatter_base)",
    "Transport::reduce_scatter <- reduce_scatter_tensor_coalesced": "several flat inputs, "
                                                                    "coalesced",
    "Transport::alltoall <- all_to_all_single (equal splits)": "counts and offsets, equal",
    "Transport::alltoall <- all_to_all_single (uneven splits)": "counts and offsets per peer, "
                                                                "zero-size ones included",
    "Transport::alltoall <- all_to_all": "lists of tensors, packed",
    "Transport::send / recv <- send, recv, isend, irecv, batch_isend_irecv": "a peer and a tag",
    "Transport::recv_any <- recv(src=None)": "a tag; the peer comes back",
    "Transport::abort <- a collective past its timeout": "the group's failure, everywhere",
    "Transport::shutdown <- destroy_process_group right after a collective": "the group's "
                                                        "release once its last call finished",
}

#: Each collective of c10d::Backend that accelkit's glue implements (TransportBackend,
#: core/csrc/c10d/transport_backend.h) -> the rows of :data:`TRANSPORT` it reaches: every
#: entry point of c10d into the transport is a row (tests/catalogue/test_coverage.py reads the header).
ENTRY_POINTS: dict[str, tuple[str, ...]] = {
    "barrier": ("Transport::barrier <- barrier(device_ids)",
                "Transport::barrier <- barrier of a bound group"),
    "broadcast": ("Transport::broadcast <- broadcast",),
    "allreduce": ("Transport::allreduce <- all_reduce",),
    "allreduce_coalesced": ("Transport::allreduce <- allreduce_coalesced",),
    "reduce": ("Transport::reduce <- reduce",),
    "allgather": ("Transport::allgather <- all_gather",),
    "_allgather_base": ("Transport::allgather <- all_gather_single",),
    "allgather_coalesced": ("Transport::allgather <- all_gather_coalesced",),
    "allgather_into_tensor_coalesced": ("Transport::allgather <- allgather_into_tensor_coalesced",),
    "gather": ("Transport::gather <- gather",),
    "scatter": ("Transport::scatter <- scatter",),
    "reduce_scatter": ("Transport::reduce_scatter <- reduce_scatter",),
    "_reduce_scatter_base": ("Transport::reduce_scatter <- reduce_scatter_single",),
    "reduce_scatter_tensor_coalesced": (
        "Transport::reduce_scatter <- reduce_scatter_tensor_coalesced",),
    "alltoall_base": ("Transport::alltoall <- all_to_all_single (equal splits)",
                      "Transport::alltoall <- all_to_all_single (uneven splits)"),
    "alltoall": ("Transport::alltoall <- all_to_all",),
    "send": ("Transport::send / recv <- send, recv, isend, irecv, batch_isend_irecv",),
    "recv": ("Transport::send / recv <- send, recv, isend, irecv, batch_isend_irecv",),
    "recvAnysource": ("Transport::recv_any <- recv(src=None)",),
    # a coalescing group's one Work: its operations, issued between startCoalescing() and it,
    # reach their own rows (collectives.capability_levels runs a group)
    "endCoalescing": (),
}

#: The seams' methods no check can observe, each with why; every other method of the seams'
#: headers is a row above (tests/catalogue/test_coverage.py reads the headers).
UNOBSERVED: dict[str, str] = {
    "guard.type": "a constant: the device type the guard is registered for",
    "guard.destroyEvent": "frees an event torch no longer holds",
    "guard.getDefaultStream": "torch reaches it through CUDA's own stream code only; the "
                              "default stream a check sees comes from getStream",
    "guard.getStreamFromGlobalPool": "torch's stream pool API is CUDA's (at::cuda::"
                                     "getStreamFromPool); a PrivateUse1 device's new streams "
                                     "come from getNewStream",
    "Runtime::set_device": "the layer keeps the current device itself; what the driver does "
                           "with it is the driver's (a host-memory runtime has nothing to switch)",
    "Runtime::async": "the device's mode: which paths the layer takes (the modes' runs), not a "
                      "behaviour of its own",
    "Runtime::host_accessible": "the device's mode, as async",
    "Runtime::capacity_hint": "text added to out-of-memory messages",
    "Runtime::stream_destroy": "the layer never destroys its pool's streams (as CUDA's); a "
                               "stream given to ExternalStream is its creator's to destroy",
    "Runtime::event_destroy": "frees an event torch no longer holds",
    "Runtime::device_count_hint": "text added to invalid-device messages",
    "Transport::rank": "the group's coordinates, read by the glue when the group is made",
    "Transport::size": "as rank",
}

#: The seams' items, in the order of their tables.
SEAMS: dict[str, str] = {**GUARD, **RUNTIME, **TRANSPORT}

#: Every item a check can cover: the handle's members, the c10d parameters, the seams.
CONTRACT: dict[str, str] = {**HANDLE, **C10D, **SEAMS}


def covering(checks: Iterable[CheckDef]) -> dict[str, list[str]]:
    """Contract item -> ids of the checks declaring they cover it (sorted); every item listed."""
    out: dict[str, list[str]] = {item: [] for item in CONTRACT}
    for c in checks:
        for item in c.covers:
            out[item].append(c.id)
    return {item: sorted(ids) for item, ids in out.items()}


def table(checks: Iterable[CheckDef]) -> str:
    """docs/coverage.md: the contract items and the checks covering each, as Markdown."""
    cover = covering(checks)
    lines = [
        "# What the conformance checks cover",
        "",
        "Each member of the device-handle contract, each parameter of the c10d operations a",
        "backend implements and each method of the C++ seams it implements (the device guard,",
        "the runtime, the collective transport, each reached from every entry point that can",
        "reach it), with the checks that fail when a backend gets it wrong. Generated by",
        "`python -m accelkit.conformance.reports.coverage docs/coverage.md` from the checks'",
        "`@check(covers=...)` declarations (`conformance/reports/coverage.py`); `tests/catalogue/test_coverage.py`",
        "fails when an item has no check or this file is out of date.",
        "",
        "## The device handle (`torch.<device>`, `accelkit.core.handle`)",
        "",
        "| Member | Called by | Checks |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{item.rsplit('.', 1)[1]}` | {HANDLE[item]} | "
              f"{', '.join(f'`{c}`' for c in cover[item])} |" for item in HANDLE]
    lines += ["", "## c10d operations and their parameters", "",
              "| Parameter | A backend honouring it | Checks |", "| --- | --- | --- |"]
    lines += [f"| `{item}` | {C10D[item]} | {', '.join(f'`{c}`' for c in cover[item])} |"
              for item in C10D]
    for title, seam, head in (
            ("The device guard (`c10::impl::DeviceGuardImplInterface`, `core/csrc/runtime/guard.cpp`)",
             GUARD, "| Method | Reached from | Checks |"),
            ("The runtime (`accelkit::Runtime`, `core/include/accelkit/runtime.h`)", RUNTIME,
             "| Function | Where the layer calls it | Checks |"),
            ("The collective transport (`accelkit::c10d::Transport`, "
             "`core/include/accelkit/c10d/transport.h`)", TRANSPORT,
             "| Function <- c10d entry point | What it is handed | Checks |")):
        lines += ["", f"## {title}", "", head, "| --- | --- | --- |"]
        lines += [f"| `{item}` | {seam[item]} | {', '.join(f'`{c}`' for c in cover[item])} |"
                  for item in seam]
    lines += ["", "Methods of the seams no check can observe:", ""]
    lines += [f"- `{item}`: {why}." for item, why in UNOBSERVED.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Write :func:`table` of the built-in catalogue to ``argv[0]``."""
    from accelkit.conformance.engine import loader

    checks = [c for c in loader.load([]).values()
              if c.module.startswith("accelkit.conformance.checks.")]
    Path(argv[0]).write_text(table(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
