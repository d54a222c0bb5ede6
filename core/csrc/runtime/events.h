// Private: events in stream order, built on Runtime::launch. Recording queues a marker on the
// stream that completes the event (and takes its timestamp) when the stream reaches it; a
// stream waits with Runtime::stream_wait, resumed when the event completes (no thread blocks
// on the device side); the host waits on a condition variable. On a synchronous runtime the marker runs at once, so the same code gives
// CUDA's event semantics on any device. A marker the runtime drops unrun (the work queued after
// an asynchronous error) completes the event all the same: every wait on an event terminates.
#pragma once

#include <accelkit/runtime.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace accelkit {

class EventState : public std::enable_shared_from_this<EventState> {
 public:
  // Queue the event's completion on (device, stream); returns the record's number. The queued
  // task keeps the event alive (it may be destroyed by its owner before the stream gets there).
  uint64_t record(int device, int64_t stream);
  // (device, stream) waits for the latest record made before this call.
  void block(int device, int64_t stream);
  // Whether the latest record (at the time of the call) has completed.
  bool query();
  // Block the host until the latest record (at the time of the call) has completed.
  void synchronize();
  // Host clock (ms) when record `n` completed on its stream; recorded() false until then.
  bool recorded();
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

// A new event completed when (device, stream) reaches this point (the allocator's frees wait
// on such events for the streams that used a block).
std::shared_ptr<EventState> mark(int device, int64_t stream);

}  // namespace accelkit
