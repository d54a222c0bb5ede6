// The device guard for PrivateUse1: the CUDA model of a per-thread current device and a
// per-thread current stream per device (stream 0 is the default stream), new streams from the
// per-device, per-priority pool of driver streams (streams.cpp, as c10/cuda/CUDAStream.cpp),
// and torch.Event as a driver event (events.h: Runtime::event_*), its timestamps the driver's.
#include <accelkit/context.h>

#include "runtime/events.h"
#include "runtime/registry.h"
#include "testing/faults.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>


namespace accelkit {
namespace {

class GuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
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
                       current_stream_id(index));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, {kDeviceType, resolve(d)});
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    const int index = resolve_index(d.index());
    const auto [least, greatest] = runtime().stream_priority_range(index);
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, static_cast<c10::DeviceIndex>(index)},
                       pool_stream(index, high_priority ? greatest : least));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    const int index = resolve_index(d.index());
    return c10::Stream(c10::Stream::UNSAFE, {kDeviceType, static_cast<c10::DeviceIndex>(index)},
                       pool_stream(index, priority));
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
    const int index = resolve_index(s.device_index());
    return runtime().stream_query(index, driver_stream(index, s.id()));
  }
  void synchronizeStream(const c10::Stream& s) const override {
    const int index = resolve_index(s.device_index());
    runtime().stream_synchronize(index, driver_stream(index, s.id()));
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
      // torch.Event(enable_timing=True) asks for BACKEND_DEFAULT (cudaEventDefault), else
      // PYTORCH_DEFAULT (cudaEventDisableTiming).
      e = new Event(flag == c10::EventFlag::BACKEND_DEFAULT ? Runtime::kEventTiming
                                                           : Runtime::kEventDefault);
      *event = e;
    }
    c10::Stream on = stream;
#ifdef ACCELKIT_FAULTS
    if (faults::active("event_records_on_current_stream")) on = getStream(stream.device());
#endif
    const int device = resolve_index(on.device_index());
    e->record(device, driver_stream(device, on.id()));
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;  // never recorded: nothing to wait for
#ifdef ACCELKIT_FAULTS
    if (faults::active("wait_event_unordered")) return;
#endif
    const int device = resolve_index(stream.device_index());
    static_cast<Event*>(event)->block(device, driver_stream(device, stream.id()));
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || static_cast<Event*>(event)->query();
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) static_cast<Event*>(event)->synchronize();
  }
  void destroyEvent(void* event, const c10::DeviceIndex /*index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*index*/) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded() && b->recorded(),
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->timing() && b->timing(),
                "Both events must be created with argument 'enable_timing=True'.");
    TORCH_CHECK(a->device() == b->device(), "Both events must be recorded on the same device "
                "to calculate elapsed time (got ", device_name(), ":", a->device(), " and ",
                device_name(), ":", b->device(), ").");
    // As cudaEventElapsedTime: an event still queued is an error, never a wait (torch's
    // Event.elapsed_time calls this holding the GIL, which the work it would wait for may need).
    TORCH_CHECK(a->query() && b->query(),
                "Both events must be completed before calculating elapsed time.");
#ifdef ACCELKIT_FAULTS
    if (faults::active("elapsed_time_zero")) return 0.0;
#endif
    return runtime().event_elapsed_ms(a->handle(), b->handle());
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
