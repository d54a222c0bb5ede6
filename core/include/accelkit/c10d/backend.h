// accelkit c10d glue: a c10d::Backend that runs every c10d collective on a Transport.
//
// This is the reusable part of a device's collective library (issue #5): it validates the
// tensors (device, dtype, sizes), stages non-contiguous tensors through dense buffers, builds
// AVG and PREMUL_SUM on SUM, splits coalesced and list variants into transport calls, keeps
// the group's collective sequence number, and runs each group's collectives in issue order on
// one worker thread (point-to-point ops on one thread per peer and direction, so a send and a
// recv between the same two ranks never wait on each other). Every op returns a QueuedWork.
// Nothing here knows a device name: the device type and backend name are constructor
// arguments, the data movement is the Transport's.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <accelkit/c10d/transport.h>
#include <accelkit/c10d/work.h>

namespace accelkit::c10d {

// One thread running jobs in submission order.
class OrderedWorker {
 public:
  OrderedWorker() : thread_([this] { loop(); }) {}
  ~OrderedWorker() { stop(); }

  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      TORCH_CHECK(!stopping_, "the process group was shut down; create a new one");
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // Runs the queued jobs, then joins the thread.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
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

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

// Connects the ranks of one group through `store` and returns this rank's transport; called
// by every rank of a new group (creation, and split() for sub-groups).
using Connect = std::function<std::unique_ptr<Transport>(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout)>;

class TransportBackend : public ::c10d::Backend {
 public:
  TransportBackend(Connect connect, const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                   int size, std::chrono::milliseconds timeout, c10::DeviceType device_type,
                   std::string name)
      : ::c10d::Backend(rank, size),
        connect_(std::move(connect)),
        transport_(connect_(store, rank, size, timeout)),
        timeout_(timeout),
        device_type_(device_type),
        name_(std::move(name)) {
    init();
  }

  ~TransportBackend() override { shutdown(); }

  const std::string getBackendName() const override { return name_; }

  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  c10::intrusive_ptr<Options> getBackendOptions() override {
    return c10::make_intrusive<Options>(name_, timeout_);
  }

  // split_group / DeviceMesh after init_process_group(device_id=...): the ranks of `ranks`
  // (ranks of this group, sorted) connect a new group through `store`; others get nullptr.
  bool supportsSplitting() const override { return true; }

  c10::intrusive_ptr<::c10d::Backend> split(const c10::intrusive_ptr<::c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<Options>& opts) override {
    auto me = std::find(ranks.begin(), ranks.end(), rank_);
    if (me == ranks.end()) return nullptr;
    const auto timeout = opts ? opts->timeout : timeout_;
    return c10::make_intrusive<TransportBackend>(connect_, store,
                                                 static_cast<int>(me - ranks.begin()),
                                                 static_cast<int>(ranks.size()), timeout,
                                                 device_type_, name_);
  }

  std::chrono::milliseconds timeout() const { return timeout_; }

  // The sequence number is local, and in step on every rank by construction: every rank
  // issues the same collectives in the same order (the transport checks it per call).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  void shutdown() override {
    std::lock_guard<std::mutex> lock(lifecycle_mutex_);
    if (closed_) return;
    closed_ = true;
    collectives_.reset();
    p2p_.clear();
    transport_->shutdown();
  }

