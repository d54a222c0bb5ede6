// mockrt, the mock device's fake driver (mockrt.h): settings, memory, streams on the
// Scheduler's queues, events with timestamps, sticky errors. Nothing here knows PyTorch.
#include "mockrt.h"

#include "scheduler.h"

#include <sys/mman.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// What the C API's handles point to.
struct mockStream {
  int device;
  int priority;
  uint64_t serial;  // the scheduler's name for its queue (0: the default stream)
};

namespace mockrt {
namespace {

// The high address bit that marks discrete device memory: the CPU faults on such addresses
// (non-canonical on x86-64; above the 48/52-bit user space, below the ignored top byte, on
// AArch64).
#if defined(__aarch64__)
constexpr uintptr_t kDeviceTag = uintptr_t{1} << 55;
#else
constexpr uintptr_t kDeviceTag = uintptr_t{1} << 62;
#endif
constexpr size_t kLargePage = size_t{2} << 20;
constexpr int kWorkers = 4;  // threads that run the streams of all devices
constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -3;

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

// Parse "8GiB", "64MiB", "512M", "1000000" into bytes; returns false on anything else.
bool parse_bytes(const std::string& text, size_t& out) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t digits = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == digits) return false;
  char* end = nullptr;
  const std::string number = text.substr(digits, i - digits);
  const double value = std::strtod(number.c_str(), &end);
  if (end == nullptr || *end != '\0' || value < 0) return false;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += static_cast<char>(std::toupper(text[i]));
  }
  static const std::map<std::string, double> units = {
      {"", 1.0}, {"B", 1.0},
      {"K", 1024.0}, {"KIB", 1024.0}, {"KB", 1e3},
      {"M", 1048576.0}, {"MIB", 1048576.0}, {"MB", 1e6},
      {"G", 1073741824.0}, {"GIB", 1073741824.0}, {"GB", 1e9},
      {"T", 1099511627776.0}, {"TIB", 1099511627776.0}, {"TB", 1e12}};
  const auto it = units.find(unit);
  if (it == units.end()) return false;
  out = static_cast<size_t>(value * it->second);
  return true;
}

bool flag(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  return env == nullptr || *env == '\0' ? fallback : std::strcmp(env, "0") != 0;
}

// The hardware's shape and modes, read from the environment once (mockrt.h).
struct Config {
  int devices = 8;
  size_t capacity = size_t{8} << 30;
  bool host_accessible = true;
  bool async = false;
  bool launch_blocking = false;
  std::optional<uint64_t> seed;
  std::string error;  // invalid settings: every call fails with it

  Config() {
    // Under torchrun a host shows as many devices as it runs ranks, as a cluster node has
    // --nproc-per-node devices (torch's DTensor RNG tracker takes device rank % device_count()
    // as a rank's own, which is LOCAL_RANK's only then); ACCELKIT_MOCK_DEVICES overrides it.
    if (const char* local = std::getenv("LOCAL_WORLD_SIZE");
        local != nullptr && std::getenv("TORCHELASTIC_RUN_ID") != nullptr) {
      char* end = nullptr;
      const long n = std::strtol(local, &end, 10);
      if (end != local && *end == '\0' && n >= 1 && n <= 64) devices = static_cast<int>(n);
    }
    if (const char* env = std::getenv("ACCELKIT_MOCK_DEVICES")) {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      if (end == env || *end != '\0' || n < 0 || n > 64) {
        error = std::string("ACCELKIT_MOCK_DEVICES=") + env +
                " is not a device count: use an integer from 0 to 64, e.g. ACCELKIT_MOCK_DEVICES=8";
      } else {
        devices = static_cast<int>(n);
      }
    }
    if (const char* env = std::getenv("ACCELKIT_MOCK_MEMORY")) {
      if (!parse_bytes(env, capacity) || capacity == 0) {
        error = std::string("ACCELKIT_MOCK_MEMORY=") + env +
                " is not a memory size: use bytes with an optional unit, e.g. 8GiB, 512MiB, "
                "64MB or 1000000";
      }
    }
    host_accessible = flag("ACCELKIT_MOCK_HOST_ACCESSIBLE", true);
    async = flag("ACCELKIT_MOCK_ASYNC", false);
    launch_blocking = flag("ACCELKIT_MOCK_LAUNCH_BLOCKING", false);
    if (const char* env = std::getenv("ACCELKIT_MOCK_SCHEDULE");
        env != nullptr && *env != '\0' && std::strcmp(env, "off") != 0) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(env, &end, 10);
      if (end == env || *end != '\0' || *env == '-') {
        error = std::string("ACCELKIT_MOCK_SCHEDULE=") + env +
                " is not a seed: use a non-negative integer (e.g. ACCELKIT_MOCK_SCHEDULE=7), "
                "or off";
      } else if (!async) {
        error = std::string("ACCELKIT_MOCK_SCHEDULE=") + env +
                " orders the streams of the asynchronous mode: set ACCELKIT_MOCK_ASYNC=1 "
                "with it";
      } else {
        seed = n;
      }
    }
  }
};

