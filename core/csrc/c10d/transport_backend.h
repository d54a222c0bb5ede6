// Private to accelkit's C++ layer: the c10d::Backend behind bind_collectives()
// (<accelkit/c10d/backend.h> says what it does), its Work and its worker threads. A collective
// library never names these; it implements a Transport and calls bind_collectives().
#pragma once

#include <accelkit/c10d/backend.h>
#include <accelkit/c10d/transport.h>
#include <accelkit/runtime.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace accelkit::c10d {

// One queued operation, completed by a worker thread. Behaves as c10d documents
// (torch/csrc/distributed/c10d/Work.hpp): wait() blocks until the operation finished and
// rethrows its error (a c10::DistBackendError for communication failures); isCompleted() never
// blocks; getFuture() completes with the output tensors (functional collectives and DDP comm
// hooks rely on it) or with the error; result() returns the outputs; sourceRank() is the peer
// a recv-from-any-source received from (it blocks until the recv ran, also on an asynchronous
// device).
class QueuedWork : public ::c10d::Work {
 public:
  QueuedWork(int rank, ::c10d::OpType type, const char* name, uint64_t seq,
             std::vector<at::Tensor> outputs, std::optional<c10::Device> device);

  // On an asynchronous device, queues the wait on the caller's current stream and returns;
  // an error of the operation is then raised by the stream's next synchronizing call.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override;

  void set_source_rank(int rank) { source_rank_ = rank; }

  // Called once by the worker when the operation finished: marks it done for the waits queued
  // on streams and for wait() on the host.
  void complete(std::exception_ptr error);
  // Completes the future, which runs its callbacks on the calling thread.
  void complete_future(std::exception_ptr error);

 private:
  // Completion as plain C++ state: what a wait queued on a stream holds (never the Work, whose
  // last reference may belong to Python and must not be dropped on a stream's thread).
  struct Completion {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    std::vector<accelkit::Runtime::Resume> waiters;  // streams' waits (Runtime::stream_wait)
  };

  const std::string name_;
  const std::shared_ptr<Completion> completion_ = std::make_shared<Completion>();
  const uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> source_rank_{-1};
  const std::optional<c10::Device> device_;
};

// The operations of one coalescing group (startCoalescing() to endCoalescing(), as
// torch.distributed._coalescing_manager issues them with a device) as one Work: wait() waits
// for each in issue order (on an asynchronous device it queues each one's wait on the
// caller's stream), it is completed once all are, its error is the first of theirs, and its
// future completes with every operation's outputs once all did (or with the first error).
class CoalescedWork : public ::c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<::c10d::Work>> works);

  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  bool isCompleted() override;
  bool isSuccess() const override { return exception() == nullptr; }
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  const std::vector<c10::intrusive_ptr<::c10d::Work>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// One thread running jobs in submission order.
class OrderedWorker {
 public:
  OrderedWorker();
  ~OrderedWorker();

  // Queue `job`; raises once stop() began (the group was shut down).
  void submit(std::function<void()> job);

  // Runs the jobs already queued, then joins the thread. Idempotent.
  void stop();

  // This worker's stream on `device` (created on first use; call from the worker's jobs).
  c10::Stream stream(c10::Device device);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::map<c10::DeviceIndex, c10::Stream> streams_;  // used by the worker's thread only
  std::thread thread_;
};

class TransportBackend : public ::c10d::Backend {
 public:
  TransportBackend(Connect connect, const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                   int size, std::chrono::milliseconds timeout, c10::DeviceType device_type,
                   std::string name);
  ~TransportBackend() override;

  const std::string getBackendName() const override { return name_; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  c10::intrusive_ptr<Options> getBackendOptions() override;

  // split_group / DeviceMesh after init_process_group(device_id=...): the ranks of `ranks`
  // (ranks of this group, sorted) connect a new group through `store`; others get nullptr.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<::c10d::Backend> split(const c10::intrusive_ptr<::c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<Options>& opts) override;

  // Coalescing: the operations issued between startCoalescing() and endCoalescing() run as
  // each is issued, in order, and endCoalescing() returns one CoalescedWork for them (torch's
  // _coalescing_manager(device=...) replaces the Work of its coalesced call with it).
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<::c10d::Work> endCoalescing() override;

  // The sequence number is local, and in step on every rank by construction: every rank
  // issues the same collectives in the same order (the transport checks it per call).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  // Teardown: no new operations; the operations issued before it run to their end (each
  // completes, or fails at its timeout); the workers are joined and the transport released.
  void shutdown() override;
  // As shutdown(), but the transport is aborted first: operations in flight complete with an
  // error within moments, queued ones fail at once.
  void abort() override;

  // Operations queued or running, not yet completed.
  int64_t pending() const { return pending_; }

  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_splits,
                                                 std::vector<int64_t>& input_splits,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                        int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                        int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override;

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
    Staged(const at::Tensor& t, bool copy_in);
    void copy_out() const;
  };

