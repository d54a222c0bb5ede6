// The device guard for PrivateUse1: the CUDA model of a per-thread current device and a
// per-thread current stream per device (stream 0 is the default stream), new streams from a
// per-device counter, and events (events.h) in stream order with timestamps for
// torch.Event.elapsed_time. Streams are c10 stream ids the runtime queues work by
// (Runtime::launch / copy_async); waiting on a stream or the device is the runtime's.
#include <accelkit/context.h>

#include "runtime/events.h"
#include "runtime/registry.h"
#include "testing/faults.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <memory>

namespace accelkit {
namespace {

// What a c10 event handle (void*) points to.
struct Event {
  int device;
  bool timing;
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

class GuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  static constexpr int kPoolSize = 32;

  c10::DeviceType type() const override { return kDeviceType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
#ifdef ACCELKIT_FAULTS
    if (faults::active("guard_keeps_new_device")) return getDevice();
#endif
    return old;
  }
  c10::Device getDevice() const override {
    return {kDeviceType, static_cast<c10::DeviceIndex>(current_device())};
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDeviceType, "expected a ", device_name(), " device, got ", d);
    set_current_device(d.has_index() ? d.index() : current_device());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index() && d.index() >= 0 && d.index() < device_count()) {
      set_current_device_unchecked(d.index());
    }
  }

  c10::Stream getStream(c10::Device d) const override {
    const int index = resolve_index(d.index());
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, static_cast<c10::DeviceIndex>(index)},
                       current_stream(index));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, {kDeviceType, resolve(d)});
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    static std::atomic<int64_t> next{0};
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, resolve(d)}, 1 + (next++ % kPoolSize));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    static std::atomic<int64_t> next{kPoolSize + 1};
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, resolve(d)}, next++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const int index = resolve_index(s.device_index());
    const c10::Stream old = getStream(s.device());
    set_current_stream(index, s.id());
    return old;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }

  bool queryStream(const c10::Stream& s) const override {
#ifdef ACCELKIT_FAULTS
    if (faults::active("stream_query_always_done")) return true;
#endif
    return runtime().stream_query(resolve_index(s.device_index()), s.id());
  }
  void synchronizeStream(const c10::Stream& s) const override {
    runtime().stream_synchronize(resolve_index(s.device_index()), s.id());
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    runtime().synchronize(resolve_index(index));
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(index == -1 || index == stream.device_index(), "Event device index ", index,
                " does not match recording stream's device index ", stream.device_index(), ".");
    auto* e = static_cast<Event*>(*event);
    if (e == nullptr) {
      e = new Event{stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT};
      *event = e;
    }
    c10::Stream on = stream;
#ifdef ACCELKIT_FAULTS
    if (faults::active("event_records_on_current_stream")) on = getStream(stream.device());
#endif
    e->state->record(resolve_index(on.device_index()), on.id());
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;  // never recorded: nothing to wait for
#ifdef ACCELKIT_FAULTS
    if (faults::active("wait_event_unordered")) return;
#endif
    static_cast<Event*>(event)->state->block(resolve_index(stream.device_index()), stream.id());
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || static_cast<Event*>(event)->state->query();
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) static_cast<Event*>(event)->state->synchronize();
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*index*/) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->state->recorded() && b->state->recorded(),
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->timing && b->timing,
                "Both events must be created with argument 'enable_timing=True'.");
    // As cudaEventElapsedTime: an event still queued is an error, never a wait (torch's
    // Event.elapsed_time calls this holding the GIL, which the work it would wait for may need).
    TORCH_CHECK(a->state->query() && b->state->query(),
                "Both events must be completed before calculating elapsed time.");
#ifdef ACCELKIT_FAULTS
    if (faults::active("elapsed_time_zero")) return 0.0;
#endif
    return b->state->time_ms() - a->state->time_ms();
  }

 private:
  static c10::DeviceIndex resolve(c10::Device d) {
    return static_cast<c10::DeviceIndex>(resolve_index(d.index()));
  }
};

}  // namespace

void detail::register_guard() {
  static c10::impl::DeviceGuardImplRegistrar registrar(kDeviceType, new GuardImpl());
}

}  // namespace accelkit
