// The c10d glue (<accelkit/c10d/backend.h>): TransportBackend, its Work and its workers.
#include <accelkit/c10d/backend.h>
#include <accelkit/runtime.h>

#include "../faults.h"
#include "faulty_transport.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <optional>

namespace accelkit::c10d {

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

namespace {

bool async_device(const std::optional<c10::Device>& device) {
  accelkit::Runtime* rt = device_runtime();
  return device.has_value() && device->type() == c10::DeviceType::PrivateUse1 && rt != nullptr &&
         rt->async();
}

c10::Stream current_stream_of(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

}  // namespace

// -- QueuedWork ---------------------------------------------------------------------------------

QueuedWork::QueuedWork(int rank, ::c10d::OpType type, const char* name, uint64_t seq,
                       std::vector<at::Tensor> outputs, std::optional<c10::Device> device)
    : ::c10d::Work(rank, type, nullptr),
      name_(name),
      seq_(seq),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))),
      device_(device) {}

bool QueuedWork::wait(std::chrono::milliseconds timeout) {
  if (!async_device(device_)) return ::c10d::Work::wait(timeout);
#ifdef ACCELKIT_FAULTS
  if (faults::active("work_wait_unordered")) return true;
#endif
  const c10::Stream stream = current_stream_of(*device_);
  const std::string what = "waiting for " + name_;
  device_runtime()->launch(device_->index(), stream.id(), what.c_str(),
                           [completion = completion_] {
                             std::unique_lock<std::mutex> lock(completion->mutex);
                             completion->cv.wait(lock, [&] { return completion->done; });
                             if (completion->error) std::rethrow_exception(completion->error);
                           });
  return true;
}

int QueuedWork::sourceRank() const {
  // The peer is host state, known once the recv ran: on an asynchronous device wait() only
  // ordered the caller's stream, so block here until the operation finished, as
  // dist.recv(src=None) needs the rank it returns.
  {
    std::unique_lock<std::mutex> lock(completion_->mutex);
    completion_->cv.wait(lock, [&] { return completion_->done; });
    if (completion_->error) std::rethrow_exception(completion_->error);
  }
  TORCH_CHECK(source_rank_ >= 0,
              "sourceRank() is only defined for a completed recv from any source");
  return source_rank_;
}

void QueuedWork::complete(std::exception_ptr error) {
  finish(error);  // first: is_completed() holds once a stream's wait for it has passed
  {
    std::lock_guard<std::mutex> lock(completion_->mutex);
    completion_->done = true;
    completion_->error = error;
  }
  completion_->cv.notify_all();
}

void QueuedWork::complete_future(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

// -- OrderedWorker ------------------------------------------------------------------------------

OrderedWorker::OrderedWorker() : thread_([this] { loop(); }) {}

OrderedWorker::~OrderedWorker() { stop(); }

void OrderedWorker::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "the process group was shut down; create a new one");
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void OrderedWorker::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

c10::Stream OrderedWorker::stream(c10::Device device) {
  auto it = streams_.find(device.index());
  if (it == streams_.end()) {
    it = streams_.emplace(device.index(),
                          c10::impl::getDeviceGuardImpl(device.type())->getNewStream(device))
             .first;
  }
  return it->second;
}

void OrderedWorker::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

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

TransportBackend::~TransportBackend() { close(false, "the process group was destroyed"); }

c10::intrusive_ptr<::c10d::Backend::Options> TransportBackend::getBackendOptions() {
  return c10::make_intrusive<Options>(name_, timeout_);
}

c10::intrusive_ptr<::c10d::Backend> TransportBackend::split(
    const c10::intrusive_ptr<::c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  const auto timeout = opts ? opts->timeout : timeout_;
  return c10::make_intrusive<TransportBackend>(connect_, store,
                                               static_cast<int>(me - ranks.begin()),
                                               static_cast<int>(ranks.size()), timeout,
                                               device_type_, name_);
}

void TransportBackend::shutdown() { close(false, "the process group was shut down"); }

void TransportBackend::abort() { close(true, "the process group was aborted"); }

