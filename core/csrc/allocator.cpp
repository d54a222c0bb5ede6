// The device allocator with per-device capacity and CUDA-style statistics, and the pinned
// host allocator. Not a caching allocator: every allocation goes to the runtime.
#include "allocator.h"

#include <c10/util/Exception.h>

#include <cstdio>

namespace accelkit {

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

DeviceAllocator::DeviceAllocator() : stats_(device_count()), capacity_(device_count(), 0) {
  for (auto& s : stats_) s = std::make_unique<Stats>();
}

DeviceAllocator& DeviceAllocator::get() {
  static DeviceAllocator* instance = new DeviceAllocator();  // leaked: outlives all tensors
  return *instance;
}

c10::DataPtr DeviceAllocator::allocate(size_t nbytes) {
  const int device = current_device();
  mark_initialized();
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

c10::DataPtr DeviceAllocator::adopt(c10::intrusive_ptr<c10::StorageImpl> owner, int device) {
  const size_t nbytes = owner->nbytes();
  void* data = owner->mutable_data();
  if (nbytes == 0) return {data, nullptr, &delete_block, c10::Device(kDeviceType, device)};
  reserve(device, nbytes, data);
  auto* block = new Block{data, nbytes, device, std::move(owner)};
  return {data, block, &delete_block, c10::Device(kDeviceType, device)};
}

void DeviceAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  runtime().copy(dest, current_device(), src, current_device(), count);
}

void DeviceAllocator::emptyCache(c10::MempoolId_t /*pool*/) {}
void DeviceAllocator::recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) {}

c10::CachingDeviceAllocator::DeviceStats DeviceAllocator::getDeviceStats(
    c10::DeviceIndex device) {
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

void DeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  auto& s = stats(resolve_index(device));
  std::lock_guard<std::mutex> lock(s.mutex);
  s.allocation.reset_accumulated();
  s.bytes.reset_accumulated();
  s.num_ooms = 0;
}

void DeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  auto& s = stats(resolve_index(device));
  std::lock_guard<std::mutex> lock(s.mutex);
  s.allocation.reset_peak();
  s.bytes.reset_peak();
}

std::pair<size_t, size_t> DeviceAllocator::getMemoryInfo(c10::DeviceIndex device) {
  const int index = resolve_index(device);
  auto& s = stats(index);
  std::lock_guard<std::mutex> lock(s.mutex);
  const size_t total = capacity(index);
  return {total - static_cast<size_t>(s.bytes.current), total};
}

int DeviceAllocator::device_of(const void* ptr) {
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

size_t DeviceAllocator::capacity(int device) {
  if (capacity_[device] == 0) capacity_[device] = runtime().capacity(device);
  return capacity_[device];
}

// Count `nbytes` on `device` (and track `data` if known), or raise OutOfMemoryError.
void DeviceAllocator::reserve(int device, size_t nbytes, const void* data) {
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

void DeviceAllocator::track(int device, const void* data, size_t nbytes) {
  auto& s = stats(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.blocks.emplace(data, nbytes);
}

void DeviceAllocator::unreserve(int device, size_t nbytes, const void* data) {
  auto& s = stats(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.bytes.decrease(nbytes);
  s.allocation.decrease(1);
  if (data != nullptr) s.blocks.erase(data);
}

void DeviceAllocator::raise_oom(int device, size_t nbytes, const std::string& why) {
  size_t allocated = 0;
  {
    auto& s = stats(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    allocated = static_cast<size_t>(s.bytes.current);
  }
  const size_t total = capacity(device);
  const size_t free = total > allocated ? total - allocated : 0;
  TORCH_CHECK_WITH(OutOfMemoryError, false, device_name(), " out of memory. Tried to allocate ",
                   format_size(nbytes), ". Device ", device, " has a total capacity of ",
                   format_size(total), " of which ", format_size(free),
                   " is free. Of the allocated memory ", format_size(allocated),
                   " is allocated by PyTorch. ", why.empty() ? "" : why + ". ",
                   runtime().capacity_hint());
}

void DeviceAllocator::delete_block(void* ctx) {
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
