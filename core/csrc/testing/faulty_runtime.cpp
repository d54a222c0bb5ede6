// The runtime faults of a fault build (faulty_runtime.h); empty unless -DACCELKIT_FAULTS.
#include "testing/faulty_runtime.h"

#ifdef ACCELKIT_FAULTS

#include "testing/faults.h"

#include <chrono>
#include <map>
#include <mutex>
#include <utility>

namespace accelkit::faults {
namespace {

constexpr size_t kHalfCopyAbove = size_t{1} << 20;

// The bytes a copy moves: of a device-to-host one, half of them above 1 MiB under
// copy_drops_half_above_1mib (a DMA descriptor sized in the wrong unit);
// under peer_copy_dropped none between two devices.
size_t copied_bytes(int dst_device, int src_device, size_t nbytes) {
  const bool to_host = dst_device == kHost && src_device != kHost;
  const bool peer = dst_device != kHost && src_device != kHost && dst_device != src_device;
  if (peer && active("peer_copy_dropped")) return 0;
  return to_host && nbytes > kHalfCopyAbove && active("copy_drops_half_above_1mib") ? nbytes / 2
                                                                                   : nbytes;
}

class FaultyRuntime final : public Runtime {
 public:
  explicit FaultyRuntime(Runtime& inner) : inner_(inner) {}

  int device_count() noexcept override { return inner_.device_count(); }
  void set_device(int device) override { inner_.set_device(device); }
  size_t capacity(int device) override { return inner_.capacity(device); }
  void* allocate(int device, size_t nbytes) override { return inner_.allocate(device, nbytes); }
  void release(int device, void* ptr) noexcept override { inner_.release(device, ptr); }
  void* allocate_pinned(size_t nbytes) override { return inner_.allocate_pinned(nbytes); }
  void release_pinned(void* ptr) noexcept override { inner_.release_pinned(ptr); }
  void copy(void* dst, int dst_device, const void* src, int src_device, size_t nbytes) override {
    inner_.copy(dst, dst_device, src, src_device, copied_bytes(dst_device, src_device, nbytes));
  }
  void synchronize(int device) override {
    if (active("synchronize_noop")) return;
    inner_.synchronize(device);
  }
  bool async() const noexcept override { return inner_.async(); }
  std::pair<int, int> stream_priority_range(int device) override {
    return inner_.stream_priority_range(device);
  }
  DriverStream stream_create(int device, int priority) override {
    // stream_priority_ignored: every stream at the lowest priority.
    if (active("stream_priority_ignored")) priority = inner_.stream_priority_range(device).first;
    return inner_.stream_create(device, priority);
  }
  void stream_destroy(int device, DriverStream stream) noexcept override {
    inner_.stream_destroy(device, stream);
  }
  void launch(int device, DriverStream stream, const char* what,
              std::function<void()> fn) override {
    inner_.launch(device, stream, what, std::move(fn));
  }
  void stream_wait(int device, DriverStream stream, const char* what,
                   std::function<void(Resume)> when_ready) override {
    inner_.stream_wait(device, stream, what, std::move(when_ready));
  }
  void copy_async(void* dst, int dst_device, const void* src, int src_device, size_t nbytes,
                  int device, DriverStream stream) override {
    inner_.copy_async(dst, dst_device, src, src_device,
                      copied_bytes(dst_device, src_device, nbytes), device, stream);
  }
  void stream_synchronize(int device, DriverStream stream) override {
    inner_.stream_synchronize(device, stream);
  }
  bool stream_query(int device, DriverStream stream) override {
    return inner_.stream_query(device, stream);
  }
  DriverEvent event_create(int device, unsigned flags) override {
    return inner_.event_create(device, flags);
  }
  void event_destroy(int device, DriverEvent event) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      issued_ms_.erase(event);
    }
    inner_.event_destroy(device, event);
  }
  void event_record(int device, DriverEvent event, DriverStream stream) override {
    {  // elapsed_time_host_clock: the host's time when the record is issued
      std::lock_guard<std::mutex> lock(mutex_);
      issued_ms_[event] = now_ms();
    }
    inner_.event_record(device, event, stream);
  }
  void stream_wait_event(int device, DriverStream stream, DriverEvent event) override {
    inner_.stream_wait_event(device, stream, event);
  }
  bool event_query(DriverEvent event) override { return inner_.event_query(event); }
  void event_synchronize(DriverEvent event) override { inner_.event_synchronize(event); }
  double event_elapsed_ms(DriverEvent start, DriverEvent end) override {
    if (active("elapsed_time_host_clock")) {
      std::lock_guard<std::mutex> lock(mutex_);
      return issued_ms_[end] - issued_ms_[start];
    }
    return inner_.event_elapsed_ms(start, end);
  }
  bool host_accessible() const noexcept override { return inner_.host_accessible(); }
  std::string capacity_hint() const override { return inner_.capacity_hint(); }
  std::string device_count_hint() const override { return inner_.device_count_hint(); }

 private:
  static double now_ms() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
  }

  Runtime& inner_;
  std::mutex mutex_;
  std::map<DriverEvent, double> issued_ms_;  // each event's latest record, as the host issued it
};

}  // namespace

Runtime& with_faults(Runtime& inner) { return *new FaultyRuntime(inner); }

}  // namespace accelkit::faults

#endif  // ACCELKIT_FAULTS