  CallInfo collective(Kind kind, const char* name, std::chrono::milliseconds timeout);
  CallInfo collective(Kind kind, const char* name, std::chrono::milliseconds timeout,
                      const at::Tensor& t);
  CallInfo point_to_point(Kind kind, const char* name, const at::Tensor& t);
  void check_open(const char* name) const;
  void check_tensor(const at::Tensor& t, const char* op) const;
  const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* op) const;
  void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op) const;
  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& ref, int expected,
                  const char* op, const char* what) const;
  void check_root(int64_t root, const char* op) const;
  void check_peer(int peer, const char* op) const;
  static at::Tensor pack(const std::vector<at::Tensor>& tensors);
  static void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& outputs);
  std::pair<std::vector<int64_t>, std::vector<int64_t>> split_counts(
      const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) const;

  // allreduce / reduce / reduce_scatter of `in` into `out` (the same tensor but for
  // reduce_scatter). AVG divides the SUM by the group size; PREMUL_SUM scales a copy of the
  // input first (NCCL's definition, torch.distributed._make_nccl_premul_sum). The caller has
  // checked the tensors (check_tensor, or single() / check_list for a list).
  Job reduction(const at::Tensor& in, const at::Tensor& out, const ::c10d::ReduceOp& op,
                Kind kind, const char* name, std::chrono::milliseconds timeout, int root);
  Job reduce_scatter_base_job(const at::Tensor& output, const at::Tensor& input,
                              const ::c10d::ReduceScatterOptions& opts, const char* name);
  // allgather / gather of `in` into the list `outs` (empty on a non-root gather rank).
  Job gather_job(const std::vector<at::Tensor>& outs, const at::Tensor& in, Kind kind,
                 const char* name, std::chrono::milliseconds timeout, int root);
  Job gather_base_job(const at::Tensor& output, const at::Tensor& input, const char* name,
                      std::chrono::milliseconds timeout);

  // Queues one collective on the group's worker; the sequence number is taken here, once the
  // arguments passed every check, so a rank whose call raised locally never skips a number.
  c10::intrusive_ptr<::c10d::Work> enqueue(::c10d::OpType type, const CallInfo& call,
                                           std::vector<at::Tensor> outputs, Run run);
  // Coalesced and list variants: several transport calls under one sequence number and Work.
  c10::intrusive_ptr<::c10d::Work> enqueue_all(::c10d::OpType type, std::vector<Job> jobs,
                                               std::vector<at::Tensor> outputs);
  c10::intrusive_ptr<::c10d::Work> enqueue_on(OrderedWorker& worker, ::c10d::OpType type,
                                              const CallInfo& call,
                                              std::vector<at::Tensor> outputs, Run run);
  // One worker per peer and direction (peer -1: receive from any source).
  OrderedWorker& p2p_worker(int peer, bool sending);
  // The thread that completes the futures of operations on an asynchronous device (created on
  // first use).
  OrderedWorker& callback_worker();
  // How close() ends the operations in flight: finish them (shutdown()), abort them when
  // there are any (the destructor), abort the transport in any case (abort()).
  enum class Ending { kFinish, kAbortInFlight, kAbort };
  void close(Ending ending, const char* why);
  // Asynchronous device: block the worker until `ready` (recorded after the work that
  // produces the call's inputs) completed, or raise once the group is aborted or the call's
  // timeout passed: a stream that never gets there cannot keep abort() waiting.
  void wait_for_producers(const c10::Event& ready, const CallInfo& call) const;

  const Connect connect_;
  std::unique_ptr<Transport> transport_;
  std::chrono::milliseconds timeout_;
  const c10::DeviceType device_type_;
  const std::string name_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<int64_t> pending_{0};
  std::atomic<bool> closed_{false};
  std::atomic<bool> aborted_{false};
  std::mutex lifecycle_mutex_;  // guards p2p_, callbacks_ and the closing
  std::map<std::pair<int, bool>, std::unique_ptr<OrderedWorker>> p2p_;
  std::unique_ptr<OrderedWorker> callbacks_;
  std::mutex coalescing_mutex_;  // guards coalescing_ and coalesced_
  bool coalescing_ = false;      // between startCoalescing() and endCoalescing()
  std::vector<c10::intrusive_ptr<::c10d::Work>> coalesced_;  // the group's operations so far
  OrderedWorker collectives_;
};

}  // namespace accelkit::c10d