// An event's records and their completion: queued records and waits keep it alive past
// mockEventDestroy.
struct EventState {
  int device = 0;
  unsigned flags = 0;
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records issued
  uint64_t completed = 0;  // records their streams reached
  double time_ms = 0.0;    // when the latest completed record was reached
  std::vector<std::pair<uint64_t, Scheduler::Resume>> waiters;  // streams' waits, by record

  void complete(uint64_t n) {
    std::vector<Scheduler::Resume> ready;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (n > completed) {
        completed = n;
        time_ms = now_ms();
      }
      for (auto it = waiters.begin(); it != waiters.end();) {
        if (it->first <= completed) {
          ready.push_back(std::move(it->second));
          it = waiters.erase(it);
        } else {
          ++it;
        }
      }
    }
    cv.notify_all();
    for (auto& resume : ready) resume();  // outside the lock: a resume runs the scheduler
  }

  void when_complete(uint64_t n, Scheduler::Resume resume) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (completed < n) {
        waiters.emplace_back(n, std::move(resume));
        return;
      }
    }
    resume();
  }
};

}  // namespace
}  // namespace mockrt

struct mockEvent {
  std::shared_ptr<mockrt::EventState> state;
};

struct mockWait {
  std::function<void(const char*)> resume;  // with the error, or nullptr
};

namespace mockrt {
namespace {

thread_local int current_device = 0;
thread_local std::string error_message;

mockError_t fail(mockError_t code, std::string message) {
  error_message = std::move(message);
  return code;
}

std::string failed(const std::string& what, int device, const char* why) {
  return what + " failed on device " + std::to_string(device) + ": " + why;
}

// The driver: one per process, alive as long as it (its worker threads use it to the end).
class Driver {
 public:
  const Config config;

  Driver() {
    if (config.async && config.error.empty()) {
      scheduler_ = std::make_unique<Scheduler>(config.seed ? 1 : kWorkers, config.seed);
    }
  }

  // The error every call returns when the settings are invalid.
  mockError_t unusable() const { return fail(mockErrorInitialization, config.error); }
  bool usable() const { return config.error.empty(); }

  mockError_t check_device(int device) const {
    if (!usable()) return unusable();
    if (device < 0 || device >= config.devices) {
      return fail(mockErrorInvalidDevice,
                  "device " + std::to_string(device) + " does not exist: the mock has " +
                      std::to_string(config.devices) + " devices (ACCELKIT_MOCK_DEVICES)");
    }
    return mockSuccess;
  }

  // The (device, stream) a handle names; a null stream is the current device's default.
  static int device_of(mockStream_t stream) {
    return stream == nullptr ? current_device : stream->device;
  }
  static Scheduler::Key key(mockStream_t stream) {
    return {device_of(stream), stream == nullptr ? 0 : stream->serial};
  }
  static int priority(mockStream_t stream) {
    return stream == nullptr ? kLeastPriority : stream->priority;
  }

