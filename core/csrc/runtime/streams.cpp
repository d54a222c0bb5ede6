// The layer's streams (context.h): c10 stream ids mapped onto the runtime's driver streams as
// c10/cuda/CUDAStream.cpp maps them onto cudaStream_t. Per device: the default stream (id 0, the
// null DriverStream), a pool of kPoolSize streams per priority level created on first use
// (Runtime::stream_create) and handed out round-robin, never destroyed (c10 has no stream
// destruction: a program that makes a stream per step reuses the pool's), and the external
// streams callers registered. Looking up a pool stream is an array read: every launch does one.
#include <accelkit/context.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace accelkit {
namespace {

constexpr int kPoolSize = 32;
constexpr int kLevels = Runtime::kStreamPriorities;
constexpr int64_t kFirstPooled = 1;
constexpr int64_t kFirstExternal = kFirstPooled + int64_t{kLevels} * kPoolSize;

struct DeviceStreams {
  std::once_flag range_once;
  int least = 0;   // the runtime's lowest priority: level 0
  int levels = 1;  // priority levels in use, from `least` toward the greatest
  std::array<std::atomic<uint32_t>, kLevels> next{};
  std::array<std::array<std::atomic<DriverStream>, kPoolSize>, kLevels> pool{};
  std::mutex mutex;                          // creating pool streams; the external ones
  std::vector<DriverStream> external;        // id kFirstExternal + i
  std::map<DriverStream, int64_t> external_ids;
};

DeviceStreams& streams_of(int device) {
  static std::vector<std::unique_ptr<DeviceStreams>>* all = [] {
    auto* v = new std::vector<std::unique_ptr<DeviceStreams>>();  // lives as long as the process
    for (int i = 0; i < device_count(); ++i) v->push_back(std::make_unique<DeviceStreams>());
    return v;
  }();
  check_device_index(device);
  DeviceStreams& d = *all->at(device);
  std::call_once(d.range_once, [&] {
    const auto [least, greatest] = runtime().stream_priority_range(device);
    TORCH_CHECK(greatest <= least, "the runtime's stream_priority_range(", device, ") is {",
                least, ", ", greatest, "}: the greatest priority must be the lower number, as "
                "cudaDeviceGetStreamPriorityRange's");
    d.least = least;
    d.levels = std::min(kLevels, least - greatest + 1);
  });
  return d;
}

int level_of(const DeviceStreams& d, int priority) {
  return std::clamp(d.least - priority, 0, d.levels - 1);
}

DriverStream pooled(DeviceStreams& d, int device, int level, int index) {
  std::atomic<DriverStream>& slot = d.pool[level][index];
  DriverStream stream = slot.load(std::memory_order_acquire);
  if (stream != nullptr) return stream;
  std::lock_guard<std::mutex> lock(d.mutex);
  stream = slot.load(std::memory_order_relaxed);
  if (stream == nullptr) {
    stream = runtime().stream_create(device, d.least - level);
    TORCH_CHECK(stream != nullptr, "the runtime's stream_create(", device, ", ", d.least - level,
                ") returned a null stream (null is the default stream): return the new stream, "
                "or raise the driver's error");
    slot.store(stream, std::memory_order_release);
  }
  return stream;
}

std::vector<int64_t>& thread_streams() {
  thread_local std::vector<int64_t> ids(device_count(), 0);
  return ids;
}

}  // namespace

DriverStream current_stream(int device) {
  return driver_stream(device, thread_streams().at(device));
}

int64_t current_stream_id(int device) { return thread_streams().at(device); }

void set_current_stream(int device, int64_t id) {
  (void)driver_stream(device, id);  // a stream of this device, or the error naming it
  thread_streams().at(device) = id;
}

DriverStream driver_stream(int device, int64_t id) {
  if (id == 0) return nullptr;
  DeviceStreams& d = streams_of(device);
  if (id >= kFirstPooled && id < kFirstPooled + int64_t{d.levels} * kPoolSize) {
    const int64_t n = id - kFirstPooled;
    return pooled(d, device, static_cast<int>(n / kPoolSize), static_cast<int>(n % kPoolSize));
  }
  if (id >= kFirstExternal) {
    std::lock_guard<std::mutex> lock(d.mutex);
    const auto i = static_cast<size_t>(id - kFirstExternal);
    if (i < d.external.size()) return d.external[i];
  }
  TORCH_CHECK(false, "stream id ", id, " is not a stream of ", device_name(), ":", device,
              ": use the streams torch.", device_name(), ".Stream(), current_stream() and "
              "ExternalStream give (a stream id is valid only on the device it was made for)");
}

int64_t pool_stream(int device, int priority) {
  DeviceStreams& d = streams_of(device);
  const int level = level_of(d, priority);
  const int index = static_cast<int>(d.next[level]++ % kPoolSize);
  (void)pooled(d, device, level, index);
  return kFirstPooled + int64_t{level} * kPoolSize + index;
}

int64_t external_stream(int device, DriverStream stream) {
  TORCH_CHECK(stream != nullptr, "an external stream of ", device_name(), ":", device,
              " must be a stream the driver created, not null (the default stream: use "
              "torch.", device_name(), ".default_stream())");
  DeviceStreams& d = streams_of(device);
  std::lock_guard<std::mutex> lock(d.mutex);
  auto [it, fresh] = d.external_ids.emplace(stream, kFirstExternal + int64_t(d.external.size()));
  if (fresh) d.external.push_back(stream);
  return it->second;
}

int stream_priority(int device, int64_t id) {
  DeviceStreams& d = streams_of(device);
  if (id < kFirstPooled || id >= kFirstPooled + int64_t{d.levels} * kPoolSize) return 0;
  return d.least - static_cast<int>((id - kFirstPooled) / kPoolSize);
}

}  // namespace accelkit
