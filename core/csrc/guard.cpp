// The device guard for PrivateUse1: the CUDA model of a per-thread current device, a
// per-thread current stream per device (stream 0 is the default stream), new streams from a
// per-device counter, events that record a timestamp so torch.Event.elapsed_time works.
// Execution is synchronous (every runtime call completes before returning), so waiting on a
// stream or event returns at once after Runtime::synchronize; a vendor with asynchronous
// queues maps streams and events to the driver's (CUDA: cudaStreamCreate / cudaEventRecord /
// cudaStreamWaitEvent).
#include <accelkit/context.h>

#include "registry.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <vector>

namespace accelkit {
namespace {

struct Event {
  int device;
  bool timing;
  bool recorded = false;
  double time_ms = 0.0;
};

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

class GuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  static constexpr int kPoolSize = 32;

  c10::DeviceType type() const override { return kDeviceType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kDeviceType, current_index()}; }
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
                       current_streams()[index]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, {kDeviceType, resolve(d)});
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    static std::atomic<int64_t> next{0};
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, resolve(d)},
                       1 + (next++ % kPoolSize));
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    static std::atomic<int64_t> next{kPoolSize + 1};
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, resolve(d)}, next++);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const int index = resolve_index(s.device_index());
    const c10::Stream old = getStream(s.device());
    current_streams()[index] = s.id();
    return old;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }

  // Streams: work is synchronous, so a stream is always idle.
  bool queryStream(const c10::Stream& /*s*/) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override {
    runtime().synchronize(resolve_index(s.device_index()));
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    runtime().synchronize(resolve_index(index));
  }

  // Events: a timestamp taken when recorded.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(index == -1 || index == stream.device_index(), "Event device index ", index,
                " does not match recording stream's device index ", stream.device_index(), ".");
    auto* e = static_cast<Event*>(*event);
    if (e == nullptr) {
      e = new Event{stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT};
      *event = e;
    }
    runtime().synchronize(resolve_index(stream.device_index()));
    e->recorded = true;
    e->time_ms = now_ms();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void synchronizeEvent(void* /*event*/) const override {}
  void destroyEvent(void* event, const c10::DeviceIndex /*index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*index*/) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->timing && b->timing,
                "Both events must be created with argument 'enable_timing=True'.");
    return b->time_ms - a->time_ms;
  }

 private:
  static c10::DeviceIndex current_index() {
    return static_cast<c10::DeviceIndex>(current_device());
  }
  static c10::DeviceIndex resolve(c10::Device d) {
    return static_cast<c10::DeviceIndex>(resolve_index(d.index()));
  }
  // The per-thread current stream id of each device (0: the default stream).
  static std::vector<c10::StreamId>& current_streams() {
    thread_local std::vector<c10::StreamId> ids(device_count(), 0);
    return ids;
  }
};

}  // namespace

void detail::register_guard() {
  static c10::impl::DeviceGuardImplRegistrar registrar(kDeviceType, new GuardImpl());
}

}  // namespace accelkit