// Order matters: (1) mark closed, so new calls raise; (2) abort the transport, so operations
// blocked in it (waiting for peers) raise now instead of at their timeout; (3) stop the
// workers, which runs what is queued (each raises at once on the aborted transport and
// completes its Work with the error) and joins them; (4) release the transport.
void TransportBackend::close(bool force, const char* why) {
  std::vector<OrderedWorker*> workers;
  {
    std::lock_guard<std::mutex> lock(lifecycle_mutex_);
    if (closed_.exchange(true)) return;
    workers.push_back(&collectives_);
    for (auto& entry : p2p_) workers.push_back(entry.second.get());
  }
  const int64_t in_flight = pending_;
  if (force || in_flight > 0) {
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

// -- TransportBackend: operations ---------------------------------------------------------------

c10::intrusive_ptr<::c10d::Work> TransportBackend::broadcast(std::vector<at::Tensor>& tensors,
                                           const ::c10d::BroadcastOptions& opts) {
  const at::Tensor& t = single(tensors, "broadcast");
  check_root(opts.rootRank, "broadcast");
  CallInfo call = collective(Kind::kBroadcast, "broadcast", opts.timeout, t);
  call.root = static_cast<int>(opts.rootRank);
  Staged buf(t, /*copy_in=*/true);
  return enqueue(::c10d::OpType::BROADCAST, call, tensors, [this, buf](const CallInfo& call, QueuedWork&) {
    transport_->broadcast(call, buf.dense.data_ptr());
    buf.copy_out();
  });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allreduce(std::vector<at::Tensor>& tensors,
                                           const ::c10d::AllreduceOptions& opts) {
  const at::Tensor& t = single(tensors, "allreduce");
  TORCH_CHECK(!opts.sparseIndices.has_value() && t.layout() == at::kStrided,
              name_, ": allreduce supports dense (strided) tensors only, got ", t.layout());
  auto job = reduction(t, t, opts.reduceOp, Kind::kAllreduce, "allreduce", opts.timeout, -1);
  return enqueue(::c10d::OpType::ALLREDUCE, job.call, tensors, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), name_, ": allreduce_coalesced needs at least one tensor");
  std::vector<Job> jobs;
  for (const auto& t : tensors) {
    check_tensor(t, "allreduce_coalesced");
    jobs.push_back(reduction(t, t, opts.reduceOp, Kind::kAllreduce, "allreduce_coalesced",
                             opts.timeout, -1));
  }
  return enqueue_all(::c10d::OpType::ALLREDUCE_COALESCED, std::move(jobs), tensors);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::reduce(std::vector<at::Tensor>& tensors,
                                        const ::c10d::ReduceOptions& opts) {
  const at::Tensor& t = single(tensors, "reduce");
  check_root(opts.rootRank, "reduce");
  auto job = reduction(t, t, opts.reduceOp, Kind::kReduce, "reduce", opts.timeout,
                       static_cast<int>(opts.rootRank));
  return enqueue(::c10d::OpType::REDUCE, job.call, tensors, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const ::c10d::AllgatherOptions& opts) {
  const at::Tensor& in = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, name_, ": allgather takes one output list per process, got ",
              outputs.size());
  check_list(outputs[0], in, size_, "allgather", "output");
  auto job = gather_job(outputs[0], in, Kind::kAllgather, "allgather", opts.timeout, -1);
  return enqueue(::c10d::OpType::ALLGATHER, job.call, outputs[0], std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), name_, ": allgather_coalesced got ",
              inputs.size(), " inputs but ", outputs.size(), " output lists");
  std::vector<Job> jobs;
  std::vector<at::Tensor> all_outputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "allgather_coalesced");
    check_list(outputs[i], inputs[i], size_, "allgather_coalesced", "output");
    jobs.push_back(
        gather_job(outputs[i], inputs[i], Kind::kAllgather, "allgather_coalesced", opts.timeout,
                   -1));
    all_outputs.insert(all_outputs.end(), outputs[i].begin(), outputs[i].end());
  }
  return enqueue_all(::c10d::OpType::ALLGATHER_COALESCED, std::move(jobs), all_outputs);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const ::c10d::AllgatherOptions& opts) {
  check_tensor(input, "_allgather_base");
  auto job = gather_base_job(output, input, "_allgather_base", opts.timeout);
  return enqueue(::c10d::OpType::_ALLGATHER_BASE, job.call, {output}, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), name_, ": allgather_into_tensor_coalesced got ",
              inputs.size(), " inputs but ", outputs.size(), " outputs");
  std::vector<Job> jobs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "allgather_into_tensor_coalesced");
    jobs.push_back(
        gather_base_job(outputs[i], inputs[i], "allgather_into_tensor_coalesced", opts.timeout));
  }
  return enqueue_all(::c10d::OpType::COALESCED, std::move(jobs), outputs);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const ::c10d::GatherOptions& opts) {
  const at::Tensor& in = single(inputs, "gather");
  check_root(opts.rootRank, "gather");
  const bool root = opts.rootRank == rank_;
  std::vector<at::Tensor> outs;
  if (root) {
    TORCH_CHECK(outputs.size() == 1, name_, ": gather takes one output list on the root, got ",
                outputs.size());
    check_list(outputs[0], in, size_, "gather", "output");
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), name_,
                ": gather takes no output list on non-root ranks");
  }
  auto job = gather_job(outs, in, Kind::kGather, "gather", opts.timeout,
                        static_cast<int>(opts.rootRank));
  return enqueue(::c10d::OpType::GATHER, job.call, outs, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const ::c10d::ScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "scatter");
  check_root(opts.rootRank, "scatter");
  const bool root = opts.rootRank == rank_;
  at::Tensor packed;
  if (root) {
    TORCH_CHECK(inputs.size() == 1, name_, ": scatter takes one input list on the root, got ",
                inputs.size());
    check_list(inputs[0], out, size_, "scatter", "input");
    packed = pack(inputs[0]);
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), name_,
                ": scatter takes no input list on non-root ranks");
  }
  CallInfo call = collective(Kind::kScatter, "scatter", opts.timeout, out);
  call.root = static_cast<int>(opts.rootRank);
  Staged dst(out, /*copy_in=*/false);
  return enqueue(::c10d::OpType::SCATTER, call, outputs, [this, packed, dst](const CallInfo& call, QueuedWork&) {
    transport_->scatter(call, packed.defined() ? packed.data_ptr() : nullptr,
                        dst.dense.data_ptr());
    dst.copy_out();
  });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const ::c10d::ReduceScatterOptions& opts) {
  const at::Tensor& out = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, name_, ": reduce_scatter takes one input list per process, "
              "got ", inputs.size());
  check_list(inputs[0], out, size_, "reduce_scatter", "input");
  auto job = reduction(pack(inputs[0]), out, opts.reduceOp, Kind::kReduceScatter,
                       "reduce_scatter", opts.timeout, -1);
  return enqueue(::c10d::OpType::REDUCE_SCATTER, job.call, outputs, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) {
  auto job = reduce_scatter_base_job(output, input, opts, "_reduce_scatter_base");
  return enqueue(::c10d::OpType::_REDUCE_SCATTER_BASE, job.call, {output}, std::move(job.run));
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), name_, ": reduce_scatter_tensor_coalesced got ",
              inputs.size(), " inputs but ", outputs.size(), " outputs");
  std::vector<Job> jobs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    jobs.push_back(
        reduce_scatter_base_job(outputs[i], inputs[i], opts, "reduce_scatter_tensor_coalesced"));
  }
  return enqueue_all(::c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, std::move(jobs), outputs);
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const ::c10d::AllToAllOptions& opts) {
  check_tensor(input, "alltoall_base");
  check_tensor(output, "alltoall_base");
  check_same_dtype(output, input, "alltoall_base");
  auto send = split_counts(input, input_splits, "input");
  auto recv = split_counts(output, output_splits, "output");
  CallInfo call = collective(Kind::kAlltoall, "alltoall_base", opts.timeout, input);
  call.count = 0;  // per-peer counts instead, checked by the transport
  Staged src(input, true);
  Staged dst(output, false);
  return enqueue(::c10d::OpType::ALLTOALL_BASE, call, {output},
                 [this, src, dst, send, recv](const CallInfo& call, QueuedWork&) {
                   transport_->alltoall(call, src.dense.data_ptr(), send.first, send.second,
                                        dst.dense.data_ptr(), recv.first, recv.second);
                   dst.copy_out();
                 });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::AllToAllOptions& opts) {
  TORCH_CHECK(inputs.size() == static_cast<size_t>(size_) && outputs.size() == inputs.size(),
              name_, ": alltoall takes ", size_, " inputs and ", size_, " outputs, got ",
              inputs.size(), " and ", outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "alltoall");
    check_tensor(outputs[i], "alltoall");
    check_same_dtype(outputs[i], inputs[0], "alltoall");
    check_same_dtype(inputs[i], inputs[0], "alltoall");
  }
  std::pair<std::vector<int64_t>, std::vector<int64_t>> send, recv;
  for (size_t i = 0; i < inputs.size(); ++i) {
    send.first.push_back(inputs[i].numel());
    send.second.push_back(i == 0 ? 0 : send.second[i - 1] + send.first[i - 1]);
    recv.first.push_back(outputs[i].numel());
    recv.second.push_back(i == 0 ? 0 : recv.second[i - 1] + recv.first[i - 1]);
  }
  at::Tensor packed = pack(inputs);
  at::Tensor received = at::empty({recv.second.back() + recv.first.back()}, packed.options());
  CallInfo call = collective(Kind::kAlltoall, "alltoall", opts.timeout, inputs[0]);
  call.count = 0;  // per-peer counts instead, checked by the transport
  return enqueue(::c10d::OpType::ALLTOALL, call, outputs,
                 [this, packed, received, send, recv, outputs](const CallInfo& call, QueuedWork&) {
                   transport_->alltoall(call, packed.data_ptr(), send.first, send.second,
                                        received.data_ptr(), recv.first, recv.second);
                   unpack(received, outputs);
                 });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) {
  const at::Tensor& t = single(tensors, "send");
  check_peer(dst, "send");
  CallInfo call = point_to_point(Kind::kSend, "send", t);
  Staged buf(t, true);
  return enqueue_on(p2p_worker(dst, true), ::c10d::OpType::SEND, call, tensors,
                    [this, buf, dst, tag](const CallInfo& call, QueuedWork&) {
                      transport_->send(call, buf.dense.data_ptr(), dst, tag);
                    });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) {
  const at::Tensor& t = single(tensors, "recv");
  check_peer(src, "recv");
  CallInfo call = point_to_point(Kind::kRecv, "recv", t);
  Staged buf(t, false);
  return enqueue_on(p2p_worker(src, false), ::c10d::OpType::RECV, call, tensors,
                    [this, buf, src, tag](const CallInfo& call, QueuedWork& work) {
                      transport_->recv(call, buf.dense.data_ptr(), src, tag);
                      buf.copy_out();
                      work.set_source_rank(src);
                    });
}

