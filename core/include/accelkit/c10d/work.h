// accelkit c10d Work: one queued collective, completed by the group's worker thread.
//
// Behaves as c10d documents (torch/csrc/distributed/c10d/Work.hpp): wait() blocks until the
// operation finished and rethrows its error (a c10::DistBackendError for communication
// failures); isCompleted() never blocks; getFuture() completes with the output tensors (the
// functional collectives and DDP comm hooks rely on that) or with the error; result() returns
// the outputs; sourceRank() is the peer a recv-from-any-source received from.
#pragma once

#include <atomic>
#include <exception>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace accelkit::c10d {

class QueuedWork : public ::c10d::Work {
 public:
  QueuedWork(int rank, ::c10d::OpType type, const char* title, uint64_t seq,
             std::vector<at::Tensor> outputs)
      : ::c10d::Work(rank, type, title),
        seq_(seq),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  uint64_t getSequencenumber() const override { return seq_; }

  int sourceRank() const override {
    TORCH_CHECK(source_rank_ >= 0, "sourceRank() is only defined for a completed recv from any "
                "source");
    return source_rank_;
  }

  void set_source_rank(int rank) { source_rank_ = rank; }

  // Called once by the worker thread: completes the future, then marks the Work done (waking
  // wait()), so the future is done whenever wait() has returned (as ProcessGroupGloo does).
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

 private:
  const uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> source_rank_{-1};
};

}  // namespace accelkit::c10d
