// The mock's runtime: the "driver" of a device whose memory is host memory, in the modes of
// the hardware accelkit must serve. Each function says what a real vendor's driver call is.
//
// Memory: host memory from c10::alloc_cpu (the CPU allocator's own aligned allocation, so
// mock tensors are as fast as CPU tensors); buffers of 2 MiB and more are 2 MiB-aligned and
// asked to be backed by 2 MiB pages, as GPU memory is.
//   ACCELKIT_MOCK_HOST_ACCESSIBLE=1 (default): device pointers are those host addresses, as on
//     unified-memory parts; the layer computes on them directly (zero copy).
//   ACCELKIT_MOCK_HOST_ACCESSIBLE=0 (discrete): device pointers are those addresses with a
//     high bit set (kDeviceTag), which the CPU cannot dereference: any code that touches
//     device memory without going through copy()/copy_async() crashes at once (SIGSEGV)
//     instead of silently working. Only this runtime translates them (host_address()), as a
//     discrete device's driver does with its own address space.
// Execution:
//   ACCELKIT_MOCK_ASYNC=0 (default): synchronous; every call completes before it returns.
//   ACCELKIT_MOCK_ASYNC=1: asynchronous, as CUDA streams: each (device, stream) has a queue run
//     in order by a worker thread; launch() and copy_async() return at once, the host waits
//     only in synchronize(), stream_synchronize() and copies to pageable host memory; an
//     exception in queued work is raised, with what failed, by the next synchronizing call.
//   ACCELKIT_MOCK_LAUNCH_BLOCKING=1: every launch and copy waits for its stream (as
//     CUDA_LAUNCH_BLOCKING=1), so an error is raised by the call that caused it.
// Size: ACCELKIT_MOCK_DEVICES (device count, default 8; 0 models a host without the card, as a
// driver that finds none: the device registers and is unavailable), ACCELKIT_MOCK_MEMORY (capacity per
// device, default 8GiB; suffixes B, KB/MB/GB/TB (powers of 1000), K/M/G/T and
// KiB/MiB/GiB/TiB (powers of 1024)).
#pragma once

#include <Python.h>  // the mock lives in a Python extension: its waits let go of the GIL

#include <accelkit/runtime.h>

#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <cctype>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace accelkit_mock {

// Parse "8GiB", "64MiB", "512M", "1000000" into bytes; returns false on anything else.
inline bool parse_bytes(const std::string& text, size_t& out) {
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

// One stream's queue of work and the thread that runs it, in order. Threads are woken only
// when someone sleeps: a launch costs a lock and a push while the worker is busy.
class StreamQueue {
 public:
  StreamQueue() {
    std::thread([this] { loop(); }).detach();  // lives as long as the process, as the runtime
  }

  void push(std::function<void()> task) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
      wake = worker_sleeping_;
    }
    if (wake) work_cv_.notify_one();
  }

  // Until everything pushed before the call has run. A waiting thread that holds Python's GIL
  // lets go of it meanwhile: queued work may need it (the last reference to a tensor whose
  // Python object it frees), as a driver's blocking calls must not hold a host lock its
  // callbacks take.
  void drain() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (tasks_.empty() && !busy_) return;
    }
    PyThreadState* released =
        Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++drainers_;
      idle_cv_.wait(lock, [this] { return tasks_.empty() && !busy_; });
      --drainers_;
    }
    if (released != nullptr) PyEval_RestoreThread(released);
  }

  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return tasks_.empty() && !busy_;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (tasks_.empty()) {
        busy_ = false;
        if (drainers_ > 0) idle_cv_.notify_all();
        // A burst of small launches keeps coming: give the core away a few times before
        // sleeping, so each launch does not pay for waking this thread.
        for (int i = 0; i < kYields && tasks_.empty(); ++i) {
          lock.unlock();
          std::this_thread::yield();
          lock.lock();
        }
        if (!tasks_.empty()) continue;
        worker_sleeping_ = true;
        work_cv_.wait(lock, [this] { return !tasks_.empty(); });
        worker_sleeping_ = false;
      }
      busy_ = true;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();  // never throws: the runtime wraps every task
      task = nullptr;  // its captures go before the stream counts as idle
      lock.lock();
    }
  }

  static constexpr int kYields = 64;
  std::mutex mutex_;
  std::condition_variable work_cv_;  // the worker sleeps on it
  std::condition_variable idle_cv_;  // drain() sleeps on it
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false;
  bool worker_sleeping_ = false;
  int drainers_ = 0;
};