c10::intrusive_ptr<::c10d::Work> TransportBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) {
  const at::Tensor& t = single(tensors, "recv");
  CallInfo call = point_to_point(Kind::kRecv, "recv (any source)", t);
  Staged buf(t, false);
  return enqueue_on(p2p_worker(-1, false), ::c10d::OpType::RECVANYSOURCE, call, tensors,
                    [this, buf, tag](const CallInfo& call, QueuedWork& work) {
                      int src = transport_->recv_any(call, buf.dense.data_ptr(), tag);
                      buf.copy_out();
                      work.set_source_rank(src);
                    });
}

CallInfo TransportBackend::collective(Kind kind, const char* name,
                                      std::chrono::milliseconds timeout) {
  check_open(name);
  CallInfo call;
  call.kind = kind;
  call.name = name;
  call.timeout = timeout == ::c10d::kUnsetTimeout ? timeout_ : timeout;
  return call;
}

CallInfo TransportBackend::collective(Kind kind, const char* name, std::chrono::milliseconds timeout,
                    const at::Tensor& t) {
  CallInfo call = collective(kind, name, timeout);
  call.dtype = t.scalar_type();
  call.count = t.numel();
  if (t.device().type() == device_type_) call.device = t.device().index();
  return call;
}

CallInfo TransportBackend::point_to_point(Kind kind, const char* name, const at::Tensor& t) {
  check_open(name);
  CallInfo call;
  call.kind = kind;
  call.name = name;
  call.dtype = t.scalar_type();
  call.count = t.numel();
  if (t.device().type() == device_type_) call.device = t.device().index();
  call.timeout = timeout_;
  return call;
}

