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
//     in order by a bounded set of worker threads (Scheduler); launch() and copy_async() return
//     at once, the host waits only in synchronize(), stream_synchronize() and copies to
//     pageable host memory; an exception in queued work is raised, with what failed, by the
//     next synchronizing call. After it the device runs none of the work queued later
//     (CUDA's sticky error); waits queued later pass at once, and event records complete
//     unrun (accelkit's events), so every host wait still returns.
//   ACCELKIT_MOCK_SCHEDULE=<seed> (with ACCELKIT_MOCK_ASYNC=1): one worker runs every stream in
//     an order drawn from the seed, holding some tasks back (Scheduler): an ordering bug that
//     shows under a seed reproduces with that seed.
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

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
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
#include <optional>
#include <random>
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

// The streams of every device and the threads that run them: each (device, stream) is a queue
// run in order, one task at a time; a fixed set of worker threads runs the queues that have
// work, so threads are bounded however many streams a program makes: a stream costs a queue
// while it has work, not a thread (the queue of an idle stream other than the default one is
// dropped; c10 streams are never destroyed, so this is how their resources are recycled). A
// stream that reaches a wait (Runtime::stream_wait) is parked, holding no thread, until the
// wait resumes it. Workers are woken only when someone
// sleeps: a launch costs a lock and a push while a worker is busy.
//
// Streams have priorities (Runtime::stream_create; lower runs first): a worker takes the next
// task from a stream of the highest priority that has work, as a device's hardware scheduler
// dispatches pending work of higher-priority streams first.
//
// With a seed (ACCELKIT_MOCK_SCHEDULE=<seed>) one worker runs everything, choosing the next
// stream among those with work from a generator seeded with it and holding some tasks back a
// little (a slow kernel), so the device's interleaving of the streams, and its timing against
// the host, are drawn from the seed: an ordering bug (a missing stream wait, event or
// record_stream) shows under some seeds and comes back with the same seed (among the streams of
// the highest priority with work: one stream at a time, priority is order). Each choice waits
// until the host has launched nothing (nor released a wait) for 1 ms, so the streams that have
// work at a choice are what the program launched before it waited or computed, not how fast
// the worker woke, and the seed picks among them in stream order; a
// host whose launches pause longer than that mid-burst (or several host threads launching at
// once) can still change them.
class Scheduler {
 public:
  using Key = std::pair<int, uint64_t>;  // (device, stream's serial number; 0: default stream)
  using Resume = std::function<void()>;

  Scheduler(int workers, std::optional<uint64_t> seed) : seed_(seed) {
    if (seed_) random_.seed(*seed_);
    for (int i = 0; i < workers; ++i) {
      std::thread([this] { loop(); }).detach();  // lives as long as the process, as the runtime
    }
  }

  std::optional<uint64_t> seed() const { return seed_; }

  // Queue `task` on a stream of `priority` (lower runs first).
  void push(Key key, int priority, std::function<void()> task) {
    enqueue(key, priority, Entry{std::move(task), {}});
  }

  // Queue a wait: when the stream reaches it, `when_ready(resume)` runs on a worker and the
  // stream runs nothing more until `resume` is called (at once, or later from any thread).
  void push_wait(Key key, int priority, std::function<void(Resume)> when_ready) {
    enqueue(key, priority, Entry{{}, std::move(when_ready)});
  }

  // Until the stream has run everything pushed on it (parked waits included). A waiting thread
  // that holds Python's GIL lets go of it meanwhile: queued work may need it (the last
  // reference to a tensor whose Python object it frees), as a driver's blocking calls must not
  // hold a host lock its callbacks take.
  void drain(Key key) { drain_where([key](const Key& k) { return k == key; }); }
  void drain_device(int device) {
    drain_where([device](const Key& k) { return k.first == device; });
  }

  bool idle(Key key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(key);
    return it == streams_.end() || it->second.idle();
  }

 private:
  struct Entry {
    std::function<void()> run;
    std::function<void(Resume)> wait;
  };
  struct Stream {
    Key key;
    int priority = 0;
    std::deque<Entry> tasks;
    bool running = false;   // a worker holds its head task
    bool parked = false;    // at a wait not resumed yet
    bool runnable = false;  // listed in runnable_
    bool idle() const { return tasks.empty() && !running && !parked; }
  };