class MockRuntime final : public accelkit::Runtime {
 public:
  // The high address bit that marks discrete device memory: the CPU faults on such addresses
  // (non-canonical on x86-64; above the 48/52-bit user space, below the ignored top byte, on
  // AArch64).
#if defined(__aarch64__)
  static constexpr uintptr_t kDeviceTag = uintptr_t{1} << 55;
#else
  static constexpr uintptr_t kDeviceTag = uintptr_t{1} << 62;
#endif

  MockRuntime() {
    if (const char* env = std::getenv("ACCELKIT_MOCK_DEVICES")) {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      if (end == env || *end != '\0' || n < 0 || n > 64) {
        error_ = std::string("ACCELKIT_MOCK_DEVICES=") + env +
                 " is not a device count: use an integer from 0 to 64, e.g. ACCELKIT_MOCK_DEVICES=8";
      } else {
        devices_ = static_cast<int>(n);
      }
    }
    if (const char* env = std::getenv("ACCELKIT_MOCK_MEMORY")) {
      if (!parse_bytes(env, capacity_) || capacity_ == 0) {
        error_ = std::string("ACCELKIT_MOCK_MEMORY=") + env +
                 " is not a memory size: use bytes with an optional unit, e.g. 8GiB, 512MiB, "
                 "64MB or 1000000";
      }
    }
    host_accessible_ = flag("ACCELKIT_MOCK_HOST_ACCESSIBLE", true);
    async_ = flag("ACCELKIT_MOCK_ASYNC", false);
    launch_blocking_ = flag("ACCELKIT_MOCK_LAUNCH_BLOCKING", false);
  }

  // The configuration error, if any (the Python package raises it; device_count() is 0).
  const std::string& config_error() const { return error_; }

  // CUDA: cudaGetDeviceCount.
  int device_count() noexcept override { return error_.empty() ? devices_ : 0; }

  // CUDA: cudaSetDevice. Host memory has no per-thread device context: nothing to do.
  void set_device(int /*device*/) override {}

  // CUDA: cudaMemGetInfo (total).
  size_t capacity(int /*device*/) override { return capacity_; }