  // ---- memory
  mockError_t allocate(void** ptr, size_t bytes) {
    if (mockError_t e = check_device(current_device)) return e;
    if (ptr == nullptr || bytes == 0) {
      return fail(mockErrorInvalidValue, "mockMalloc needs a pointer to set and a size > 0");
    }
    const int device = current_device;
    {
      std::lock_guard<std::mutex> lock(memory_mutex_);
      if (used_[device] + bytes > config.capacity) {
        return fail(mockErrorMemoryAllocation,
                    "device " + std::to_string(device) + " has " +
                        std::to_string(config.capacity - used_[device]) + " of " +
                        std::to_string(config.capacity) + " bytes free, asked for " +
                        std::to_string(bytes) + " (ACCELKIT_MOCK_MEMORY)");
      }
      used_[device] += bytes;
    }
    // Host memory; large buffers in 2 MiB pages where the kernel allows (transparent huge
    // pages in "madvise" or "always" mode): fewer page faults and TLB misses on large copies,
    // as a device's large pages give. Discrete mode hands out the tagged address.
    void* host = nullptr;
    if (posix_memalign(&host, bytes < kLargePage ? 64 : kLargePage, bytes) != 0) {
      std::lock_guard<std::mutex> lock(memory_mutex_);
      used_[device] -= bytes;
      return fail(mockErrorMemoryAllocation,
                  "the host has no " + std::to_string(bytes) + " bytes for device memory");
    }
    if (bytes >= kLargePage) madvise(host, bytes, MADV_HUGEPAGE);  // advice only
    void* device_ptr = config.host_accessible
                           ? host
                           : reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(host) | kDeviceTag);
    {
      std::lock_guard<std::mutex> lock(memory_mutex_);
      allocations_[device_ptr] = {device, bytes};
    }
    *ptr = device_ptr;
    return mockSuccess;
  }

  mockError_t release(void* ptr) {
    if (ptr == nullptr) return mockSuccess;
    {
      std::lock_guard<std::mutex> lock(memory_mutex_);
      auto it = allocations_.find(ptr);
      if (it == allocations_.end()) {
        return fail(mockErrorInvalidValue, "mockFree: the pointer is not from mockMalloc");
      }
      used_[it->second.first] -= it->second.second;
      allocations_.erase(it);
    }
    std::free(to_host(ptr));
    return mockSuccess;
  }

  size_t used(int device) {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    return used_[device];
  }

  static void* to_host(const void* device_ptr) {
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(device_ptr) & ~kDeviceTag);
  }

  // ---- work on streams
  // Runs `work` when the stream reaches it (now, on a synchronous device); after an error of
  // the device, `dropped` instead. An exception from `work` fails the device (asynchronous) or
  // is returned (synchronous).
  // True when work runs inside the call that issues it (no scheduler: the synchronous mode).
  bool runs_inline() const { return !scheduler_; }

  mockError_t submit(mockStream_t stream, const char* name, std::function<void()> work,
                     std::function<void()> dropped) {
    const int device = device_of(stream);
    if (!scheduler_) {
      try {
        work();
      } catch (const std::exception& e) {
        return fail(mockErrorLaunchFailure, failed(name, device, e.what()));
      }
      return mockSuccess;
    }
    scheduler_->push(key(stream), priority(stream),
                     [this, device, what = std::string(name), work = std::move(work),
                      dropped = std::move(dropped)] {
                       if (has_error(device)) {  // a failed device runs no more work
                         if (dropped) dropped();
                         return;
                       }
                       try {
                         work();
                       } catch (const std::exception& e) {
                         record_error(device, failed(what, device, e.what()));
                       }
                     });
    if (config.launch_blocking) return synchronize(stream);
    return mockSuccess;
  }

  // A kernel on the asynchronous device's stream: `kernel(args, 1)` when the stream reaches
  // it, `kernel(args, 0)` (dropped) after an error of the device; its captures fit the queue's
  // entry, so a launch allocates nothing here.
  mockError_t submit_kernel(mockStream_t stream, const char* name, mockKernel_t kernel,
                            void* args) {
    const int device = device_of(stream);
    scheduler_->push(key(stream), priority(stream),
                     [this, device, kernel, args, what = std::string(name)] {
                       if (has_error(device)) {
                         kernel(args, 0);
                         return;
                       }
                       if (const char* error = kernel(args, 1)) {
                         record_error(device, failed(what, device, error));
                       }
                     });
    if (config.launch_blocking) return synchronize(stream);
    return mockSuccess;
  }

