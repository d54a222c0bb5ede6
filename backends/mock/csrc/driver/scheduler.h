// The mock driver's streams and the threads that run them (driver-internal: mockrt.cpp uses it).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace mockrt {

// A queued task: a move-only callable kept inside the queue's entry when its captures fit
// (a kernel launch's do: its function, arguments, device and name), so queuing one allocates
// nothing, as a driver writes a launch into a ring of command slots; larger ones go to the heap.
class Task {
 public:
  Task() = default;
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Task>>>
  Task(F&& fn) {  // NOLINT(google-explicit-constructor): as std::function
    using Fn = std::decay_t<F>;
    if constexpr (sizeof(Fn) <= kInline && alignof(Fn) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<Fn>) {
      new (buffer_) Fn(std::forward<F>(fn));
      ops_ = &kInlineOps<Fn>;
    } else {
      *reinterpret_cast<Fn**>(buffer_) = new Fn(std::forward<F>(fn));
      ops_ = &kHeapOps<Fn>;
    }
  }
  Task(Task&& other) noexcept { take(other); }
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { reset(); }

  explicit operator bool() const { return ops_ != nullptr; }
  void operator()() { ops_->call(buffer_); }

 private:
  static constexpr size_t kInline = 64;
  struct Ops {
    void (*call)(void*);
    void (*move)(void* from, void* to);  // leaves `from` destroyed
    void (*destroy)(void*);
  };
  template <typename Fn>
  static constexpr Ops kInlineOps{
      [](void* p) { (*static_cast<Fn*>(p))(); },
      [](void* from, void* to) {
        new (to) Fn(std::move(*static_cast<Fn*>(from)));
        static_cast<Fn*>(from)->~Fn();
      },
      [](void* p) { static_cast<Fn*>(p)->~Fn(); }};
  template <typename Fn>
  static constexpr Ops kHeapOps{
      [](void* p) { (**static_cast<Fn**>(p))(); },
      [](void* from, void* to) { *static_cast<Fn**>(to) = *static_cast<Fn**>(from); },
      [](void* p) { delete *static_cast<Fn**>(p); }};

  void take(Task& other) noexcept {
    ops_ = other.ops_;
    if (ops_ != nullptr) ops_->move(other.buffer_, buffer_);
    other.ops_ = nullptr;
  }
  void reset() noexcept {
    if (ops_ != nullptr) ops_->destroy(buffer_);
    ops_ = nullptr;
  }

  alignas(std::max_align_t) unsigned char buffer_[kInline];
  const Ops* ops_ = nullptr;
};

// The streams of every device and the threads that run them: each (device, stream) is a queue
// run in order, one task at a time; a fixed set of worker threads runs the queues that have
// work, so threads are bounded however many streams a program makes: a stream costs a queue
// while it has work, not a thread (the queue of an idle stream other than the default one is
// dropped; c10 streams are never destroyed, so this is how their resources are recycled). A
// stream that reaches a wait (mockStreamWaitHost, mockStreamWaitEvent) is parked, holding no thread, until the
// wait resumes it. Workers are woken only when someone
// sleeps: a launch costs a lock and a push while a worker is busy.
//
// Streams have priorities (mockStreamCreateWithPriority; lower runs first): a worker takes the next
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
      std::thread([this] { loop(); }).detach();  // lives as long as the process, as the driver
    }
  }

  std::optional<uint64_t> seed() const { return seed_; }

  // Queue `task` on a stream of `priority` (lower runs first).
  void push(Key key, int priority, Task task) {
    enqueue(key, priority, Entry{std::move(task), {}});
  }

  // Queue a wait: when the stream reaches it, `when_ready(resume)` runs on a worker and the
  // stream runs nothing more until `resume` is called (at once, or later from any thread).
  void push_wait(Key key, int priority, std::function<void(Resume)> when_ready) {
    enqueue(key, priority, Entry{{}, std::move(when_ready)});
  }

  // Until the stream has run everything pushed on it (parked waits included).
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
    Task run;
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
    std::unique_lock<std::mutex> lock(mutex_);
    ++drainers_;
    idle_cv_.wait(lock, done);
    --drainers_;
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
        entry.run();  // never throws: the driver wraps every task
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


}  // namespace mockrt
