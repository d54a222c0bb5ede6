// accelkit c10d glue: a c10d::Backend that runs every c10d collective on a Transport.
//
// This is the reusable part of a device's collective library: it validates the tensors
// (device, dtype, sizes), stages non-contiguous tensors through dense buffers, builds AVG and
// PREMUL_SUM on SUM, splits coalesced and list variants into transport calls, keeps the
// group's collective sequence number, and runs each group's collectives in issue order on one
// worker thread (point-to-point ops on one thread per peer and direction, so a send and a recv
// between the same two ranks never wait on each other). Every op returns a Work. A coalescing
// group (torch.distributed._coalescing_manager with a device: startCoalescing() to
// endCoalescing()) runs its operations as each is issued and returns one Work for them all;
// the Transport sees its calls one by one.
//
// Teardown: shutdown() (destroy_process_group) finishes the operations issued before it, as
// ProcessGroupNCCL's does; abort(), and the destructor of a group dropped with operations in
// flight, abort the transport first, so every pending Work completes with an error within
// moments, then join the workers: they never wait for a pending collective's timeout.
//
// Streams, on an asynchronous device (Runtime::async), as NCCL does: a collective starts once
// the work queued on the caller's current stream before it is done (an event recorded at issue),
// runs on the group's own threads and stream, and Work::wait() makes the caller's current
// stream wait for it, not the host (a wait queued on the stream). Work::wait() on a Work
// without device outputs (barrier) waits on the host. The future completes on the host.
//
// Nothing here knows a device name: the device type and backend name are bind_collectives()'s
// arguments, the data movement is the Transport's. What a collective library calls is here
// (device_runtime, Connect, bind_collectives); the c10d::Backend itself (TransportBackend, its
// Work and worker threads) is private to the layer (core/csrc/c10d/transport_backend.h).
#pragma once

#include <accelkit/c10d/transport.h>
#include <accelkit/runtime.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace pybind11 {
class module_;
}

namespace accelkit {
class Runtime;
}

namespace accelkit::c10d {

// The device's runtime, as registered by accelkit::register_device in this process (the device
// extension publishes it through the dispatcher; a collective library is another extension), or
// nullptr when no accelkit device is registered.
accelkit::Runtime* device_runtime();

// Connects the ranks of one group through `store` and returns this rank's transport; called
// by every rank of a new group (creation, and split() for sub-groups).
using Connect = std::function<std::unique_ptr<Transport>(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout)>;

// The Python side of a collective library (call it in the extension's PYBIND11_MODULE):
// `Backend(store, rank, size, timeout_ms, device)`, a TransportBackend named `name` whose
// ranks connect through `connect`, and `Options` (deep-copyable backend options, which
// torch.distributed.split_group copies).
void bind_collectives(pybind11::module_& m, const std::string& name, Connect connect);

}  // namespace accelkit::c10d
