// Runtime's default streams and events (runtime.h), for a driver without objects of its own:
// streams are distinct handles that only name a queue (launch and the copies ignore them on a
// synchronous device), events are EventState markers queued with launch, stream waits tasks
// that block until resumed.
#include <accelkit/runtime.h>

#include "runtime/events.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace accelkit {
namespace {

// What a default DriverEvent points to: the state, which queued markers keep alive past
// event_destroy.
struct DefaultEvent {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

EventState& state_of(DriverEvent event) { return *static_cast<DefaultEvent*>(event)->state; }

}  // namespace

DriverStream Runtime::stream_create(int device, int priority) {
  (void)device, (void)priority;
  static std::atomic<uintptr_t> next{1};
  return reinterpret_cast<DriverStream>(next++);
}

void Runtime::stream_wait(int device, DriverStream stream, const char* what,
                          std::function<void(Resume)> when_ready) {
  launch(device, stream, what, [when_ready = std::move(when_ready)] {
    struct Latch {
      std::mutex mutex;
      std::condition_variable cv;
      bool done = false;
      std::exception_ptr error;
    };
    auto latch = std::make_shared<Latch>();
    when_ready([latch](std::exception_ptr error) {
      {
        std::lock_guard<std::mutex> lock(latch->mutex);
        latch->done = true;
        latch->error = error;
      }
      latch->cv.notify_all();
    });
    std::unique_lock<std::mutex> lock(latch->mutex);
    latch->cv.wait(lock, [&] { return latch->done; });
    if (latch->error) std::rethrow_exception(latch->error);
  });
}

DriverEvent Runtime::event_create(int device, unsigned flags) {
  (void)device, (void)flags;
  return new DefaultEvent();
}

void Runtime::event_destroy(int device, DriverEvent event) noexcept {
  (void)device;
  delete static_cast<DefaultEvent*>(event);
}

void Runtime::event_record(int device, DriverEvent event, DriverStream stream) {
  state_of(event).record(*this, device, stream);
}

void Runtime::stream_wait_event(int device, DriverStream stream, DriverEvent event) {
  state_of(event).block(*this, device, stream);
}

bool Runtime::event_query(DriverEvent event) { return state_of(event).query(); }

void Runtime::event_synchronize(DriverEvent event) { state_of(event).synchronize(); }

double Runtime::event_elapsed_ms(DriverEvent start, DriverEvent end) {
  return state_of(end).time_ms() - state_of(start).time_ms();
}

}  // namespace accelkit