  mockError_t wait_host(mockStream_t stream, const char* name, mockWaitFn_t fn, void* args) {
    const int device = device_of(stream);
    if (!scheduler_) {
      // A synchronous device: the caller waits until the host resumes it.
      struct Latch {
        std::mutex mutex;
        std::condition_variable cv;
        bool done = false;
        std::optional<std::string> error;
      };
      auto latch = std::make_shared<Latch>();
      fn(args, new mockWait{[latch](const char* error) {
           {
             std::lock_guard<std::mutex> lock(latch->mutex);
             latch->done = true;
             if (error != nullptr) latch->error = error;
           }
           latch->cv.notify_all();
         }},
         1);
      std::unique_lock<std::mutex> lock(latch->mutex);
      latch->cv.wait(lock, [&] { return latch->done; });
      if (latch->error) return fail(mockErrorLaunchFailure, failed(name, device, latch->error->c_str()));
      return mockSuccess;
    }
    scheduler_->push_wait(
        key(stream), priority(stream),
        [this, device, what = std::string(name), fn, args](Scheduler::Resume resume) {
          if (has_error(device)) {  // a failed device waits for nothing
            fn(args, nullptr, 0);
            return resume();
          }
          fn(args,
             new mockWait{[this, device, what, resume = std::move(resume)](const char* error) {
               if (error != nullptr) record_error(device, failed(what, device, error));
               resume();
             }},
             1);
        });
    return mockSuccess;
  }

  static void resume(mockWait_t wait, const char* error) {
    auto resume = std::move(wait->resume);
    delete wait;
    resume(error);
  }

  bool query(mockStream_t stream) { return !scheduler_ || scheduler_->idle(key(stream)); }

  mockError_t synchronize(mockStream_t stream) {
    if (!scheduler_) return mockSuccess;
    scheduler_->drain(key(stream));
    return take_error(device_of(stream));
  }

  mockError_t synchronize_device(int device) {
    if (scheduler_) scheduler_->drain_device(device);
    return take_error(device);
  }

  mockStream_t create_stream(int device, int priority) {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    return new mockStream{device, priority, ++serials_};
  }

  void destroy_stream(mockStream_t stream) {
    if (scheduler_) scheduler_->drain(key(stream));
    delete stream;
  }

  // ---- events
  mockError_t record(mockEvent_t event, mockStream_t stream) {
    const std::shared_ptr<EventState>& state = event->state;
    if (device_of(stream) != state->device) {
      return fail(mockErrorInvalidResourceHandle,
                  "mockEventRecord: the event is device " + std::to_string(state->device) +
                      "'s, the stream device " + std::to_string(device_of(stream)) +
                      "'s: an event records on its own device's streams");
    }
    uint64_t n = 0;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      n = ++state->recorded;
    }
    if (!scheduler_) {
      state->complete(n);
      return mockSuccess;
    }
    // Completes the record when the stream reaches it, after an error of the device too (no
    // wait on the event blocks forever).
    scheduler_->push(key(stream), priority(stream), [state, n] { state->complete(n); });
    return mockSuccess;
  }

  void wait_event(mockStream_t stream, mockEvent_t event) {
    std::shared_ptr<EventState> state = event->state;
    uint64_t n = 0;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      n = state->recorded;
      if (state->completed >= n || !scheduler_) return;  // nothing to wait for
    }
    const int device = device_of(stream);
    scheduler_->push_wait(key(stream), priority(stream),
                          [this, device, state = std::move(state), n](Scheduler::Resume resume) {
                            if (has_error(device)) return resume();
                            state->when_complete(n, std::move(resume));
                          });
  }

  std::optional<uint64_t> seed() const {
    return scheduler_ ? scheduler_->seed() : std::nullopt;
  }

 private:
  // Asked before every queued task: without an error anywhere, one atomic load.
  bool has_error(int device) {
    if (!errors_present_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(error_mutex_);
    return errors_.count(device) > 0;
  }

  void record_error(int device, const std::string& message) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    errors_.emplace(device, message);  // the first one stays
    errors_present_.store(true, std::memory_order_release);
  }

  // The first error of `device`'s queued work, cleared once reported.
  mockError_t take_error(int device) {
    std::string message;
    {
      std::lock_guard<std::mutex> lock(error_mutex_);
      auto it = errors_.find(device);
      if (it == errors_.end()) return mockSuccess;
      message = std::move(it->second);
      errors_.erase(it);
      errors_present_.store(!errors_.empty(), std::memory_order_release);
    }
    return fail(mockErrorLaunchFailure, std::move(message));
  }

  std::unique_ptr<Scheduler> scheduler_;  // asynchronous mode only
  std::mutex memory_mutex_;
  std::map<int, size_t> used_;                                      // bytes per device
  std::unordered_map<void*, std::pair<int, size_t>> allocations_;  // device pointer: where, size
  std::mutex error_mutex_;
  std::map<int, std::string> errors_;
  std::atomic<bool> errors_present_{false};  // !errors_.empty(), read without the lock
  std::mutex streams_mutex_;
  uint64_t serials_ = 0;  // streams created
};

