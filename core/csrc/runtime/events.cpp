// Events in stream order (events.h).
#include "runtime/events.h"

#include <accelkit/runtime.h>

#include <chrono>

namespace accelkit {
namespace {

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

}  // namespace

uint64_t EventState::record(int device, int64_t stream) {
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n = ++recorded_;
  }
  // Completes record n when the task is destroyed: after the stream ran it, or when the
  // runtime dropped it unrun (a device drops the work queued after an asynchronous error), so
  // no wait on the event blocks forever; the error itself is raised by the next synchronizing
  // call on the device.
  struct Completion {
    std::shared_ptr<EventState> event;
    uint64_t n;
    ~Completion() { event->complete(n); }
  };
  runtime().launch(device, stream, "event record",
                   [done = std::shared_ptr<Completion>(new Completion{shared_from_this(), n})] {
                     done->event->complete(done->n);
                   });
  return n;
}

void EventState::complete(uint64_t n) {
  std::vector<Runtime::Resume> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (n > completed_) {
      completed_ = n;
      time_ms_ = now_ms();
    }
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->first <= completed_) {
        ready.push_back(std::move(it->second));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  cv_.notify_all();
  for (auto& resume : ready) resume(nullptr);  // outside the lock: a resume runs the scheduler
}

void EventState::when_complete(uint64_t n, Runtime::Resume resume) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_ < n) {
      waiters_.emplace_back(n, std::move(resume));
      return;
    }
  }
  resume(nullptr);
}

void EventState::wait_for(uint64_t n) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_ >= n; });
}

void EventState::block(int device, int64_t stream) {
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n = recorded_;
    if (completed_ >= n) return;  // nothing to wait for
  }
  runtime().stream_wait(device, stream, "event wait",
                        [self = shared_from_this(), n](Runtime::Resume resume) {
                          self->when_complete(n, std::move(resume));
                        });
}

bool EventState::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ >= recorded_;
}

void EventState::synchronize() {
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n = recorded_;
  }
  wait_for(n);
}

bool EventState::recorded() {
  std::lock_guard<std::mutex> lock(mutex_);
  return recorded_ > 0;
}

double EventState::time_ms() {
  std::lock_guard<std::mutex> lock(mutex_);
  return time_ms_;
}

std::shared_ptr<EventState> mark(int device, int64_t stream) {
  auto event = std::make_shared<EventState>();
  event->record(device, stream);
  return event;
}

}  // namespace accelkit
