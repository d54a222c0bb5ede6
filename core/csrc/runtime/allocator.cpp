// The caching device allocator and the pinned host allocator (allocator.h).
#include "runtime/allocator.h"

#include "runtime/events.h"
#include "testing/faults.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <tuple>

namespace accelkit {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSmallRound = 512;       // requests below 1 MiB: multiples of 512 bytes
constexpr size_t kLargeRound = 2 * kMiB;  // from 1 MiB: multiples of 2 MiB (a device's page)

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t rounded(size_t nbytes) {
  return nbytes < kMiB ? round_up(nbytes, kSmallRound) : round_up(nbytes, kLargeRound);
}

// A cached block may serve a request if it wastes at most 1 MiB or half of itself.
bool fits(size_t block, size_t request) {
  return block >= request && (block - request <= kMiB || block < 2 * request);
}

}  // namespace

std::string format_size(uint64_t bytes) {
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

bool DeviceAllocator::BySize::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->data) < std::tie(b->stream, b->size, b->data);
}

DeviceAllocator::DeviceAllocator() : devices_(device_count()), capacity_(device_count(), 0) {
  for (auto& d : devices_) d = std::make_unique<Device>();
}

DeviceAllocator& DeviceAllocator::get() {
  static auto* instance = new DeviceAllocator();  // leaked: outlives every tensor
  return *instance;
}

size_t DeviceAllocator::capacity(int device) {
  if (capacity_[device] == 0) capacity_[device] = runtime().capacity(device);
  return capacity_[device];
}

c10::DataPtr DeviceAllocator::allocate(size_t nbytes) {
  const int device = current_device();
  mark_initialized();
  const c10::Device where(kDeviceType, static_cast<c10::DeviceIndex>(device));
  if (nbytes == 0) return {nullptr, nullptr, &delete_block, where};
  const DriverStream stream = current_stream(device);
  const size_t size = rounded(nbytes);
  Device& d = state(device);
  Block* block = nullptr;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    collect_freed(d);
    block = take_cached(d, stream, size);
    if (block == nullptr) block = new_segment(d, device, size, why);
    if (block == nullptr && d.cached.empty() && d.freeing.empty()) {
      d.num_ooms += 1;
      raise_oom(d, device, nbytes, why);
    }
  }
  if (block == nullptr) {  // the cache stands in the way: give it back and try once more
    const uint64_t settled = settle(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    d.num_alloc_retries += 1;
    release_cached(d, device, settled);
    block = new_segment(d, device, size, why);
    if (block == nullptr) {
      d.num_ooms += 1;
      raise_oom(d, device, nbytes, why);
    }
  }
  std::lock_guard<std::mutex> lock(d.mutex);
  block->requested = nbytes;
  block->stream = stream;
  count_allocated(d, *block);
  return {block->data, block, &delete_block, where};
}

uint64_t DeviceAllocator::settle(int device) {
  Device& d = state(device);
  uint64_t settled = 0;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    settled = d.frees;
  }
  if (runtime().async()) runtime().synchronize(device);
  return settled;
}

DeviceAllocator::Block* DeviceAllocator::take_cached(Device& d, DriverStream stream, size_t size) {
  Block probe;
  probe.stream = stream;
  probe.size = size;
  auto it = d.cached.lower_bound(&probe);
  if (it == d.cached.end() || (*it)->stream != stream || !fits((*it)->size, size)) return nullptr;
  Block* block = *it;
  d.cached.erase(it);
  return block;
}

DeviceAllocator::Block* DeviceAllocator::new_segment(Device& d, int device, size_t size,
                                                     std::string& why) {
  if (static_cast<size_t>(d.reserved_bytes.current) + size > capacity(device)) {
    why = "";
    return nullptr;
  }
  void* data = runtime().allocate(device, size);
  if (data == nullptr) {
    why = "the driver refused the allocation";
    return nullptr;
  }
  auto* block = new Block();
  block->data = data;
  block->size = size;
  block->device = device;
  d.segments.emplace(data, block);
  d.reserved_bytes.increase(size);
  d.segment.increase(1);
  d.num_device_alloc += 1;
  return block;
}

void DeviceAllocator::count_allocated(Device& d, const Block& b) {
  d.allocation.increase(1);
  d.active.increase(1);
  d.allocated_bytes.increase(b.size);
  d.active_bytes.increase(b.size);
  d.requested_bytes.increase(b.requested);
}

// Blocks other streams used become reusable once those streams passed the free.
void DeviceAllocator::collect_freed(Device& d) {
  for (size_t i = 0; i < d.freeing.size();) {
    Block* block = d.freeing[i];
    bool done = true;
    for (const auto& event : block->pending) done = done && event->query();
    if (!done) {
      ++i;
      continue;
    }
    block->pending.clear();
    d.active.decrease(1);
    d.active_bytes.decrease(block->size);
    d.cached.insert(block);
    d.freeing[i] = d.freeing.back();
    d.freeing.pop_back();
  }
}