void TransportBackend::check_tensor(const at::Tensor& t, const char* op) const {
  TORCH_CHECK(t.defined(), name_, ": ", op, " got an undefined tensor");
  TORCH_CHECK(t.device().type() == device_type_, name_, ": ", op, " got a tensor on ",
              t.device(), "; ", name_, " handles ", c10::DeviceTypeName(device_type_, true),
              " tensors (use '", c10::DeviceTypeName(device_type_, true), ":", name_,
              ",cpu:gloo' as the backend for CPU tensors)");
  TORCH_CHECK(t.layout() == at::kStrided, name_, ": ", op,
              " supports dense (strided) tensors only, got ", t.layout());
}

const at::Tensor& TransportBackend::single(const std::vector<at::Tensor>& tensors, const char* op) const {
  TORCH_CHECK(tensors.size() == 1, name_, ": ", op,
              " takes exactly one tensor per process (one device per rank), got ",
              tensors.size());
  check_tensor(tensors[0], op);
  return tensors[0];
}

void TransportBackend::check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) const {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), name_, ": ", op,
              " needs one dtype for inputs and outputs, got ", a.scalar_type(), " and ",
              b.scalar_type());
}

void TransportBackend::check_list(const std::vector<at::Tensor>& list, const at::Tensor& ref, int expected,
                const char* op, const char* what) const {
  TORCH_CHECK(static_cast<int>(list.size()) == expected, name_, ": ", op, " needs ", expected,
              " ", what, " tensors (the group size), got ", list.size());
  for (const auto& t : list) {
    check_tensor(t, op);
    check_same_dtype(t, ref, op);
    TORCH_CHECK(t.numel() == ref.numel(), name_, ": ", op, " needs every ", what,
                " tensor to have ", ref.numel(), " elements, got ", t.numel());
  }
}

