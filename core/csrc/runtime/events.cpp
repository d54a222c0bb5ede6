// The layer's events and the runtime's default ones (events.h).
#include "runtime/events.h"

#include <accelkit/runtime.h>

#include <c10/util/Exception.h>

#include <chrono>

namespace accelkit {
namespace {

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

}  // namespace

uint64_t EventState::record(Runtime& runtime, int device, DriverStream stream) {
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
  runtime.launch(device, stream, "event record",
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

void EventState::block(Runtime& runtime, int device, DriverStream stream) {
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n = recorded_;
    if (completed_ >= n) return;  // nothing to wait for
  }
  runtime.stream_wait(device, stream, "event wait",
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

double EventState::time_ms() {
  std::lock_guard<std::mutex> lock(mutex_);
  return time_ms_;
}

Event::~Event() {
  if (event_ != nullptr) runtime().event_destroy(device_, event_);
}

void Event::record(int device, DriverStream stream) {
  if (event_ == nullptr) {
    event_ = runtime().event_create(device, flags_);
    TORCH_CHECK(event_ != nullptr, "the runtime's event_create(", device, ", ", flags_,
                ") returned null: return the new event, or raise the driver's error");
    device_ = device;
  }
  TORCH_CHECK(device == device_, "Event device ", device_, " does not match the recording "
              "stream's device ", device, ": an event records on the device it was first "
              "recorded on");
  runtime().event_record(device, event_, stream);
}

void Event::block(int device, DriverStream stream) const {
  if (event_ != nullptr) runtime().stream_wait_event(device, stream, event_);
}

bool Event::query() const { return event_ == nullptr || runtime().event_query(event_); }

void Event::synchronize() const {
  if (event_ != nullptr) runtime().event_synchronize(event_);
}

std::shared_ptr<Event> mark(int device, DriverStream stream) {
  auto event = std::make_shared<Event>(Runtime::kEventDefault);
  event->record(device, stream);
  return event;
}

}  // namespace accelkit