// Caller settled the device first (queued work may still use cached blocks: stream-ordered
// reuse), so the streams of every block freed before the settle are past it. A block freed
// since (by another thread, while this one waited without the lock) is left cached.
void DeviceAllocator::release_cached(Device& d, int device, uint64_t settled) {
  collect_freed(d);
  for (auto it = d.cached.begin(); it != d.cached.end();) {
    Block* block = *it;
    if (block->freed_at > settled) {
      ++it;
      continue;
    }
    runtime().release(device, block->data);
    d.segments.erase(block->data);
    d.reserved_bytes.decrease(block->size);
    d.segment.decrease(1);
    d.num_device_free += 1;
    delete block;
    it = d.cached.erase(it);
  }
}

c10::DataPtr DeviceAllocator::adopt(c10::intrusive_ptr<c10::StorageImpl> owner, int device) {
  const size_t nbytes = owner->nbytes();
  void* data = owner->mutable_data();
  const c10::Device where(kDeviceType, static_cast<c10::DeviceIndex>(device));
  if (nbytes == 0) return {data, nullptr, &delete_block, where};
  Device& d = state(device);
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    full = static_cast<size_t>(d.reserved_bytes.current) + nbytes > capacity(device);
  }
  const uint64_t settled = full ? settle(device) : 0;
  std::lock_guard<std::mutex> lock(d.mutex);
  if (static_cast<size_t>(d.reserved_bytes.current) + nbytes > capacity(device)) {
    d.num_alloc_retries += 1;
    release_cached(d, device, settled);
    if (static_cast<size_t>(d.reserved_bytes.current) + nbytes > capacity(device)) {
      d.num_ooms += 1;
      raise_oom(d, device, nbytes, "");
    }
  }
  auto* block = new Block();
  block->data = data;
  block->size = nbytes;
  block->requested = nbytes;
  block->device = device;
  block->stream = current_stream(device);  // queued work on it reads the buffer: see free_block
  block->owner = std::move(owner);
  d.segments.emplace(data, block);
  d.reserved_bytes.increase(nbytes);
  d.segment.increase(1);
  count_allocated(d, *block);
  return {data, block, &delete_block, where};
}

void DeviceAllocator::free_block(Block* block) {
  Device& d = state(block->device);
  c10::intrusive_ptr<c10::StorageImpl> owner;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.allocation.decrease(1);
    d.allocated_bytes.decrease(block->size);
    d.requested_bytes.decrease(block->requested);
    block->freed_at = ++d.frees;
    if (block->owner) {  // adopted: back to its CPU storage, once queued work is past it
      owner = std::move(block->owner);
      if (runtime().async()) {
        const int device = block->device;
        block->used_by.insert(block->stream);
        for (DriverStream stream : block->used_by) {
          runtime().launch(device, stream, "free", [owner] {});
        }
      }
      d.segments.erase(block->data);
      d.reserved_bytes.decrease(block->size);
      d.segment.decrease(1);
      d.active.decrease(1);
      d.active_bytes.decrease(block->size);
      delete block;
    } else if (!block->used_by.empty() && runtime().async()) {
      for (DriverStream stream : block->used_by) block->pending.push_back(mark(block->device, stream));
      block->used_by.clear();
      d.freeing.push_back(block);
    } else {
      block->used_by.clear();
      d.active.decrease(1);
      d.active_bytes.decrease(block->size);
      d.cached.insert(block);
    }
  }
  owner.reset();  // outside the lock: may free CPU memory
}

void DeviceAllocator::delete_block(void* ctx) {
  if (ctx != nullptr) get().free_block(static_cast<Block*>(ctx));
}

void DeviceAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  runtime().copy(dest, current_device(), src, current_device(), count);
}

void DeviceAllocator::emptyCache(c10::MempoolId_t /*pool*/) {
  for (int device = 0; device < static_cast<int>(devices_.size()); ++device) {
    const uint64_t settled = settle(device);  // outside the lock: other threads run meanwhile
    Device& d = state(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    release_cached(d, device, settled);
  }
}

void DeviceAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
#ifdef ACCELKIT_FAULTS
  if (faults::active("record_stream_ignored")) return;
#endif
  auto* block = static_cast<Block*>(ptr.get_context());
  if (block == nullptr || ptr.get_deleter() != &delete_block) return;  // adopted ones too
  const DriverStream used = driver_stream(block->device, stream.id());
  if (used == block->stream) return;
  Device& d = state(block->device);
  std::lock_guard<std::mutex> lock(d.mutex);
  block->used_by.insert(used);
}