void TransportBackend::check_root(int64_t root, const char* op) const {
  TORCH_CHECK(root >= 0 && root < size_, name_, ": ", op, " root rank ", root,
              " is out of range for a group of ", size_, " ranks");
}

void TransportBackend::check_peer(int peer, const char* op) const {
  TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, ": ", op, " peer rank ", peer,
              " is invalid for rank ", rank_, " in a group of ", size_, " ranks");
}

at::Tensor TransportBackend::pack(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void TransportBackend::unpack(const at::Tensor& flat, const std::vector<at::Tensor>& outputs) {
  int64_t offset = 0;
  for (const auto& out : outputs) {
    out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
    offset += out.numel();
  }
}

TransportBackend::Job TransportBackend::reduction(const at::Tensor& in, const at::Tensor& out, const ::c10d::ReduceOp& op, Kind kind,
              const char* name, std::chrono::milliseconds timeout, int root) {
  check_tensor(out, name);
  check_same_dtype(in, out, name);
  const auto dtype = out.scalar_type();
  CallInfo call = collective(kind, name, timeout, out);
  call.root = root;
  at::Tensor src = in;
  bool average = false;
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM: call.op = RedOp::kSum; break;
    case ::c10d::ReduceOp::PRODUCT: call.op = RedOp::kProduct; break;
    case ::c10d::ReduceOp::MIN: call.op = RedOp::kMin; break;
    case ::c10d::ReduceOp::MAX: call.op = RedOp::kMax; break;
    case ::c10d::ReduceOp::BAND: call.op = RedOp::kBand; break;
    case ::c10d::ReduceOp::BOR: call.op = RedOp::kBor; break;
    case ::c10d::ReduceOp::BXOR: call.op = RedOp::kBxor; break;
    case ::c10d::ReduceOp::AVG:
      TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), name_, ": ", name,
                  " with ReduceOp.AVG needs a floating-point or complex tensor, got ", dtype,
                  " (use SUM and divide)");
      call.op = RedOp::kSum;
      average = true;
      break;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      auto* factor = dynamic_cast<::c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(factor != nullptr, name_, ": ", name, " with PREMUL_SUM has no factor");
      src = factor->tensor_factor.defined() ? in.mul(factor->tensor_factor.to(in.device()))
                                            : in.mul(factor->double_factor);
      call.op = RedOp::kSum;
      break;
    }
    default:
      TORCH_CHECK(false, name_, ": ", name, " does not support reduce op ",
                  static_cast<int>(op.op_));
  }
  const bool bitwise = call.op == RedOp::kBand || call.op == RedOp::kBor ||
                       call.op == RedOp::kBxor;
  TORCH_CHECK(!bitwise || at::isIntegralType(dtype, /*includeBool=*/true), name_, ": ", name,
              " with a bitwise reduce op needs an integer or bool tensor, got ", dtype);
  TORCH_CHECK(!at::isComplexType(dtype) || call.op == RedOp::kSum ||
                  call.op == RedOp::kProduct,
              name_, ": ", name, " on complex tensors supports SUM, AVG, PRODUCT and "
              "PREMUL_SUM only, got ", redop_name(call.op));
  Staged source(src, true);
  Staged dest(out, false);
  const int size = size_;
  const bool writes = kind != Kind::kReduce || root == rank_;
  Run run = [this, source, dest, average, size, writes](const CallInfo& call, QueuedWork&) {
    switch (call.kind) {
      case Kind::kAllreduce:
        transport_->allreduce(call, source.dense.data_ptr(), dest.dense.data_ptr());
        break;
      case Kind::kReduce:
        transport_->reduce(call, source.dense.data_ptr(), dest.dense.data_ptr());
        break;
      default:
        transport_->reduce_scatter(call, source.dense.data_ptr(), dest.dense.data_ptr());
    }
    if (!writes) return;
    if (average) dest.dense.div_(size);
    dest.copy_out();
  };
  return {call, std::move(run)};
}

