// Device allocator with per-device capacity and CUDA-style statistics (issue #4).
//
// Every byte a device tensor owns is counted here: memory from Runtime::allocate, and host
// buffers adopted from CPU kernels by the zero-copy fallback (adopt()). Going over
// Runtime::capacity raises torch.OutOfMemoryError with CUDA's wording (requested, allocated,
// capacity). It is a c10::DeviceAllocator, so torch.accelerator.memory_* read its stats.
// Not a caching allocator: every allocation goes to the runtime (a vendor with slow
// cudaMalloc-like calls would add a cache here).
#pragma once

#include <accelkit/context.h>

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace accelkit {

inline std::string format_size(uint64_t bytes) {
  char buf[64];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof(buf), "%llu bytes", static_cast<unsigned long long>(bytes));
  } else if (bytes < (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f KiB", bytes / 1024.0);
  } else if (bytes < (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / 1073741824.0);
  }
  return buf;
}

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

  c10::DataPtr allocate(size_t nbytes) override {
    const int device = current_device();
    initialized_flag() = true;
    if (nbytes == 0) return {nullptr, nullptr, &delete_block, c10::Device(kDeviceType, device)};
    reserve(device, nbytes, nullptr);
    void* data = runtime().allocate(device, nbytes);
    if (data == nullptr) {
      unreserve(device, nbytes, nullptr);
      raise_oom(device, nbytes, "the driver refused the allocation");
    }
    track(device, data, nbytes);
    auto* block = new Block{data, nbytes, device, {}};
    return {data, block, &delete_block, c10::Device(kDeviceType, device)};
  }

  // Wrap host bytes owned by a CPU storage as device memory of `device` without copying
  // (the zero-copy fallback's outputs); counted in the stats like an allocation.
  c10::DataPtr adopt(c10::intrusive_ptr<c10::StorageImpl> owner, int device) {
    const size_t nbytes = owner->nbytes();
    void* data = owner->mutable_data();
    if (nbytes == 0) return {data, nullptr, &delete_block, c10::Device(kDeviceType, device)};
    reserve(device, nbytes, data);
    auto* block = new Block{data, nbytes, device, std::move(owner)};
    return {data, block, &delete_block, c10::Device(kDeviceType, device)};
  }

  // The context is a Block, not the data pointer: raw allocation through a plain deleter is
  // impossible (torch then falls back to allocate()).
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    runtime().copy(dest, current_device(), src, current_device(), count);
  }

  bool initialized() override { return initialized_flag(); }
  void emptyCache(c10::MempoolId_t /*pool*/) override {}
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    auto& s = stats(resolve_index(device));
    std::lock_guard<std::mutex> lock(s.mutex);
    c10::CachingDeviceAllocator::DeviceStats out;
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out.allocation[agg] = s.allocation;
    out.segment[agg] = s.allocation;
    out.active[agg] = s.allocation;
    out.allocated_bytes[agg] = s.bytes;
    out.reserved_bytes[agg] = s.bytes;
    out.active_bytes[agg] = s.bytes;
    out.requested_bytes[agg] = s.bytes;
    out.num_ooms = s.num_ooms;
    out.num_device_alloc = s.allocation.allocated;
    out.num_device_free = s.allocation.freed;
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    auto& s = stats(resolve_index(device));
    std::lock_guard<std::mutex> lock(s.mutex);
    s.allocation.reset_accumulated();
    s.bytes.reset_accumulated();
    s.num_ooms = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    auto& s = stats(resolve_index(device));
    std::lock_guard<std::mutex> lock(s.mutex);
    s.allocation.reset_peak();
    s.bytes.reset_peak();
  }

  // (free, total) bytes, as torch.cuda.mem_get_info.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    const int index = resolve_index(device);
    auto& s = stats(index);
    std::lock_guard<std::mutex> lock(s.mutex);
    const size_t total = capacity(index);
    return {total - static_cast<size_t>(s.bytes.current), total};
  }

  // The device whose memory holds `ptr` (anywhere inside a live block), or -1.
  int device_of(const void* ptr) {
    for (int d = 0; d < static_cast<int>(stats_.size()); ++d) {
      auto& s = stats(d);
      std::lock_guard<std::mutex> lock(s.mutex);
      auto it = s.blocks.upper_bound(ptr);
      if (it == s.blocks.begin()) continue;
      --it;
      if (static_cast<const char*>(ptr) < static_cast<const char*>(it->first) + it->second) {
        return d;
      }
    }
    return -1;
  }

  static DeviceAllocator& get() {
    static DeviceAllocator* instance = new DeviceAllocator();  // leaked: outlives all tensors
    return *instance;
  }

 private:
  struct Stats {
    std::mutex mutex;
    c10::CachingAllocator::Stat allocation;
    c10::CachingAllocator::Stat bytes;
    int64_t num_ooms = 0;
    std::map<const void*, size_t> blocks;  // live blocks, for device_of()
  };

  DeviceAllocator() : stats_(device_count()), capacity_(device_count(), 0) {
    for (auto& s : stats_) s = std::make_unique<Stats>();
  }

  Stats& stats(int device) { return *stats_.at(device); }

  size_t capacity(int device) {
    if (capacity_[device] == 0) capacity_[device] = runtime().capacity(device);
    return capacity_[device];
  }

  // Count `nbytes` on `device` (and track `data` if known), or raise OutOfMemoryError.
  void reserve(int device, size_t nbytes, const void* data) {
    auto& s = stats(device);
    const size_t total = capacity(device);
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (static_cast<size_t>(s.bytes.current) + nbytes <= total) {
        s.bytes.increase(nbytes);
        s.allocation.increase(1);
        if (data != nullptr) s.blocks.emplace(data, nbytes);
        return;
      }
      s.num_ooms += 1;
    }
    raise_oom(device, nbytes, "");
  }

  void track(int device, const void* data, size_t nbytes) {
    auto& s = stats(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    s.blocks.emplace(data, nbytes);
  }

  void unreserve(int device, size_t nbytes, const void* data) {
    auto& s = stats(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    s.bytes.decrease(nbytes);
    s.allocation.decrease(1);
    if (data != nullptr) s.blocks.erase(data);
  }

  [[noreturn]] void raise_oom(int device, size_t nbytes, const std::string& why) {
    size_t allocated = 0;
    {
      auto& s = stats(device);
      std::lock_guard<std::mutex> lock(s.mutex);
      allocated = static_cast<size_t>(s.bytes.current);
    }
    const size_t total = capacity(device);
    const size_t free = total > allocated ? total - allocated : 0;
    TORCH_CHECK_WITH(OutOfMemoryError, false, device_name(),
                     " out of memory. Tried to allocate ", format_size(nbytes), ". Device ",
                     device, " has a total capacity of ", format_size(total), " of which ",
                     format_size(free), " is free. Of the allocated memory ",
                     format_size(allocated), " is allocated by PyTorch. ",
                     why.empty() ? "" : why + ". ", runtime().capacity_hint());
  }

  static void delete_block(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    if (block == nullptr) return;
    if (block->owner) {
      block->owner.reset();
    } else {
      runtime().release(block->device, block->data);
    }
    get().unreserve(block->device, block->nbytes, block->data);
    delete block;
  }

  std::vector<std::unique_ptr<Stats>> stats_;
  std::vector<size_t> capacity_;
};

// Host memory for pin_memory(): Runtime::allocate_pinned, remembered so isPinnedPtr answers.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    void* data = runtime().allocate_pinned(nbytes);
    TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr, device_name(),
                     " out of memory: cannot pin ", format_size(nbytes), " of host memory");
    {
      std::lock_guard<std::mutex> lock(mutex());
      blocks()[data] = nbytes;
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // True for a pointer anywhere inside a pinned block (views, storage offsets).
  static bool is_pinned(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& map = blocks();
    auto it = map.upper_bound(ptr);
    if (it == map.begin()) return false;
    --it;
    return static_cast<const char*>(ptr) < static_cast<const char*>(it->first) + it->second;
  }

  static PinnedAllocator& get() {
    static PinnedAllocator* instance = new PinnedAllocator();
    return *instance;
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<const void*, size_t>& blocks() {
    static std::map<const void*, size_t> m;
    return m;
  }
  static void release(void* ptr) {
    if (ptr == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mutex());
      blocks().erase(ptr);
    }
    runtime().release_pinned(ptr);
  }
};

}  // namespace accelkit
