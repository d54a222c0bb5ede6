// Private: the device allocator and the pinned-memory allocator.
//
// Every byte a device tensor owns is counted here: memory from Runtime::allocate, and host
// buffers adopted from CPU kernels by the zero-copy fallback (adopt()). Going over
// Runtime::capacity raises torch.OutOfMemoryError with CUDA's wording (requested, allocated,
// capacity). It is a c10::DeviceAllocator, so torch.accelerator.memory_* read its stats.
#pragma once

#include <accelkit/context.h>

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace accelkit {

// "1.50 MiB"
std::string format_size(uint64_t bytes);

class DeviceAllocator final : public c10::DeviceAllocator {
 public:
  // What a DataPtr's context points to: the block, and for adopted host buffers the CPU
  // storage that owns the bytes (kept alive while the device tensor lives).
  struct Block {
    void* data;
    size_t nbytes;
    int device;
    c10::intrusive_ptr<c10::StorageImpl> owner;
  };

  c10::DataPtr allocate(size_t nbytes) override;

  // Wrap host bytes owned by a CPU storage as device memory of `device` without copying
  // (the zero-copy fallback's outputs); counted in the stats like an allocation.
  c10::DataPtr adopt(c10::intrusive_ptr<c10::StorageImpl> owner, int device);

  // The context is a Block, not the data pointer: raw allocation through a plain deleter is
  // impossible (torch then falls back to allocate()).
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return accelkit::initialized(); }
  void emptyCache(c10::MempoolId_t pool) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // (free, total) bytes, as torch.cuda.mem_get_info.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // The device whose memory holds `ptr` (anywhere inside a live block), or -1.
  int device_of(const void* ptr);

  static DeviceAllocator& get();

 private:
  struct Stats {
    std::mutex mutex;
    c10::CachingAllocator::Stat allocation;
    c10::CachingAllocator::Stat bytes;
    int64_t num_ooms = 0;
    std::map<const void*, size_t> blocks;  // live blocks, for device_of()
  };

  DeviceAllocator();
  Stats& stats(int device) { return *stats_.at(device); }
  size_t capacity(int device);
  void reserve(int device, size_t nbytes, const void* data);
  void track(int device, const void* data, size_t nbytes);
  void unreserve(int device, size_t nbytes, const void* data);
  [[noreturn]] void raise_oom(int device, size_t nbytes, const std::string& why);
  static void delete_block(void* ctx);

  std::vector<std::unique_ptr<Stats>> stats_;
  std::vector<size_t> capacity_;
};

// Host memory for pin_memory(): Runtime::allocate_pinned, remembered so isPinnedPtr answers.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  // True for a pointer anywhere inside a pinned block (views, storage offsets).
  static bool is_pinned(const void* ptr);
  static PinnedAllocator& get();

 private:
  static void release(void* ptr);
};

}  // namespace accelkit
