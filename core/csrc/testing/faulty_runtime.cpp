// The runtime faults of a fault build (faulty_runtime.h); empty unless -DACCELKIT_FAULTS.
#include "testing/faulty_runtime.h"

#ifdef ACCELKIT_FAULTS

#include "testing/faults.h"

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
  void launch(int device, int64_t stream, const char* what, std::function<void()> fn) override {
    inner_.launch(device, stream, what, std::move(fn));
  }
  void stream_wait(int device, int64_t stream, const char* what,
                   std::function<void(Resume)> when_ready) override {
    inner_.stream_wait(device, stream, what, std::move(when_ready));
  }
  void copy_async(void* dst, int dst_device, const void* src, int src_device, size_t nbytes,
                  int device, int64_t stream) override {
    inner_.copy_async(dst, dst_device, src, src_device,
                      copied_bytes(dst_device, src_device, nbytes), device, stream);
  }
  void stream_synchronize(int device, int64_t stream) override {
    inner_.stream_synchronize(device, stream);
  }
  bool stream_query(int device, int64_t stream) override {
    return inner_.stream_query(device, stream);
  }
  bool host_accessible() const noexcept override { return inner_.host_accessible(); }
  std::string capacity_hint() const override { return inner_.capacity_hint(); }
  std::string device_count_hint() const override { return inner_.device_count_hint(); }

 private:
  Runtime& inner_;
};

}  // namespace

Runtime& with_faults(Runtime& inner) { return *new FaultyRuntime(inner); }

}  // namespace accelkit::faults

#endif  // ACCELKIT_FAULTS
