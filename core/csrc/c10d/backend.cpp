// The c10d glue (<accelkit/c10d/backend.h>): TransportBackend's lifecycle (creation, split,
// shutdown, abort) and the queueing of its operations on ordered workers, in stream order on an
// asynchronous device. The operations themselves are in operations.cpp, the Work in work.cpp.
#include "c10d/without_gil.h"  // first: it includes Python.h

#include "c10d/transport_backend.h"  // and <accelkit/c10d/backend.h>
#include <accelkit/runtime.h>

#include "c10d/device_streams.h"
#include "testing/faults.h"
#include "testing/faulty_transport.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

namespace accelkit::c10d {

using detail::async_device;
using detail::current_stream_of;
using detail::driver_stream_of;

accelkit::Runtime* device_runtime() {
  static std::atomic<accelkit::Runtime*> cached{nullptr};
  accelkit::Runtime* rt = cached.load();
  if (rt != nullptr) return rt;
  const auto op = c10::Dispatcher::singleton().findSchema({"accelkit::_runtime", ""});
  if (!op.has_value()) return nullptr;
  rt = reinterpret_cast<accelkit::Runtime*>(op->typed<int64_t()>().call());
  cached = rt;
  return rt;
}

namespace detail {

accelkit::DriverStream driver_stream_of(const c10::Stream& stream) {
  static const auto op = [] {
    const auto handle =
        c10::Dispatcher::singleton().findSchemaOrThrow("accelkit::_driver_stream", "");
    return handle.typed<int64_t(int64_t, int64_t)>();
  }();
  return reinterpret_cast<accelkit::DriverStream>(op.call(stream.device_index(), stream.id()));
}

}  // namespace detail

// -- TransportBackend: lifecycle ----------------------------------------------------------------

TransportBackend::TransportBackend(Connect connect, const c10::intrusive_ptr<::c10d::Store>& store,
                                   int rank, int size, std::chrono::milliseconds timeout,
                                   c10::DeviceType device_type, std::string name)
    : ::c10d::Backend(rank, size),
      connect_(std::move(connect)),
      transport_(connect_(store, rank, size, timeout)),
      timeout_(timeout),
      device_type_(device_type),
      name_(std::move(name)) {
#ifdef ACCELKIT_FAULTS
  transport_ = with_faults(std::move(transport_));
#endif
  init();
}

// Dropped without shutdown() (NCCL's destructor aborts its communicators likewise): nothing
// will wait for the work still in flight, so it is aborted rather than waited for.
TransportBackend::~TransportBackend() {
  close(Ending::kAbortInFlight, "the process group was destroyed");
}

c10::intrusive_ptr<::c10d::Backend::Options> TransportBackend::getBackendOptions() {
  return c10::make_intrusive<Options>(name_, timeout_);
}

c10::intrusive_ptr<::c10d::Backend> TransportBackend::split(
    const c10::intrusive_ptr<::c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
#ifdef ACCELKIT_FAULTS
  if (faults::active("split_shares_parent")) {
    return c10::intrusive_ptr<::c10d::Backend>::reclaim_copy(this);
  }
#endif
  const auto timeout = opts ? opts->timeout : timeout_;
  return c10::make_intrusive<TransportBackend>(connect_, store,
                                               static_cast<int>(me - ranks.begin()),
                                               static_cast<int>(ranks.size()), timeout,
                                               device_type_, name_);
}

void TransportBackend::shutdown() { close(Ending::kFinish, "the process group was shut down"); }

void TransportBackend::abort() { close(Ending::kAbort, "the process group was aborted"); }

// Order matters: (1) mark closed, so new calls raise; (2) when aborting, abort the transport,
// so operations blocked in it (waiting for peers) raise now instead of at their timeout;
// (3) stop the workers, which runs what is queued (finishing it, or, aborted, each raising at
// once and completing its Work with the error) and joins them; (4) release the transport.
// shutdown() finishes what was issued: on an asynchronous device a collective issued just
// before destroy_process_group may not have run yet, and its peers need this rank's part
// (ProcessGroupNCCL::shutdown flushes its collectives before destroying its communicators).
void TransportBackend::close(Ending ending, const char* why) {
  // The workers may need the GIL to finish (a Work's Python callback); the destructor runs
  // wherever Python drops the group, with the GIL held.
  detail::WithoutGil no_gil;
  std::vector<OrderedWorker*> workers;
  {
    std::lock_guard<std::mutex> lock(lifecycle_mutex_);
    if (closed_.exchange(true)) return;
    workers.push_back(&collectives_);
    for (auto& entry : p2p_) workers.push_back(entry.second.get());
  }
  const int64_t in_flight = pending_;
  if (ending == Ending::kAbort || (ending == Ending::kAbortInFlight && in_flight > 0)) {
    aborted_ = true;
    transport_->abort(std::string(why) + " on rank " + std::to_string(rank_) + " with " +
                      std::to_string(in_flight) + " operation(s) in flight");
  }
  for (OrderedWorker* worker : workers) worker->stop();
  OrderedWorker* callbacks = nullptr;
  {
    std::lock_guard<std::mutex> lock(lifecycle_mutex_);
    callbacks = callbacks_.get();
  }
  if (callbacks != nullptr) callbacks->stop();  // after the workers, which may still queue
  transport_->shutdown();
}

OrderedWorker& TransportBackend::callback_worker() {
  std::lock_guard<std::mutex> lock(lifecycle_mutex_);
  if (!callbacks_) callbacks_ = std::make_unique<OrderedWorker>();
  return *callbacks_;
}

void TransportBackend::check_open(const char* name) const {
  TORCH_CHECK(!closed_, name_, ": ", name, " on a process group that was shut down");
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::barrier(const ::c10d::BarrierOptions& opts) {
  CallInfo call = collective(Kind::kBarrier, "barrier", opts.timeout);
  return enqueue(::c10d::OpType::BARRIER, call, {}, [this](const CallInfo& call, QueuedWork&) {
    transport_->barrier(call);
  });
}

// -- TransportBackend: queueing -----------------------------------------------------------------

TransportBackend::Staged::Staged(const at::Tensor& t, bool copy_in)
    : user(t),
      dense(t.is_contiguous() ? t
            : copy_in         ? t.contiguous()
                              : at::empty(t.sizes(), t.options())) {}

void TransportBackend::Staged::copy_out() const {
  if (!dense.is_same(user)) user.copy_(dense);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::enqueue(::c10d::OpType type,
                                                           const CallInfo& call,
                                                           std::vector<at::Tensor> outputs,
                                                           Run run) {
  std::vector<Job> jobs;
  jobs.push_back({call, std::move(run)});
  return enqueue_all(type, std::move(jobs), std::move(outputs));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::enqueue_all(::c10d::OpType type,
                                                               std::vector<Job> jobs,
                                                               std::vector<at::Tensor> outputs) {
  const uint64_t seq = ++seq_;
  for (auto& job : jobs) job.call.seq = seq;
  CallInfo first = jobs.front().call;
  return enqueue_on(collectives_, type, first, std::move(outputs),
                    [jobs](const CallInfo&, QueuedWork& work) {
                      for (const auto& job : jobs) job.run(job.call, work);
                    });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::enqueue_on(OrderedWorker& worker,
                                                              ::c10d::OpType type,
                                                              const CallInfo& call,
                                                              std::vector<at::Tensor> outputs,
                                                              Run run) {
  // The device of the call's buffers (inputs included: a non-root gather has no outputs).
  std::optional<c10::Device> device;
  if (call.device >= 0) {
    device = c10::Device(device_type_, static_cast<c10::DeviceIndex>(call.device));
  } else if (!outputs.empty()) {
    device = outputs.front().device();
  }
  auto work = c10::make_intrusive<QueuedWork>(rank_, type, call.name.c_str(), call.seq, outputs,
                                              device);
  // Asynchronous device: the collective starts once the caller's queued work is done.
  std::shared_ptr<c10::Event> ready;
  if (async_device(device)) {
    ready = std::make_shared<c10::Event>(device->type());
    ready->record(current_stream_of(*device));
  }
#ifdef ACCELKIT_FAULTS
  // collective_skips_producers: an event never recorded, which a wait passes at once.
  if (ready && faults::active("collective_skips_producers")) {
    ready = std::make_shared<c10::Event>(device->type());
  }
  // The worker runs the call with the fault of its issue.
  run = [run = std::move(run), fault = faults::current()](const CallInfo& c, QueuedWork& w) {
    faults::Scope scope(fault);
    run(c, w);
  };
#endif
  ++pending_;
  try {
    worker.submit([this, &worker, work, call, run = std::move(run), device, ready]() {
      std::exception_ptr error;
      try {
        c10::OptionalDeviceGuard guard(device);
        if (ready) {
          wait_for_producers(*ready, call);
          // The glue's own device work (staging copies, AVG's division) goes on the worker's
          // stream, which is drained before the Work completes.
          const c10::Stream own = worker.stream(*device);
          c10::StreamGuard on_own(own);
          run(call, *work);
          device_runtime()->stream_synchronize(device->index(), driver_stream_of(own));
        } else {
          run(call, *work);
        }
      } catch (...) {
        error = std::current_exception();
      }
      --pending_;
      if (ready) {
        // Asynchronous device: streams and the host may go on at once, but the future's
        // callbacks run on a thread of their own. They may launch device work (DDP's
        // fp16_compress_hook copies the reduced bucket back) that queues behind a stream's wait
        // for a later collective of this group, which this worker must be free to run.
        work->complete(error);
        callback_worker().submit([work, error] { work->complete_future(error); });
      } else {
        // Synchronous device: the future first, so it is done whenever wait() returned (as
        // ProcessGroupGloo does).
        work->complete_future(error);
        work->complete(error);
      }
    });
  } catch (...) {
    --pending_;
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(coalescing_mutex_);
    if (coalescing_) coalesced_.push_back(work);
  }
  return work;
}

void TransportBackend::startCoalescing() {
  check_open("startCoalescing");
  std::lock_guard<std::mutex> lock(coalescing_mutex_);
  TORCH_CHECK(!coalescing_, name_, ": startCoalescing() called again before endCoalescing(): "
              "coalescing groups do not nest (one _coalescing_manager at a time per group)");
  coalescing_ = true;
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::endCoalescing() {
  std::vector<c10::intrusive_ptr<::c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(coalescing_mutex_);
    TORCH_CHECK(coalescing_, name_, ": endCoalescing() without startCoalescing()");
    coalescing_ = false;
    works.swap(coalesced_);
  }
  return c10::make_intrusive<CoalescedWork>(rank_, std::move(works));
}

void TransportBackend::wait_for_producers(const c10::Event& ready, const CallInfo& call) const {
  // Polled, with a pause growing to 1 ms: an event has no wait that another thread can
  // interrupt (Event.synchronize() would block until the stream got there, however long).
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  while (!ready.query()) {
    if (aborted_) {
      C10_THROW_ERROR(DistBackendError,
                      name_ + ": " + call.name + " (collective #" + std::to_string(call.seq) +
                          ") was waiting for the queued work that produces its inputs when the "
                          "process group was aborted on rank " +
                          std::to_string(rank_) + " with it in flight");
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (call.timeout.count() > 0 && waited > call.timeout) {
      C10_THROW_ERROR(DistBackendError,
                      name_ + ": " + call.name + " (collective #" + std::to_string(call.seq) +
                          ") timed out after " + std::to_string(call.timeout.count()) +
                          " ms on rank " + std::to_string(rank_) + " waiting for the queued "
                          "work that produces its inputs (a stream that never gets there: a "
                          "wait on an event or collective that cannot complete)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

OrderedWorker& TransportBackend::p2p_worker(int peer, bool sending) {
  std::lock_guard<std::mutex> lock(lifecycle_mutex_);
  check_open(sending ? "send" : "recv");
  auto& slot = p2p_[{peer, sending}];
  if (!slot) slot = std::make_unique<OrderedWorker>();
  return *slot;
}

}  // namespace accelkit::c10d