TransportBackend::Job TransportBackend::reduce_scatter_base_job(const at::Tensor& output, const at::Tensor& input,
                            const ::c10d::ReduceScatterOptions& opts, const char* name) {
  check_tensor(input, name);
  check_tensor(output, name);
  TORCH_CHECK(input.numel() == output.numel() * size_, name_, ": ", name,
              " needs an input of group size x output elements (", size_, " x ",
              output.numel(), " = ", output.numel() * size_, "), got ", input.numel());
  return reduction(input, output, opts.reduceOp, Kind::kReduceScatter, name, opts.timeout, -1);
}

TransportBackend::Job TransportBackend::gather_job(const std::vector<at::Tensor>& outs, const at::Tensor& in, Kind kind,
               const char* name, std::chrono::milliseconds timeout, int root) {
  CallInfo call = collective(kind, name, timeout, in);
  call.root = root;
  Staged src(in, true);
  at::Tensor packed;
  if (!outs.empty()) packed = at::empty({in.numel() * size_}, in.options());
  Run run = [this, src, packed, outs](const CallInfo& call, QueuedWork&) {
    void* out = packed.defined() ? packed.data_ptr() : nullptr;
    if (call.kind == Kind::kAllgather) {
      transport_->allgather(call, src.dense.data_ptr(), out);
    } else {
      transport_->gather(call, src.dense.data_ptr(), out);
    }
    if (packed.defined()) unpack(packed, outs);
  };
  return {call, std::move(run)};
}

TransportBackend::Job TransportBackend::gather_base_job(const at::Tensor& output, const at::Tensor& input, const char* name,
                    std::chrono::milliseconds timeout) {
  check_tensor(output, name);
  check_same_dtype(output, input, name);
  TORCH_CHECK(output.numel() == input.numel() * size_, name_, ": ", name,
              " needs an output of group size x input elements (", size_, " x ",
              input.numel(), " = ", input.numel() * size_, "), got ", output.numel());
  CallInfo call = collective(Kind::kAllgather, name, timeout, input);
  Staged src(input, true);
  Staged dst(output, false);
  Run run = [this, src, dst](const CallInfo& call, QueuedWork&) {
    transport_->allgather(call, src.dense.data_ptr(), dst.dense.data_ptr());
    dst.copy_out();
  };
  return {call, std::move(run)};
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> TransportBackend::split_counts(
    const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) const {
  std::vector<int64_t> counts(size_), offsets(size_);
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = rows == 0 ? 0 : t.numel() / rows;
  if (splits.empty()) {
    TORCH_CHECK(rows % size_ == 0, name_, ": alltoall_base ", what, " has ", rows,
                " rows, not divisible by the group size ", size_,
                "; pass split sizes for uneven splits");
    for (int i = 0; i < size_; ++i) counts[i] = rows / size_ * row;
  } else {
    TORCH_CHECK(static_cast<int>(splits.size()) == size_, name_, ": alltoall_base needs ",
                size_, " ", what, " split sizes (the group size), got ", splits.size());
    int64_t total = 0;
    for (int i = 0; i < size_; ++i) {
      TORCH_CHECK(splits[i] >= 0, name_, ": alltoall_base ", what, " split size ", splits[i],
                  " is negative");
      counts[i] = splits[i] * row;
      total += splits[i];
    }
    TORCH_CHECK(total == rows, name_, ": alltoall_base ", what, " split sizes sum to ", total,
                " but the tensor has ", rows, " rows");
  }
  for (int i = 1; i < size_; ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return {counts, offsets};
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
          device_runtime()->stream_synchronize(device->index(), own.id());
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
  return work;
}

void TransportBackend::wait_for_producers(const c10::Event& ready, const CallInfo& call) const {
  // Polled, with a pause growing to 1 ms: an event has no wait that another thread can
  // interrupt (Event.synchronize() would block until the stream got there, however long).
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  while (!ready.query()) {
    if (closed_) {
      C10_THROW_ERROR(DistBackendError,
                      name_ + ": " + call.name + " (collective #" + std::to_string(call.seq) +
                          ") was waiting for the queued work that produces its inputs when the "
                          "process group was aborted or shut down on rank " +
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