Driver& driver() {
  static auto* instance = new Driver();  // never destroyed: its worker threads outlive main()
  return *instance;
}

// Host memory a copy of `kind` reads or writes, device pointers translated.
void* dst_address(void* dst, mockMemcpyKind kind) {
  return kind == mockMemcpyHostToDevice || kind == mockMemcpyDeviceToDevice ? Driver::to_host(dst)
                                                                            : dst;
}
const void* src_address(const void* src, mockMemcpyKind kind) {
  return kind == mockMemcpyDeviceToHost || kind == mockMemcpyDeviceToDevice ? Driver::to_host(src)
                                                                            : src;
}

mockError_t check_copy(const void* dst, const void* src, mockMemcpyKind kind, const char* call) {
  if (!driver().usable()) return driver().unusable();
  if (kind < mockMemcpyHostToHost || kind > mockMemcpyDeviceToDevice) {
    return fail(mockErrorInvalidValue, std::string(call) + ": unknown mockMemcpyKind " +
                                           std::to_string(static_cast<int>(kind)));
  }
  if (dst == nullptr || src == nullptr) {
    return fail(mockErrorInvalidValue, std::string(call) + ": a null pointer");
  }
  return mockSuccess;
}

}  // namespace
}  // namespace mockrt

using mockrt::driver;
using mockrt::fail;

extern "C" {

const char* mockGetErrorName(mockError_t error) {
  switch (error) {
    case mockSuccess: return "mockSuccess";
    case mockErrorNotReady: return "mockErrorNotReady";
    case mockErrorInvalidValue: return "mockErrorInvalidValue";
    case mockErrorInvalidDevice: return "mockErrorInvalidDevice";
    case mockErrorMemoryAllocation: return "mockErrorMemoryAllocation";
    case mockErrorInvalidResourceHandle: return "mockErrorInvalidResourceHandle";
    case mockErrorLaunchFailure: return "mockErrorLaunchFailure";
    case mockErrorInitialization: return "mockErrorInitialization";
  }
  return "an unknown mockError_t";
}

const char* mockGetErrorMessage(void) { return mockrt::error_message.c_str(); }

mockError_t mockGetDeviceCount(int* count) {
  if (count == nullptr) return fail(mockErrorInvalidValue, "mockGetDeviceCount: count is null");
  *count = 0;
  if (!driver().usable()) return driver().unusable();
  *count = driver().config.devices;
  return mockSuccess;
}

mockError_t mockSetDevice(int device) {
  if (mockError_t e = driver().check_device(device)) return e;
  mockrt::current_device = device;
  return mockSuccess;
}

mockError_t mockGetDevice(int* device) {
  if (device == nullptr) return fail(mockErrorInvalidValue, "mockGetDevice: device is null");
  *device = mockrt::current_device;
  return mockSuccess;
}

mockError_t mockDeviceGetAttribute(int* value, mockDeviceAttr attr, int device) {
  if (mockError_t e = driver().check_device(device)) return e;
  if (value == nullptr) return fail(mockErrorInvalidValue, "mockDeviceGetAttribute: value is null");
  const mockrt::Config& config = driver().config;
  switch (attr) {
    case mockDevAttrHostAccessible: *value = config.host_accessible; return mockSuccess;
    case mockDevAttrAsync: *value = config.async; return mockSuccess;
    case mockDevAttrLaunchBlocking: *value = config.launch_blocking; return mockSuccess;
  }
  return fail(mockErrorInvalidValue, "mockDeviceGetAttribute: unknown attribute " +
                                         std::to_string(static_cast<int>(attr)));
}

mockError_t mockMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (mockError_t e = driver().check_device(mockrt::current_device)) return e;
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return fail(mockErrorInvalidValue, "mockMemGetInfo: a null pointer");
  }
  *total_bytes = driver().config.capacity;
  *free_bytes = *total_bytes - driver().used(mockrt::current_device);
  return mockSuccess;
}

mockError_t mockDeviceSynchronize(void) {
  if (mockError_t e = driver().check_device(mockrt::current_device)) return e;
  return driver().synchronize_device(mockrt::current_device);
}