  // CUDA: cudaMalloc. Host memory from the CPU allocator's aligned allocation; large buffers
  // in 2 MiB pages where the kernel allows (transparent huge pages in "madvise" or "always"
  // mode): fewer page faults and TLB misses on large copies, as a device's large pages give.
  // Discrete mode hands out the tagged address.
  void* allocate(int /*device*/, size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes < kLargePage) {
      try {
        ptr = c10::alloc_cpu(nbytes);
      } catch (...) {
        return nullptr;
      }
    } else {
      if (posix_memalign(&ptr, kLargePage, nbytes) != 0) return nullptr;
      madvise(ptr, nbytes, MADV_HUGEPAGE);  // advice only: without THP it stays 4 KiB pages
    }
    return host_accessible_ ? ptr : reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(ptr) |
                                                            kDeviceTag);
  }

  // CUDA: cudaFree. (c10::free_cpu is free() on Linux, for both kinds of allocation.)
  void release(int /*device*/, void* ptr) noexcept override { std::free(host_address(ptr)); }

  // Driver-internal: the host address behind a device pointer (the identity unless discrete).
  // What the mock's own kernels compute on; nothing outside this runtime's device may use it.
  void* host_address(const void* device_ptr) const noexcept {
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(device_ptr) & ~kDeviceTag);
  }

  // CUDA: cudaHostAlloc / cudaFreeHost.
  void* allocate_pinned(size_t nbytes) override {
    try {
      return c10::alloc_cpu(nbytes);
    } catch (...) {
      return nullptr;
    }
  }
  void release_pinned(void* ptr) noexcept override { c10::free_cpu(ptr); }

  // CUDA: cudaMemcpy / cudaMemcpyPeer (all host memory here, device pointers translated).
  void copy(void* dst, int dst_device, const void* src, int src_device,
            size_t nbytes) override {
    if (nbytes == 0) return;
    std::memcpy(translate(dst, dst_device), translate(src, src_device), nbytes);
  }

  // CUDA: cudaDeviceSynchronize: every stream of the device drained, then its first error.
  void synchronize(int device) override {
    for (StreamQueue* queue : queues_of(device)) queue->drain();
    raise_pending(device);
  }

  bool host_accessible() const noexcept override { return host_accessible_; }

  bool async() const noexcept override { return async_; }

  // CUDA: cudaLaunchHostFunc. Synchronous mode runs `fn` now.
  void launch(int device, int64_t stream, const char* what, std::function<void()> fn) override {
    if (!async_) {
      fn();
      return;
    }
    StreamQueue& queue = queue_for(device, stream);
    queue.push([this, device, what = std::string(what), fn = std::move(fn)] {
      if (has_error(device)) return;  // a failed device runs no more work (CUDA's sticky error)
      try {
        fn();
      } catch (const std::exception& e) {
        record_error(device, what + " failed on " + std::string("device ") +
                                 std::to_string(device) + ": " + e.what());
      }
    });
    if (launch_blocking_) {
      queue.drain();
      raise_pending(device);
    }
  }

  // CUDA: cudaMemcpyAsync. Pageable host sources are staged now, so the caller may reuse them.
  void copy_async(void* dst, int dst_device, const void* src, int src_device, size_t nbytes,
                  int device, int64_t stream) override {
    if (!async_ || nbytes == 0) {
      copy(dst, dst_device, src, src_device, nbytes);
      return;
    }
    void* to = translate(dst, dst_device);
    const void* from = translate(src, src_device);
    if (src_device == accelkit::kHost) {
      std::shared_ptr<char[]> staged(new char[nbytes]);
      std::memcpy(staged.get(), from, nbytes);
      launch(device, stream, "copy to the device",
             [to, staged, nbytes] { std::memcpy(to, staged.get(), nbytes); });
    } else {
      launch(device, stream, "copy", [to, from, nbytes] { std::memcpy(to, from, nbytes); });
    }
  }

  // CUDA: cudaStreamQuery.
  bool stream_query(int device, int64_t stream) override {
    return !async_ || queue_for(device, stream).idle();
  }

  // CUDA: cudaStreamSynchronize.
  void stream_synchronize(int device, int64_t stream) override {
    if (!async_) return;
    queue_for(device, stream).drain();
    raise_pending(device);
  }

  std::string capacity_hint() const override {
    return "Set ACCELKIT_MOCK_MEMORY (e.g. ACCELKIT_MOCK_MEMORY=16GiB) to change the capacity "
           "of each mock device.";
  }
  std::string device_count_hint() const override {
    return "Set ACCELKIT_MOCK_DEVICES to change the number of mock devices.";
  }

 private:
  static bool flag(const char* name, bool fallback) {
    const char* env = std::getenv(name);
    return env == nullptr || *env == '\0' ? fallback : std::strcmp(env, "0") != 0;
  }

  void* translate(void* ptr, int device) const noexcept {
    return device == accelkit::kHost ? ptr : host_address(ptr);
  }
  const void* translate(const void* ptr, int device) const noexcept {
    return device == accelkit::kHost ? ptr : host_address(ptr);
  }

  StreamQueue& queue_for(int device, int64_t stream) {
    std::lock_guard<std::mutex> lock(queues_mutex_);
    auto& slot = queues_[{device, stream}];
    if (!slot) slot = std::make_unique<StreamQueue>();
    return *slot;
  }

  std::vector<StreamQueue*> queues_of(int device) {
    std::lock_guard<std::mutex> lock(queues_mutex_);
    std::vector<StreamQueue*> out;
    for (auto& [key, queue] : queues_) {
      if (key.first == device) out.push_back(queue.get());
    }
    return out;
  }

  bool has_error(int device) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return errors_.count(device) > 0;
  }

  void record_error(int device, const std::string& message) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    errors_.emplace(device, message);  // the first one stays
  }

  // Raise (and clear) the first error of `device`'s queued work.
  void raise_pending(int device) {
    std::string message;
    {
      std::lock_guard<std::mutex> lock(error_mutex_);
      auto it = errors_.find(device);
      if (it == errors_.end()) return;
      message = std::move(it->second);
      errors_.erase(it);
    }
    TORCH_CHECK(false, "mock: an asynchronous operation failed: ", message,
                " (ACCELKIT_MOCK_LAUNCH_BLOCKING=1 raises it where it is issued)");
  }

  static constexpr size_t kLargePage = size_t{2} << 20;
  int devices_ = 8;
  size_t capacity_ = size_t{8} << 30;
  bool host_accessible_ = true;
  bool async_ = false;
  bool launch_blocking_ = false;
  std::string error_;
  std::mutex queues_mutex_;
  std::map<std::pair<int, int64_t>, std::unique_ptr<StreamQueue>> queues_;
  std::mutex error_mutex_;
  std::map<int, std::string> errors_;
};

}  // namespace accelkit_mock