c10::CachingDeviceAllocator::DeviceStats DeviceAllocator::getDeviceStats(
    c10::DeviceIndex device) {
  Device& d = state(resolve_index(device));
  std::lock_guard<std::mutex> lock(d.mutex);
  collect_freed(d);
  c10::CachingDeviceAllocator::DeviceStats out;
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  out.allocation[agg] = d.allocation;
  out.segment[agg] = d.segment;
  out.active[agg] = d.active;
  out.allocated_bytes[agg] = d.allocated_bytes;
  out.reserved_bytes[agg] = d.reserved_bytes;
  out.active_bytes[agg] = d.active_bytes;
  out.requested_bytes[agg] = d.requested_bytes;
  out.num_ooms = d.num_ooms;
  out.num_alloc_retries = d.num_alloc_retries;
  out.num_device_alloc = d.num_device_alloc;
  out.num_device_free = d.num_device_free;
  return out;
}

void DeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  Device& d = state(resolve_index(device));
  std::lock_guard<std::mutex> lock(d.mutex);
  for (Stat* s : {&d.allocation, &d.segment, &d.active, &d.allocated_bytes, &d.reserved_bytes,
                  &d.active_bytes, &d.requested_bytes}) {
    s->reset_accumulated();
  }
  d.num_ooms = d.num_alloc_retries = d.num_device_alloc = d.num_device_free = 0;
}

void DeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  Device& d = state(resolve_index(device));
  std::lock_guard<std::mutex> lock(d.mutex);
  for (Stat* s : {&d.allocation, &d.segment, &d.active, &d.allocated_bytes, &d.reserved_bytes,
                  &d.active_bytes, &d.requested_bytes}) {
    s->reset_peak();
  }
}

std::pair<size_t, size_t> DeviceAllocator::getMemoryInfo(c10::DeviceIndex device) {
  const int index = resolve_index(device);
  Device& d = state(index);
  std::lock_guard<std::mutex> lock(d.mutex);
  const size_t total = capacity(index);
  return {total - static_cast<size_t>(d.reserved_bytes.current), total};
}

int DeviceAllocator::device_of(const void* ptr) {
  for (int device = 0; device < static_cast<int>(devices_.size()); ++device) {
    Device& d = state(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    auto it = d.segments.upper_bound(ptr);
    if (it == d.segments.begin()) continue;
    --it;
    if (static_cast<const char*>(ptr) < static_cast<const char*>(it->first) + it->second->size) {
      return device;
    }
  }
  return -1;
}

void DeviceAllocator::raise_oom(Device& d, int device, size_t nbytes, const std::string& why) {
  const size_t total = capacity(device);
  const size_t reserved = static_cast<size_t>(d.reserved_bytes.current);
  const size_t allocated = static_cast<size_t>(d.allocated_bytes.current);
  const size_t free = total > reserved ? total - reserved : 0;
  TORCH_CHECK_WITH(OutOfMemoryError, false, device_name(), " out of memory. Tried to allocate ",
                   format_size(nbytes), ". Device ", device, " has a total capacity of ",
                   format_size(total), " of which ", format_size(free),
                   " is free. Of the allocated memory ", format_size(allocated),
                   " is allocated by PyTorch, and ", format_size(reserved - allocated),
                   " is reserved by PyTorch but unallocated. ",
                   why.empty() ? "" : why + ". ", runtime().capacity_hint());
}

namespace {
std::mutex& pinned_mutex() {
  static std::mutex m;
  return m;
}
std::map<const void*, size_t>& pinned_blocks() {
  static auto* m = new std::map<const void*, size_t>();
  return *m;
}
}  // namespace

c10::DataPtr PinnedAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
  void* data = runtime().allocate_pinned(nbytes);
  TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr, device_name(),
                   " out of memory: cannot pin ", format_size(nbytes), " of host memory");
  {
    std::lock_guard<std::mutex> lock(pinned_mutex());
    pinned_blocks()[data] = nbytes;
  }
  return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
}

bool PinnedAllocator::is_pinned(const void* ptr) {
  std::lock_guard<std::mutex> lock(pinned_mutex());
  auto& map = pinned_blocks();
  auto it = map.upper_bound(ptr);
  if (it == map.begin()) return false;
  --it;
  return static_cast<const char*>(ptr) < static_cast<const char*>(it->first) + it->second;
}

PinnedAllocator& PinnedAllocator::get() {
  static auto* instance = new PinnedAllocator();
  return *instance;
}

void PinnedAllocator::release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(pinned_mutex());
    pinned_blocks().erase(ptr);
  }
  runtime().release_pinned(ptr);
}

}  // namespace accelkit