mockError_t mockGetScheduleSeed(int* seeded, uint64_t* seed) {
  if (seeded == nullptr || seed == nullptr) {
    return fail(mockErrorInvalidValue, "mockGetScheduleSeed: a null pointer");
  }
  if (!driver().usable()) return driver().unusable();
  const auto value = driver().seed();
  *seeded = value.has_value();
  *seed = value.value_or(0);
  return mockSuccess;
}

mockError_t mockMalloc(void** ptr, size_t bytes) { return driver().allocate(ptr, bytes); }

mockError_t mockFree(void* ptr) { return driver().release(ptr); }

mockError_t mockMallocHost(void** ptr, size_t bytes) {
  if (ptr == nullptr) return fail(mockErrorInvalidValue, "mockMallocHost: ptr is null");
  if (posix_memalign(ptr, 64, bytes == 0 ? 1 : bytes) != 0) {
    *ptr = nullptr;
    return fail(mockErrorMemoryAllocation,
                "the host has no " + std::to_string(bytes) + " bytes of page-locked memory");
  }
  return mockSuccess;
}

mockError_t mockFreeHost(void* ptr) {
  std::free(ptr);
  return mockSuccess;
}

mockError_t mockMemcpy(void* dst, const void* src, size_t bytes, mockMemcpyKind kind) {
  if (bytes == 0) return mockSuccess;
  if (mockError_t e = mockrt::check_copy(dst, src, kind, "mockMemcpy")) return e;
  std::memcpy(mockrt::dst_address(dst, kind), mockrt::src_address(src, kind), bytes);
  return mockSuccess;
}

mockError_t mockMemcpyAsync(void* dst, const void* src, size_t bytes, mockMemcpyKind kind,
                            mockStream_t stream) {
  if (bytes == 0) return mockSuccess;
  if (mockError_t e = mockrt::check_copy(dst, src, kind, "mockMemcpyAsync")) return e;
  void* to = mockrt::dst_address(dst, kind);
  const void* from = mockrt::src_address(src, kind);
  if (!driver().config.async) {
    std::memcpy(to, from, bytes);
    return mockSuccess;
  }
  if (kind == mockMemcpyHostToDevice || kind == mockMemcpyHostToHost) {
    // Pageable host memory is staged now, so the caller may reuse it.
    std::shared_ptr<char[]> staged(new char[bytes]);
    std::memcpy(staged.get(), from, bytes);
    return driver().submit(stream, "copy to the device",
                           [to, staged, bytes] { std::memcpy(to, staged.get(), bytes); }, {});
  }
  return driver().submit(stream, "copy", [to, from, bytes] { std::memcpy(to, from, bytes); }, {});
}

void* mockDevicePointerToHost(const void* device_ptr) {
  return mockrt::Driver::to_host(device_ptr);
}

mockError_t mockDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least == nullptr || greatest == nullptr) {
    return fail(mockErrorInvalidValue, "mockDeviceGetStreamPriorityRange: a null pointer");
  }
  *least = mockrt::kLeastPriority;
  *greatest = mockrt::kGreatestPriority;
  return mockSuccess;
}

mockError_t mockStreamCreateWithPriority(mockStream_t* stream, int priority) {
  if (mockError_t e = driver().check_device(mockrt::current_device)) return e;
  if (stream == nullptr) {
    return fail(mockErrorInvalidValue, "mockStreamCreateWithPriority: stream is null");
  }
  priority = std::min(mockrt::kLeastPriority, std::max(mockrt::kGreatestPriority, priority));
  *stream = driver().create_stream(mockrt::current_device, priority);
  return mockSuccess;
}

mockError_t mockStreamDestroy(mockStream_t stream) {
  if (stream == nullptr) {
    return fail(mockErrorInvalidResourceHandle,
                "mockStreamDestroy: the default stream (NULL) cannot be destroyed");
  }
  driver().destroy_stream(stream);
  return mockSuccess;
}

mockError_t mockStreamQuery(mockStream_t stream) {
  if (!driver().usable()) return driver().unusable();
  return driver().query(stream) ? mockSuccess : mockErrorNotReady;
}

mockError_t mockStreamSynchronize(mockStream_t stream) {
  if (!driver().usable()) return driver().unusable();
  return driver().synchronize(stream);
}

