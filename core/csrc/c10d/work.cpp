// The c10d glue's Work and the ordered worker threads that run its operations
// (<accelkit/c10d/backend.h>: QueuedWork, OrderedWorker).
#include "c10d/without_gil.h"  // first: it includes Python.h

#include "c10d/transport_backend.h"  // and <accelkit/c10d/backend.h>

#include "c10d/device_streams.h"
#include "testing/faults.h"

#include <c10/util/Exception.h>

namespace accelkit::c10d {

using detail::async_device;
using detail::current_stream_of;
using detail::driver_stream_of;

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
  device_runtime()->stream_wait(
      device_->index(), driver_stream_of(stream), what.c_str(),
      [completion = completion_](accelkit::Runtime::Resume resume) {
        std::unique_lock<std::mutex> lock(completion->mutex);
        if (!completion->done) {
          completion->waiters.push_back(std::move(resume));
          return;
        }
        const std::exception_ptr error = completion->error;
        lock.unlock();
        resume(error);
      });
  return true;
}

int QueuedWork::sourceRank() const {
  // The peer is host state, known once the recv ran: on an asynchronous device wait() only
  // ordered the caller's stream, so block here until the operation finished, as
  // dist.recv(src=None) needs the rank it returns. Without Python's GIL (torch's binding of
  // _source_rank keeps it): the worker that completes the recv may first need it, to free
  // the tensors of an earlier operation whose Work it drops.
  {
    detail::WithoutGil no_gil;
    std::unique_lock<std::mutex> lock(completion_->mutex);
    completion_->cv.wait(lock, [&] { return completion_->done; });
  }
  if (completion_->error) std::rethrow_exception(completion_->error);
  TORCH_CHECK(source_rank_ >= 0,
              "sourceRank() is only defined for a completed recv from any source");
  return source_rank_;
}

void QueuedWork::complete(std::exception_ptr error) {
  finish(error);  // first: is_completed() holds once a stream's wait for it has passed
  std::vector<accelkit::Runtime::Resume> waiters;
  {
    std::lock_guard<std::mutex> lock(completion_->mutex);
    completion_->done = true;
    completion_->error = error;
    waiters.swap(completion_->waiters);
  }
  completion_->cv.notify_all();
  for (auto& resume : waiters) resume(error);
}

void QueuedWork::complete_future(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

// -- CoalescedWork ------------------------------------------------------------------------------

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<::c10d::Work>> works)
    : ::c10d::Work(rank, ::c10d::OpType::COALESCED, nullptr),
      works_(std::move(works)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {
  // The future completes on the thread that completes the last member's.
  struct Countdown {
    std::mutex mutex;
    size_t left;
    std::exception_ptr error;
  };
  auto countdown = std::make_shared<Countdown>();
  countdown->left = works_.size();
  if (works_.empty()) {
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
    return;
  }
  for (const auto& work : works_) {
    work->getFuture()->addCallback(
        [countdown, future = future_, works = works_](c10::ivalue::Future& done) {
          std::exception_ptr error;
          {
            std::lock_guard<std::mutex> lock(countdown->mutex);
            if (done.hasError() && !countdown->error) countdown->error = done.exception_ptr();
            if (--countdown->left > 0) return;
            error = countdown->error;
          }
          if (error) {
            future->setError(error);
            return;
          }
          std::vector<at::Tensor> outputs;
          for (const auto& w : works) {
            for (auto& t : w->result()) outputs.push_back(std::move(t));
          }
          future->markCompleted(c10::IValue(outputs));
        });
  }
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  for (const auto& work : works_) work->wait(timeout);
  return true;
}

bool CoalescedWork::isCompleted() {
  for (const auto& work : works_) {
    if (!work->isCompleted()) return false;
  }
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  for (const auto& work : works_) {
    if (std::exception_ptr error = work->exception()) return error;
  }
  return nullptr;
}

std::vector<at::Tensor> CoalescedWork::result() {
  std::vector<at::Tensor> outputs;
  for (const auto& work : works_) {
    for (auto& t : work->result()) outputs.push_back(std::move(t));
  }
  return outputs;
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

}  // namespace accelkit::c10d
