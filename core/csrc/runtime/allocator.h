// Private: the device's caching allocator and the pinned-memory allocator.
//
// CUDA's model (c10/cuda/CUDACachingAllocator.cpp), in simpler form: memory comes from
// Runtime::allocate in segments (requests rounded to 512 bytes, or to 2 MiB from 1 MiB up), one
// block per segment; a freed block is kept in its device's cache and reused for a later request
// of a similar size on the same stream, so allocation-heavy code does not pay a driver
// allocation per op. Stream-ordered like CUDA: a block is reused only on the stream it was
// allocated on, whose later work runs after the work that used it; a block that other streams
// used (Tensor.record_stream) is reused only once those streams have reached the point where it
// was freed. Statistics have torch.cuda.memory_stats' meaning (allocated: blocks in use;
// reserved: segments held, cached included; active, requested, segment, num_alloc_retries,
// num_ooms). Over the runtime's capacity, or when the runtime refuses, the cache is released and
// the allocation retried once; then torch.OutOfMemoryError says what was requested, allocated,
// reserved and the capacity.
//
// Host buffers a CPU kernel produced can be adopted as device memory without copying (the
// zero-copy fallback on host-accessible devices): they count as allocated and reserved while
// alive, and are returned to their CPU storage, not cached, once the work queued on their
// stream and on every stream that recorded them (record_stream) is past their free.
#pragma once

#include <accelkit/context.h>

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/StorageImpl.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace accelkit {

class Event;

// "1.50 MiB"
std::string format_size(uint64_t bytes);

class DeviceAllocator final : public c10::DeviceAllocator {
 public:
  // What a DataPtr's context points to.
  struct Block {
    void* data = nullptr;
    size_t size = 0;       // bytes held (the segment)
    size_t requested = 0;  // bytes asked for
    int device = 0;
    DriverStream stream = nullptr;       // allocated on (and reused only on) this stream
    std::set<DriverStream> used_by;      // other streams (record_stream)
    uint64_t freed_at = 0;               // free: the device's free count after its free
    std::vector<std::shared_ptr<Event>> pending;       // freed: those streams' progress
    c10::intrusive_ptr<c10::StorageImpl> owner;         // adopted: the CPU storage
  };

  c10::DataPtr allocate(size_t nbytes) override;

  // Wrap host bytes owned by a CPU storage as device memory of `device` without copying.
  c10::DataPtr adopt(c10::intrusive_ptr<c10::StorageImpl> owner, int device);

  // The context is a Block, not the data pointer: raw allocation through a plain deleter is
  // impossible (torch then falls back to allocate()).
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return accelkit::initialized(); }
  // Give every cached block back to the runtime (torch.<device>.empty_cache).
  void emptyCache(c10::MempoolId_t pool) override;
  // Tensor.record_stream: the block's memory is in use by `stream` too.
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // (free, total) bytes, as torch.cuda.mem_get_info: capacity minus reserved.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // The device whose memory holds `ptr` (anywhere inside a live or cached block), or -1.
  int device_of(const void* ptr);

  static DeviceAllocator& get();

 private:
  using Stat = c10::CachingAllocator::Stat;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct Device {
    std::mutex mutex;
    Stat allocation, segment, active, allocated_bytes, reserved_bytes, active_bytes,
        requested_bytes;
    int64_t num_ooms = 0, num_alloc_retries = 0, num_device_alloc = 0, num_device_free = 0;
    uint64_t frees = 0;                     // blocks freed so far (their freed_at)
    std::set<Block*, BySize> cached;        // free, reusable on their stream
    std::vector<Block*> freeing;            // free, waiting for other streams
    std::map<const void*, Block*> segments;  // every segment and adopted buffer
  };

  DeviceAllocator();
  Device& state(int device) { return *devices_.at(device); }
  size_t capacity(int device);
  Block* take_cached(Device& d, DriverStream stream, size_t size);
  // A fresh segment, or nullptr (why: "" over capacity, else the driver's refusal).
  Block* new_segment(Device& d, int device, size_t size, std::string& why);
  // Wait for the device's queued work (asynchronous runtimes), never holding a lock. Returns
  // the device's free count from before the wait: every block freed up to it is past its
  // streams' work once settle returns (release_cached's `settled`).
  uint64_t settle(int device);
  // Give back the cached blocks freed up to `settled` (caller holds d.mutex); a block another
  // thread freed after the settle may still be read by queued work and stays cached.
  void release_cached(Device& d, int device, uint64_t settled);
  void collect_freed(Device& d);               // caller holds d.mutex
  void count_allocated(Device& d, const Block& b);
  [[noreturn]] void raise_oom(Device& d, int device, size_t nbytes, const std::string& why);
  void free_block(Block* block);
  static void delete_block(void* ctx);

  std::vector<std::unique_ptr<Device>> devices_;
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