  void enqueue(Key key, int priority, Entry entry) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Stream& stream = streams_[key];
      stream.key = key;
      stream.priority = priority;
      stream.tasks.push_back(std::move(entry));
      if (seed_) last_push_ = std::chrono::steady_clock::now();
      wake = make_runnable(stream) && must_wake();
    }
    if (wake) work_cv_.notify_one();
  }

  // Under mutex_: whether a newly listed stream needs a sleeping worker woken (none spins).
  bool must_wake() const { return sleeping_ > 0 && !spinning_; }

  // Lists the stream for a worker if it can run; true when it was newly listed.
  bool make_runnable(Stream& stream) {
    if (stream.runnable || stream.running || stream.parked || stream.tasks.empty()) return false;
    stream.runnable = true;
    runnable_.push_back(&stream);
    return true;
  }

  template <typename Match>
  void drain_where(Match match) {
    auto done = [&] {
      for (auto& [key, stream] : streams_) {
        if (match(key) && !stream.idle()) return false;
      }
      return true;
    };
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done()) return;
    }
    PyThreadState* released =
        Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++drainers_;
      idle_cv_.wait(lock, done);
      --drainers_;
    }
    if (released != nullptr) PyEval_RestoreThread(released);
  }

  // Under mutex_, after a task ran on a worker (which goes on to the next runnable stream
  // itself) or a wait resumed on any thread; `stream` may be gone afterwards.
  void settled(Stream& stream, bool on_worker) {
    const bool listed = make_runnable(stream);
    if (listed && must_wake() && (!on_worker || runnable_.size() > 1)) work_cv_.notify_one();
    if (!stream.idle()) return;
    if (drainers_ > 0) idle_cv_.notify_all();
    if (stream.key.second != 0) streams_.erase(stream.key);
  }

  static bool& on_worker() {
    thread_local bool value = false;
    return value;
  }

  void loop() {
    on_worker() = true;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (runnable_.empty()) {
        // A burst of small launches keeps coming: one worker gives the core away a few times
        // before sleeping, so each launch does not pay for waking a thread.
        if (!spinning_) {
          spinning_ = true;
          for (int i = 0; i < kYields && runnable_.empty(); ++i) {
            lock.unlock();
            std::this_thread::yield();
            lock.lock();
          }
          spinning_ = false;
        }
        if (runnable_.empty()) {
          ++sleeping_;
          work_cv_.wait(lock, [this] { return !runnable_.empty(); });
          --sleeping_;
        }
      }
      // Only the streams of the highest priority with work are candidates, as a device's
      // hardware scheduler dispatches pending work from higher-priority streams first.
      int best = runnable_.front()->priority;
      for (const Stream* candidate : runnable_) best = std::min(best, candidate->priority);
      size_t pick = 0;
      while (runnable_[pick]->priority != best) ++pick;
      std::chrono::microseconds held{0};
      if (seed_) {
        // Choose once the host has stopped launching: the streams with work are then the
        // program's doing (what it launched before it waited or computed), not how fast this
        // thread woke up, so a seed makes the same choices run after run.
        for (auto quiet = std::chrono::steady_clock::now() - last_push_; quiet < kQuiet;
             quiet = std::chrono::steady_clock::now() - last_push_) {
          lock.unlock();
          std::this_thread::sleep_for(kQuiet - quiet);
          lock.lock();
        }
        best = runnable_.front()->priority;
        for (const Stream* candidate : runnable_) best = std::min(best, candidate->priority);
        // The k-th stream in (device, stream) order: the order in which streams got work is
        // the host's timing, not the program's.
        std::vector<size_t> order;
        for (size_t i = 0; i < runnable_.size(); ++i) {
          if (runnable_[i]->priority == best) order.push_back(i);
        }
        std::sort(order.begin(), order.end(),
                  [this](size_t a, size_t b) { return runnable_[a]->key < runnable_[b]->key; });
        pick = order[static_cast<size_t>(random_() % order.size())];
        // A slow kernel now and then: the host runs ahead before the task's work is visible.
        if (random_() % 4 == 0) held = std::chrono::microseconds(random_() % 200);
      }
      Stream& stream = *runnable_[pick];
      runnable_.erase(runnable_.begin() + static_cast<std::ptrdiff_t>(pick));
      stream.runnable = false;
      stream.running = true;
      Entry entry = std::move(stream.tasks.front());
      stream.tasks.pop_front();
      if (!runnable_.empty() && must_wake()) work_cv_.notify_one();
      lock.unlock();
      if (held.count() > 0) std::this_thread::sleep_for(held);
      if (entry.run) {
        entry.run();  // never throws: the runtime wraps every task
        entry = Entry{};  // its captures go before the stream counts as idle
        lock.lock();
        stream.running = false;
        settled(stream, true);
        continue;
      }
      lock.lock();
      stream.running = false;
      stream.parked = true;
      lock.unlock();
      entry.wait([this, &stream] {
        std::lock_guard<std::mutex> relock(mutex_);
        // Released by the host (not by a task on the worker): work arriving, as a launch.
        if (seed_ && !on_worker()) last_push_ = std::chrono::steady_clock::now();
        stream.parked = false;
        settled(stream, false);
      });
      entry = Entry{};
      lock.lock();
    }
  }

  static constexpr int kYields = 64;
  static constexpr std::chrono::microseconds kQuiet{1000};  // no launch for that long: choose
  const std::optional<uint64_t> seed_;
  std::chrono::steady_clock::time_point last_push_;  // under mutex_
  std::mt19937_64 random_;  // under mutex_
  std::mutex mutex_;
  std::condition_variable work_cv_;  // workers sleep on it
  std::condition_variable idle_cv_;  // drain() sleeps on it
  std::map<Key, Stream> streams_;    // node-based: a Stream's address is stable
  std::vector<Stream*> runnable_;    // streams with a task to run and no worker
  bool spinning_ = false;
  int sleeping_ = 0;
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
    // Under torchrun a host shows as many devices as it runs ranks, as a cluster node has
    // --nproc-per-node devices (torch's DTensor RNG tracker takes device rank % device_count()
    // as a rank's own, which is LOCAL_RANK's only then); ACCELKIT_MOCK_DEVICES overrides it.
    if (const char* local = std::getenv("LOCAL_WORLD_SIZE");
        local != nullptr && std::getenv("TORCHELASTIC_RUN_ID") != nullptr) {
      char* end = nullptr;
      const long n = std::strtol(local, &end, 10);
      if (end != local && *end == '\0' && n >= 1 && n <= 64) devices_ = static_cast<int>(n);
    }
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
    std::optional<uint64_t> seed;
    if (const char* env = std::getenv("ACCELKIT_MOCK_SCHEDULE");
        env != nullptr && *env != '\0' && std::strcmp(env, "off") != 0) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(env, &end, 10);
      if (end == env || *end != '\0' || *env == '-') {
        error_ = std::string("ACCELKIT_MOCK_SCHEDULE=") + env +
                 " is not a seed: use a non-negative integer (e.g. ACCELKIT_MOCK_SCHEDULE=7), "
                 "or off";
      } else if (!async_) {
        error_ = std::string("ACCELKIT_MOCK_SCHEDULE=") + env +
                 " orders the streams of the asynchronous mode: set ACCELKIT_MOCK_ASYNC=1 "
                 "with it";
      } else {
        seed = n;
      }
    }
    if (async_) scheduler_ = std::make_unique<Scheduler>(seed ? 1 : kWorkers, seed);
  }

  // The seed of ACCELKIT_MOCK_SCHEDULE, if the streams run under one.
  std::optional<uint64_t> schedule_seed() const {
    return scheduler_ ? scheduler_->seed() : std::nullopt;
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
    if (scheduler_) scheduler_->drain_device(device);
    raise_pending(device);
  }

  bool host_accessible() const noexcept override { return host_accessible_; }

  bool async() const noexcept override { return async_; }

  // ACCELKIT_MOCK_LAUNCH_BLOCKING=1: every launch waits for its stream on the host.
  bool launch_blocking() const noexcept { return launch_blocking_; }

  // CUDA: cudaDeviceGetStreamPriorityRange: four priorities, 0 (the lowest) to -3.
  std::pair<int, int> stream_priority_range(int /*device*/) override { return {0, -3}; }

  // CUDA: cudaStreamCreateWithPriority. A stream is its queue's name in the scheduler and its
  // priority; the null stream is each device's default stream, at the lowest priority.
  accelkit::DriverStream stream_create(int device, int priority) override {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    return new MockStream{device, priority, ++serials_};
  }

  // CUDA: cudaStreamDestroy: the work queued on it still runs, then it is gone.
  void stream_destroy(int /*device*/, accelkit::DriverStream stream) noexcept override {
    auto* s = static_cast<MockStream*>(stream);
    if (scheduler_) scheduler_->drain(key(s->device, stream));
    delete s;
  }

  // CUDA: cudaLaunchHostFunc. Synchronous mode runs `fn` now.
  void launch(int device, accelkit::DriverStream stream, const char* what,
              std::function<void()> fn) override {
    if (!async_) {
      fn();
      return;
    }
    scheduler_->push(key(device, stream), priority(stream),
                     [this, device, what = std::string(what), fn = std::move(fn)] {
      if (has_error(device)) return;  // a failed device runs no more work (CUDA's sticky error)
      try {
        fn();
      } catch (const std::exception& e) {
        record_error(device, failed(what, device, e.what()));
      }
    });
    if (launch_blocking_) stream_synchronize(device, stream);
  }

  // CUDA: cudaStreamWaitEvent. The stream is parked, holding no worker, until resumed.
  void stream_wait(int device, accelkit::DriverStream stream, const char* what,
                   std::function<void(Resume)> when_ready) override {
    if (!async_) {
      Runtime::stream_wait(device, stream, what, std::move(when_ready));
      return;
    }
    scheduler_->push_wait(
        key(device, stream), priority(stream),
        [this, device, what = std::string(what),
         when_ready = std::move(when_ready)](Scheduler::Resume resume) {
          if (has_error(device)) return resume();  // a failed device waits for nothing
          when_ready([this, device, what, resume = std::move(resume)](std::exception_ptr error) {
            if (error) {
              try {
                std::rethrow_exception(error);
              } catch (const std::exception& e) {
                record_error(device, failed(what, device, e.what()));
              } catch (...) {
                record_error(device, failed(what, device, "an unknown error"));
              }
            }
            resume();
          });
        });
  }

  // CUDA: cudaMemcpyAsync. Pageable host sources are staged now, so the caller may reuse them.
  void copy_async(void* dst, int dst_device, const void* src, int src_device, size_t nbytes,
                  int device, accelkit::DriverStream stream) override {
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
  bool stream_query(int device, accelkit::DriverStream stream) override {
    return !async_ || scheduler_->idle(key(device, stream));
  }

  // CUDA: cudaStreamSynchronize.
  void stream_synchronize(int device, accelkit::DriverStream stream) override {
    if (!async_) return;
    scheduler_->drain(key(device, stream));
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
  // What a DriverStream of this runtime points to.
  struct MockStream {
    int device;
    int priority;
    uint64_t serial;  // the scheduler's name for its queue (0: the default stream)
  };

  static Scheduler::Key key(int device, accelkit::DriverStream stream) {
    return {device, stream == nullptr ? 0 : static_cast<const MockStream*>(stream)->serial};
  }
  static int priority(accelkit::DriverStream stream) {
    return stream == nullptr ? 0 : static_cast<const MockStream*>(stream)->priority;
  }

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

  static std::string failed(const std::string& what, int device, const char* why) {
    return what + " failed on device " + std::to_string(device) + ": " + why;
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
  static constexpr int kWorkers = 4;  // threads that run the streams of all devices
  int devices_ = 8;
  size_t capacity_ = size_t{8} << 30;
  bool host_accessible_ = true;
  bool async_ = false;
  bool launch_blocking_ = false;
  std::string error_;
  std::unique_ptr<Scheduler> scheduler_;  // asynchronous mode only
  std::mutex error_mutex_;
  std::map<int, std::string> errors_;
  std::mutex streams_mutex_;
  uint64_t serials_ = 0;  // streams created
};

}  // namespace accelkit_mock
