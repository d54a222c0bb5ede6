// Private: the layer's events. `Event` is a driver event the layer owns (Runtime::event_*),
// created on the device of its first record: what a c10 event handle (torch.Event) points to,
// and how the allocator waits for streams to pass a free. `EventState` is the runtime's
// default event (Runtime::event_create when the driver has none of its own), built on
// Runtime::launch and Runtime::stream_wait: recording queues a marker on the stream that
// completes the event (and takes its timestamp) when the stream reaches it; a stream waits
// with stream_wait, resumed when the event completes (no thread blocks on the device side); the
// host waits on a condition variable. On a synchronous runtime the marker runs at once, so the
// same code gives CUDA's event semantics on any device. A marker the runtime drops unrun (the
// work queued after an asynchronous error) completes the event all the same: every wait on an
// event terminates.
#pragma once

#include <accelkit/runtime.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace accelkit {

class Event {
 public:
  explicit Event(unsigned flags) : flags_(flags) {}
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Record on (device, stream); the driver event is created by the first record, on `device`
  // (a later record on another device is an error naming both, as CUDA's).
  void record(int device, DriverStream stream);
  // (device, stream) waits for the latest record; nothing to wait for before the first.
  void block(int device, DriverStream stream) const;
  bool query() const;  // true before the first record
  void synchronize() const;
  bool recorded() const { return event_ != nullptr; }
  bool timing() const { return (flags_ & Runtime::kEventTiming) != 0; }
  int device() const { return device_; }
  DriverEvent handle() const { return event_; }

 private:
  unsigned flags_;
  int device_ = -1;
  DriverEvent event_ = nullptr;
};

// A new event completed when (device, stream) reaches this point (the allocator's frees wait
// on such events for the streams that used a block).
std::shared_ptr<Event> mark(int device, DriverStream stream);

class EventState : public std::enable_shared_from_this<EventState> {
 public:
  // Queue the event's completion on (device, stream) through `runtime`; returns the record's
  // number. The queued task keeps the event alive (it may be destroyed by its owner before the
  // stream gets there).
  uint64_t record(Runtime& runtime, int device, DriverStream stream);
  // (device, stream) waits for the latest record made before this call.
  void block(Runtime& runtime, int device, DriverStream stream);
  // Whether the latest record (at the time of the call) has completed.
  bool query();
  // Block the host until the latest record (at the time of the call) has completed.
  void synchronize();
  // Host clock (ms) when the latest completed record was reached on its stream.
  double time_ms();

 private:
  void complete(uint64_t n);
  void wait_for(uint64_t n);
  // Resume a stream's wait once record n has completed (at once if it has).
  void when_complete(uint64_t n, Runtime::Resume resume);

  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t recorded_ = 0;   // records issued
  uint64_t completed_ = 0;  // records their streams reached
  double time_ms_ = 0.0;
  std::vector<std::pair<uint64_t, Runtime::Resume>> waiters_;  // streams' waits, by record
};

}  // namespace accelkit