mockError_t mockLaunchKernel(mockStream_t stream, const char* name, mockKernel_t kernel,
                             void* args) {
  if (!driver().usable()) return driver().unusable();
  if (kernel == nullptr) return fail(mockErrorInvalidValue, "mockLaunchKernel: kernel is null");
  const char* what = name == nullptr ? "a kernel" : name;
  if (driver().runs_inline()) {  // the kernel runs here; nothing to queue
    if (const char* error = kernel(args, 1)) {
      return fail(mockErrorLaunchFailure, mockrt::failed(what, mockrt::Driver::device_of(stream), error));
    }
    return mockSuccess;
  }
  return driver().submit_kernel(stream, what, kernel, args);
}

mockError_t mockStreamWaitHost(mockStream_t stream, const char* name, mockWaitFn_t fn,
                               void* args) {
  if (!driver().usable()) return driver().unusable();
  if (fn == nullptr) return fail(mockErrorInvalidValue, "mockStreamWaitHost: fn is null");
  return driver().wait_host(stream, name == nullptr ? "a wait" : name, fn, args);
}

void mockWaitResume(mockWait_t wait, const char* error) { mockrt::Driver::resume(wait, error); }

mockError_t mockEventCreateWithFlags(mockEvent_t* event, unsigned flags) {
  if (mockError_t e = driver().check_device(mockrt::current_device)) return e;
  if (event == nullptr) return fail(mockErrorInvalidValue, "mockEventCreateWithFlags: event is null");
  if ((flags & ~unsigned{mockEventBlockingSync | mockEventDisableTiming}) != 0) {
    return fail(mockErrorInvalidValue,
                "mockEventCreateWithFlags: unknown flags " + std::to_string(flags));
  }
  auto state = std::make_shared<mockrt::EventState>();
  state->device = mockrt::current_device;
  state->flags = flags;
  *event = new mockEvent{std::move(state)};
  return mockSuccess;
}

mockError_t mockEventDestroy(mockEvent_t event) {
  delete event;  // pending records and waits hold the state
  return mockSuccess;
}

mockError_t mockEventRecord(mockEvent_t event, mockStream_t stream) {
  if (!driver().usable()) return driver().unusable();
  if (event == nullptr) return fail(mockErrorInvalidResourceHandle, "mockEventRecord: event is null");
  return driver().record(event, stream);
}

mockError_t mockEventQuery(mockEvent_t event) {
  if (event == nullptr) return fail(mockErrorInvalidResourceHandle, "mockEventQuery: event is null");
  std::lock_guard<std::mutex> lock(event->state->mutex);
  return event->state->completed >= event->state->recorded ? mockSuccess : mockErrorNotReady;
}

mockError_t mockEventSynchronize(mockEvent_t event) {
  if (event == nullptr) {
    return fail(mockErrorInvalidResourceHandle, "mockEventSynchronize: event is null");
  }
  mockrt::EventState& state = *event->state;
  std::unique_lock<std::mutex> lock(state.mutex);
  const uint64_t n = state.recorded;
  state.cv.wait(lock, [&] { return state.completed >= n; });
  return mockSuccess;
}

mockError_t mockEventElapsedTime(float* ms, mockEvent_t start, mockEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) {
    return fail(mockErrorInvalidValue, "mockEventElapsedTime: a null argument");
  }
  double times[2] = {0.0, 0.0};
  mockEvent_t events[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    mockrt::EventState& state = *events[i]->state;
    std::lock_guard<std::mutex> lock(state.mutex);
    if ((state.flags & mockEventDisableTiming) != 0 || state.recorded == 0) {
      return fail(mockErrorInvalidResourceHandle,
                  "mockEventElapsedTime: an event without timing, or never recorded");
    }
    if (state.completed < state.recorded) {
      return fail(mockErrorNotReady, "mockEventElapsedTime: an event's record is pending");
    }
    times[i] = state.time_ms;
  }
  *ms = static_cast<float>(times[1] - times[0]);
  return mockSuccess;
}

mockError_t mockStreamWaitEvent(mockStream_t stream, mockEvent_t event, unsigned flags) {
  if (!driver().usable()) return driver().unusable();
  if (event == nullptr) {
    return fail(mockErrorInvalidResourceHandle, "mockStreamWaitEvent: event is null");
  }
  if (flags != 0) return fail(mockErrorInvalidValue, "mockStreamWaitEvent: flags must be 0");
  driver().wait_event(stream, event);
  return mockSuccess;
}

}  // extern "C"