  void abort() override { shutdown(); }

  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override {
    CallInfo call = collective(Kind::kBarrier, "barrier", opts.timeout);
    return enqueue(::c10d::OpType::BARRIER, call, {}, [this](const CallInfo& call, QueuedWork&) {
      transport_->barrier(call);
    });
  }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override {
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

  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override {
    const at::Tensor& t = single(tensors, "allreduce");
    TORCH_CHECK(!opts.sparseIndices.has_value() && t.layout() == at::kStrided,
                name_, ": allreduce supports dense (strided) tensors only, got ", t.layout());
    auto job = reduction(t, t, opts.reduceOp, Kind::kAllreduce, "allreduce", opts.timeout, -1);
    return enqueue(::c10d::OpType::ALLREDUCE, job.call, tensors, std::move(job.run));
  }

  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), name_, ": allreduce_coalesced needs at least one tensor");
    std::vector<Job> jobs;
    for (const auto& t : tensors) {
      check_tensor(t, "allreduce_coalesced");
      jobs.push_back(reduction(t, t, opts.reduceOp, Kind::kAllreduce, "allreduce_coalesced",
                               opts.timeout, -1));
    }
    return enqueue_all(::c10d::OpType::ALLREDUCE_COALESCED, std::move(jobs), tensors);
  }

  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const ::c10d::ReduceOptions& opts) override {
    const at::Tensor& t = single(tensors, "reduce");
    check_root(opts.rootRank, "reduce");
    auto job = reduction(t, t, opts.reduceOp, Kind::kReduce, "reduce", opts.timeout,
                         static_cast<int>(opts.rootRank));
    return enqueue(::c10d::OpType::REDUCE, job.call, tensors, std::move(job.run));
  }

  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override {
    const at::Tensor& in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1, name_, ": allgather takes one output list per process, got ",
                outputs.size());
    check_list(outputs[0], in, size_, "allgather", "output");
    auto job = gather_job(outputs[0], in, Kind::kAllgather, "allgather", opts.timeout, -1);
    return enqueue(::c10d::OpType::ALLGATHER, job.call, outputs[0], std::move(job.run));
  }

  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override {
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

  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override {
    check_tensor(input, "_allgather_base");
    auto job = gather_base_job(output, input, "_allgather_base", opts.timeout);
    return enqueue(::c10d::OpType::_ALLGATHER_BASE, job.call, {output}, std::move(job.run));
  }

  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override {
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

  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::GatherOptions& opts) override {
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

  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override {
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

  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1, name_, ": reduce_scatter takes one input list per process, "
                "got ", inputs.size());
    check_list(inputs[0], out, size_, "reduce_scatter", "input");
    auto job = reduction(pack(inputs[0]), out, opts.reduceOp, Kind::kReduceScatter,
                         "reduce_scatter", opts.timeout, -1);
    return enqueue(::c10d::OpType::REDUCE_SCATTER, job.call, outputs, std::move(job.run));
  }

  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) override {
    auto job = reduce_scatter_base_job(output, input, opts, "_reduce_scatter_base");
    return enqueue(::c10d::OpType::_REDUCE_SCATTER_BASE, job.call, {output}, std::move(job.run));
  }

  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == inputs.size(), name_, ": reduce_scatter_tensor_coalesced got ",
                inputs.size(), " inputs but ", outputs.size(), " outputs");
    std::vector<Job> jobs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      jobs.push_back(
          reduce_scatter_base_job(outputs[i], inputs[i], opts, "reduce_scatter_tensor_coalesced"));
    }
    return enqueue_all(::c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, std::move(jobs), outputs);
  }

  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits,
                                                 const ::c10d::AllToAllOptions& opts) override {
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

  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override {
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

  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                        int tag) override {
    const at::Tensor& t = single(tensors, "send");
    check_peer(dst, "send");
    CallInfo call = point_to_point(Kind::kSend, "send", t);
    Staged buf(t, true);
    return enqueue_on(p2p_worker(dst, true), ::c10d::OpType::SEND, call, tensors,
                      [this, buf, dst, tag](const CallInfo& call, QueuedWork&) {
                        transport_->send(call, buf.dense.data_ptr(), dst, tag);
                      });
  }

  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                        int tag) override {
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

  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override {
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

 private:
  using Run = std::function<void(const CallInfo&, QueuedWork&)>;
  struct Job {
    CallInfo call;
    Run run;
  };

  // A tensor as the transport sees it: `dense` is the tensor itself when it is contiguous,
  // else a contiguous copy (copy_in) or scratch buffer written back by copy_out().
  struct Staged {
    at::Tensor user;
    at::Tensor dense;
    Staged(const at::Tensor& t, bool copy_in)
        : user(t),
          dense(t.is_contiguous() ? t
                : copy_in         ? t.contiguous()
                                  : at::empty(t.sizes(), t.options())) {}
    void copy_out() const {
      if (!dense.is_same(user)) user.copy_(dense);
    }
  };

  CallInfo collective(Kind kind, const char* name, std::chrono::milliseconds timeout) {
    TORCH_CHECK(!closed_, name_, ": ", name, " on a process group that was shut down");
    CallInfo call;
    call.kind = kind;
    call.name = name;
    call.timeout = timeout == ::c10d::kUnsetTimeout ? timeout_ : timeout;
    return call;
  }

  CallInfo collective(Kind kind, const char* name, std::chrono::milliseconds timeout,
                      const at::Tensor& t) {
    CallInfo call = collective(kind, name, timeout);
    call.dtype = t.scalar_type();
    call.count = t.numel();
    return call;
  }

  CallInfo point_to_point(Kind kind, const char* name, const at::Tensor& t) {
    TORCH_CHECK(!closed_, name_, ": ", name, " on a process group that was shut down");
    CallInfo call;
    call.kind = kind;
    call.name = name;
    call.dtype = t.scalar_type();
    call.count = t.numel();
    call.timeout = timeout_;
    return call;
  }

  void check_tensor(const at::Tensor& t, const char* op) const {
    TORCH_CHECK(t.defined(), name_, ": ", op, " got an undefined tensor");
    TORCH_CHECK(t.device().type() == device_type_, name_, ": ", op, " got a tensor on ",
                t.device(), "; ", name_, " handles ", c10::DeviceTypeName(device_type_, true),
                " tensors (use '", c10::DeviceTypeName(device_type_, true), ":", name_,
                ",cpu:gloo' as the backend for CPU tensors)");
    TORCH_CHECK(t.layout() == at::kStrided, name_, ": ", op,
                " supports dense (strided) tensors only, got ", t.layout());
  }

  const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* op) const {
    TORCH_CHECK(tensors.size() == 1, name_, ": ", op,
                " takes exactly one tensor per process (one device per rank), got ",
                tensors.size());
    check_tensor(tensors[0], op);
    return tensors[0];
  }

  void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) const {
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), name_, ": ", op,
                " needs one dtype for inputs and outputs, got ", a.scalar_type(), " and ",
                b.scalar_type());
  }

  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& ref, int expected,
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

  void check_root(int64_t root, const char* op) const {
    TORCH_CHECK(root >= 0 && root < size_, name_, ": ", op, " root rank ", root,
                " is out of range for a group of ", size_, " ranks");
  }

  void check_peer(int peer, const char* op) const {
    TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, ": ", op, " peer rank ", peer,
                " is invalid for rank ", rank_, " in a group of ", size_, " ranks");
  }

  static at::Tensor pack(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> flat;
    flat.reserve(tensors.size());
    for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
    return at::cat(flat);
  }

  static void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& outputs) {
    int64_t offset = 0;
    for (const auto& out : outputs) {
      out.copy_(flat.narrow(0, offset, out.numel()).view(out.sizes()));
      offset += out.numel();
    }
  }

  std::pair<std::vector<int64_t>, std::vector<int64_t>> split_counts(
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

  // allreduce / reduce / reduce_scatter of `in` into `out` (the same tensor but for
  // reduce_scatter). AVG divides the SUM by the group size; PREMUL_SUM scales a copy of the
  // input first (NCCL's definition, torch.distributed._make_nccl_premul_sum).
  Job reduction(const at::Tensor& in, const at::Tensor& out, const ::c10d::ReduceOp& op, Kind kind,
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

  Job reduce_scatter_base_job(const at::Tensor& output, const at::Tensor& input,
                              const ::c10d::ReduceScatterOptions& opts, const char* name) {
    check_tensor(input, name);
    check_tensor(output, name);
    TORCH_CHECK(input.numel() == output.numel() * size_, name_, ": ", name,
                " needs an input of group size x output elements (", size_, " x ",
                output.numel(), " = ", output.numel() * size_, "), got ", input.numel());
    return reduction(input, output, opts.reduceOp, Kind::kReduceScatter, name, opts.timeout, -1);
  }

  // allgather / gather of `in` into the list `outs` (empty on a non-root gather rank).
  Job gather_job(const std::vector<at::Tensor>& outs, const at::Tensor& in, Kind kind,
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

  Job gather_base_job(const at::Tensor& output, const at::Tensor& input, const char* name,
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

  // Queues one collective on the group's worker; the sequence number is taken here, once the
  // arguments passed every check, so a rank whose call raised locally never skips a number.
  c10::intrusive_ptr<::c10d::Work> enqueue(::c10d::OpType type, const CallInfo& call,
                                           std::vector<at::Tensor> outputs, Run run) {
    std::vector<Job> jobs;
    jobs.push_back({call, std::move(run)});
    return enqueue_all(type, std::move(jobs), std::move(outputs));
  }

  // Coalesced and list variants: several transport calls under one sequence number and Work.
  c10::intrusive_ptr<::c10d::Work> enqueue_all(::c10d::OpType type, std::vector<Job> jobs,
                                               std::vector<at::Tensor> outputs) {
    const uint64_t seq = ++seq_;
    for (auto& job : jobs) job.call.seq = seq;
    CallInfo first = jobs.front().call;
    return enqueue_on(*collectives_, type, first, std::move(outputs),
                      [jobs](const CallInfo&, QueuedWork& work) {
                        for (const auto& job : jobs) job.run(job.call, work);
                      });
  }

  c10::intrusive_ptr<::c10d::Work> enqueue_on(OrderedWorker& worker, ::c10d::OpType type,
                                              const CallInfo& call,
                                              std::vector<at::Tensor> outputs, Run run) {
    auto work = c10::make_intrusive<QueuedWork>(rank_, type, nullptr, call.seq, outputs);
    std::optional<c10::Device> device;
    if (!outputs.empty()) device = outputs.front().device();
    worker.submit([work, call, run = std::move(run), device]() {
      std::exception_ptr error;
      try {
        c10::OptionalDeviceGuard guard(device);
        run(call, *work);
      } catch (...) {
        error = std::current_exception();
      }
      work->complete(error);
    });
    return work;
  }

  // One worker per peer and direction (peer -1: receive from any source).
  OrderedWorker& p2p_worker(int peer, bool sending) {
    std::lock_guard<std::mutex> lock(lifecycle_mutex_);
    TORCH_CHECK(!closed_, name_, ": point-to-point op on a process group that was shut down");
    auto& slot = p2p_[{peer, sending}];
    if (!slot) slot = std::make_unique<OrderedWorker>();
    return *slot;
  }

  const Connect connect_;
  std::unique_ptr<Transport> transport_;
  std::chrono::milliseconds timeout_;
  const c10::DeviceType device_type_;
  const std::string name_;
  uint64_t seq_ = 0;
  std::mutex lifecycle_mutex_;
  bool closed_ = false;
  // Declared last: destroyed (joined) first, while the transport is still alive.
  std::map<std::pair<int, bool>, std::unique_ptr<OrderedWorker>> p2p_;
  std::unique_ptr<OrderedWorker> collectives_ = std::make_unique<OrderedWorker>();
};

}  // namespace accelkit::c10d
