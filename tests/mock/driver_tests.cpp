// Unit tests of the mock's driver (backends/mock/csrc/driver/mockrt.h) through its C API
// alone, as a vendor tests their driver before any PyTorch code sits on it. One case per run:
// `driver_tests CASE` prints "ok" and exits 0, or prints what failed and exits 1; the mode is
// the environment's (ACCELKIT_MOCK_ASYNC, ...), as in a process of the mock device.
#include "driver/mockrt.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Failure {
  std::string what;
};

#define EXPECT(cond)                                                              \
  do {                                                                            \
    if (!(cond)) throw Failure{std::string(__FILE__ ":") + std::to_string(__LINE__) + \
                               ": " #cond + " (last message: " + mockGetErrorMessage() + ")"}; \
  } while (0)
#define OK(call) EXPECT((call) == mockSuccess)

bool async_mode() {
  int value = 0;
  OK(mockDeviceGetAttribute(&value, mockDevAttrAsync, 0));
  return value != 0;
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// A kernel running a std::function (owned: deleted once called).
const char* call(void* args, int run) {
  auto* fn = static_cast<std::function<const char*()>*>(args);
  const char* result = run ? (*fn)() : nullptr;
  delete fn;
  return result;
}

mockError_t launch(mockStream_t stream, std::function<const char*()> fn, const char* name = "k") {
  return mockLaunchKernel(stream, name, &call, new std::function<const char*()>(std::move(fn)));
}

// `flag` is set after `ms` of work on the stream.
mockError_t slow_kernel(mockStream_t stream, std::atomic<bool>& flag, int ms) {
  return launch(stream, [&flag, ms]() -> const char* {
    sleep_ms(ms);
    flag = true;
    return nullptr;
  });
}

void device_count() {
  int count = -1;
  OK(mockGetDeviceCount(&count));
  const char* env = std::getenv("ACCELKIT_MOCK_DEVICES");
  EXPECT(count == (env ? std::atoi(env) : 8));
  EXPECT(mockSetDevice(count) == mockErrorInvalidDevice);
  EXPECT(std::strstr(mockGetErrorMessage(), "ACCELKIT_MOCK_DEVICES") != nullptr);
  if (count > 1) {
    OK(mockSetDevice(1));
    int device = -1;
    OK(mockGetDevice(&device));
    EXPECT(device == 1);
    std::thread([] {  // the current device is per thread
      int other = -1;
      mockGetDevice(&other);
      if (other != 0) std::abort();
    }).join();
  }
}

void invalid_settings() {
  int count = -1;
  EXPECT(mockGetDeviceCount(&count) == mockErrorInitialization);
  EXPECT(count == 0);
  const std::string message = mockGetErrorMessage();
  mockStream_t stream = nullptr;
  EXPECT(mockStreamCreateWithPriority(&stream, 0) == mockErrorInitialization);
  EXPECT(message == mockGetErrorMessage());
  std::printf("%s\n", message.c_str());  // the test reads which variable it names
}

void memory() {
  size_t free0 = 0, total = 0;
  OK(mockMemGetInfo(&free0, &total));
  EXPECT(free0 == total);
  void* small = nullptr;
  void* large = nullptr;
  OK(mockMalloc(&small, 1000));
  OK(mockMalloc(&large, size_t{4} << 20));
  size_t free1 = 0;
  OK(mockMemGetInfo(&free1, &total));
  EXPECT(free1 == free0 - 1000 - (size_t{4} << 20));
  EXPECT(reinterpret_cast<uintptr_t>(mockDevicePointerToHost(large)) % (size_t{2} << 20) == 0);
  int host_accessible = 0;
  OK(mockDeviceGetAttribute(&host_accessible, mockDevAttrHostAccessible, 0));
  // Discrete memory: the device pointer is not the host address behind it.
  EXPECT((mockDevicePointerToHost(small) == small) == (host_accessible != 0));
  std::vector<int> in(250), out(250, 0);
  for (int i = 0; i < 250; ++i) in[i] = i * 7;
  OK(mockMemcpy(small, in.data(), 1000, mockMemcpyHostToDevice));
  OK(mockMemcpy(large, small, 1000, mockMemcpyDeviceToDevice));
  OK(mockMemcpy(out.data(), large, 1000, mockMemcpyDeviceToHost));
  EXPECT(out == in);
  int not_ours = 0;
  EXPECT(mockFree(&not_ours) == mockErrorInvalidValue);
  EXPECT(mockMemcpy(out.data(), large, 4, static_cast<mockMemcpyKind>(9)) == mockErrorInvalidValue);
  OK(mockFree(small));
  OK(mockFree(large));
  OK(mockMemGetInfo(&free1, &total));
  EXPECT(free1 == free0);
  void* too_much = nullptr;
  EXPECT(mockMalloc(&too_much, total + 1) == mockErrorMemoryAllocation);
  EXPECT(std::strstr(mockGetErrorMessage(), "ACCELKIT_MOCK_MEMORY") != nullptr);
}

void launch_returns() {
  std::atomic<bool> done{false};
  OK(slow_kernel(nullptr, done, 100));
  if (async_mode()) {
    EXPECT(!done);
    EXPECT(mockStreamQuery(nullptr) == mockErrorNotReady);
    OK(mockStreamSynchronize(nullptr));
  }
  EXPECT(done);
  OK(mockStreamQuery(nullptr));
}

void stream_order() {
  mockStream_t stream = nullptr;
  OK(mockStreamCreateWithPriority(&stream, 0));
  std::vector<int> seen;
  std::mutex mutex;
  for (int i = 0; i < 200; ++i) {
    OK(launch(stream, [&, i]() -> const char* {
      std::lock_guard<std::mutex> lock(mutex);
      seen.push_back(i);
      return nullptr;
    }));
  }
  OK(mockStreamSynchronize(stream));
  EXPECT(seen.size() == 200);
  for (int i = 0; i < 200; ++i) EXPECT(seen[i] == i);
  OK(mockStreamDestroy(stream));
  EXPECT(mockStreamDestroy(nullptr) == mockErrorInvalidResourceHandle);
}

void copy_async() {
  void* device = nullptr;
  OK(mockMalloc(&device, 64));
  std::vector<char> host(64, 'a'), back(64, 0);
  std::atomic<bool> done{false};
  OK(slow_kernel(nullptr, done, 50));
  OK(mockMemcpyAsync(device, host.data(), 64, mockMemcpyHostToDevice, nullptr));
  std::fill(host.begin(), host.end(), 'b');  // the source was staged: reusable at once
  OK(mockMemcpyAsync(back.data(), device, 64, mockMemcpyDeviceToHost, nullptr));
  OK(mockStreamSynchronize(nullptr));
  EXPECT(done);
  EXPECT(back == std::vector<char>(64, 'a'));
  OK(mockFree(device));
}

void events() {
  mockEvent_t start = nullptr, end = nullptr, untimed = nullptr;
  OK(mockEventCreateWithFlags(&start, mockEventDefault));
  OK(mockEventCreateWithFlags(&end, mockEventBlockingSync));
  OK(mockEventCreateWithFlags(&untimed, mockEventDisableTiming));
  OK(mockEventQuery(end));  // never recorded: complete
  float never = 0;
  EXPECT(mockEventElapsedTime(&never, start, end) == mockErrorInvalidResourceHandle);
  OK(mockEventRecord(start, nullptr));
  std::atomic<bool> done{false};
  OK(slow_kernel(nullptr, done, 200));
  OK(mockEventRecord(end, nullptr));
  OK(mockEventRecord(untimed, nullptr));
  if (async_mode()) {
    EXPECT(mockEventQuery(end) == mockErrorNotReady);
    float ms = 0;
    EXPECT(mockEventElapsedTime(&ms, start, end) == mockErrorNotReady);
  }
  OK(mockEventSynchronize(end));
  EXPECT(done);
  OK(mockEventQuery(end));
  float ms = 0;
  OK(mockEventElapsedTime(&ms, start, end));
  EXPECT(ms >= 190 && ms < 5000);  // the work between the records, as the stream ran it
  EXPECT(mockEventElapsedTime(&ms, start, untimed) == mockErrorInvalidResourceHandle);
  int count = 0;
  OK(mockGetDeviceCount(&count));
  if (count > 1) {  // an event records on its own device's streams
    OK(mockSetDevice(1));
    mockStream_t other = nullptr;
    OK(mockStreamCreateWithPriority(&other, 0));
    EXPECT(mockEventRecord(start, other) == mockErrorInvalidResourceHandle);
    OK(mockStreamDestroy(other));
    OK(mockSetDevice(0));
  }
  OK(mockEventDestroy(start));
  OK(mockEventDestroy(end));
  OK(mockEventDestroy(untimed));
}

void wait_event() {
  mockStream_t producer = nullptr, consumer = nullptr;
  OK(mockStreamCreateWithPriority(&producer, 0));
  OK(mockStreamCreateWithPriority(&consumer, 0));
  mockEvent_t ready = nullptr;
  OK(mockEventCreateWithFlags(&ready, mockEventDisableTiming));
  std::atomic<bool> produced{false};
  std::atomic<int> seen{-1};
  OK(slow_kernel(producer, produced, 100));
  OK(mockEventRecord(ready, producer));
  OK(mockStreamWaitEvent(consumer, ready, 0));
  EXPECT(mockStreamWaitEvent(consumer, ready, 1) == mockErrorInvalidValue);
  OK(mockEventDestroy(ready));  // the pending record and the wait keep it
  OK(launch(consumer, [&]() -> const char* {
    seen = produced ? 1 : 0;
    return nullptr;
  }));
  OK(mockStreamSynchronize(consumer));
  EXPECT(seen == 1);
  OK(mockStreamSynchronize(producer));
  OK(mockStreamDestroy(producer));
  OK(mockStreamDestroy(consumer));
}

void priority() {
  // One worker (a seeded schedule): it is busy while both streams get work, then takes the
  // high-priority stream's first.
  int least = 1, greatest = 1;
  OK(mockDeviceGetStreamPriorityRange(&least, &greatest));
  EXPECT(least == 0 && greatest == -3);
  mockStream_t low = nullptr, high = nullptr, busy = nullptr;
  OK(mockStreamCreateWithPriority(&low, least));
  OK(mockStreamCreateWithPriority(&high, greatest - 5));  // clamped to the range
  OK(mockStreamCreateWithPriority(&busy, least));
  std::atomic<bool> flag{false};
  OK(slow_kernel(busy, flag, 50));
  sleep_ms(5);  // the worker is inside it
  std::vector<char> order;
  std::mutex mutex;
  auto mark = [&](char c) {
    return [&, c]() -> const char* {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(c);
      return nullptr;
    };
  };
  for (int i = 0; i < 3; ++i) OK(launch(low, mark('l')));
  for (int i = 0; i < 3; ++i) OK(launch(high, mark('h')));
  OK(mockDeviceSynchronize());
  EXPECT(std::string(order.begin(), order.end()) == "hhhlll");
  for (mockStream_t s : {low, high, busy}) OK(mockStreamDestroy(s));
}

void sticky_error() {
  const mockError_t failed = launch(nullptr, [] { return "out of bounds"; }, "gather");
  if (!async_mode()) {  // a synchronous device reports it at the call, and goes on
    EXPECT(failed == mockErrorLaunchFailure);
    EXPECT(std::string(mockGetErrorMessage()) == "gather failed on device 0: out of bounds");
    OK(mockDeviceSynchronize());
    return;
  }
  OK(failed);
  // The work queued after the error is dropped (released unrun); event records complete.
  auto* kept = new int(0);
  OK(mockLaunchKernel(nullptr, "after", [](void* args, int run) -> const char* {
    if (!run) ++*static_cast<int*>(args);
    return nullptr;
  }, kept));
  mockEvent_t event = nullptr;
  OK(mockEventCreateWithFlags(&event, 0));
  OK(mockEventRecord(event, nullptr));
  OK(mockEventSynchronize(event));
  EXPECT(*kept == 1);
  EXPECT(mockStreamSynchronize(nullptr) == mockErrorLaunchFailure);
  EXPECT(std::string(mockGetErrorMessage()) == "gather failed on device 0: out of bounds");
  OK(mockStreamSynchronize(nullptr));  // reported once
  OK(mockDeviceSynchronize());
  OK(mockEventDestroy(event));
  delete kept;
}

void wait_host() {
  if (!async_mode()) {  // a synchronous device: the caller waits for the host to resume it
    std::atomic<mockWait_t> pending{nullptr};
    std::thread resumer([&] {
      while (pending.load() == nullptr) sleep_ms(1);
      mockWaitResume(pending.load(), nullptr);
    });
    OK(mockStreamWaitHost(nullptr, "gate", [](void* args, mockWait_t wait, int run) {
      if (run) static_cast<std::atomic<mockWait_t>*>(args)->store(wait);
    }, &pending));
    resumer.join();
    return;
  }
  mockStream_t stream = nullptr;
  OK(mockStreamCreateWithPriority(&stream, 0));
  std::atomic<mockWait_t> pending{nullptr};
  OK(mockStreamWaitHost(stream, "gate", [](void* args, mockWait_t wait, int run) {
    if (run) static_cast<std::atomic<mockWait_t>*>(args)->store(wait);
  }, &pending));
  std::atomic<bool> after{false};
  OK(slow_kernel(stream, after, 0));
  sleep_ms(50);
  EXPECT(!after);
  EXPECT(mockStreamQuery(stream) == mockErrorNotReady);
  while (pending.load() == nullptr) sleep_ms(1);
  std::thread([&] { mockWaitResume(pending.load(), "the peer left"); }).join();
  EXPECT(mockStreamSynchronize(stream) == mockErrorLaunchFailure);
  EXPECT(std::string(mockGetErrorMessage()) == "gate failed on device 0: the peer left");
  EXPECT(!after);  // the error stops the work after it
  OK(mockStreamDestroy(stream));
}

void destroy_drains() {
  mockStream_t stream = nullptr;
  OK(mockStreamCreateWithPriority(&stream, 0));
  std::atomic<bool> done{false};
  OK(slow_kernel(stream, done, 50));
  OK(mockStreamDestroy(stream));
  EXPECT(done);
}

void launch_blocking() {
  std::atomic<bool> done{false};
  OK(slow_kernel(nullptr, done, 50));
  EXPECT(done);
  EXPECT(launch(nullptr, [] { return "bad"; }, "k") == mockErrorLaunchFailure);
  OK(mockStreamSynchronize(nullptr));
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, void (*)()> cases = {
      {"device_count", device_count}, {"invalid_settings", invalid_settings},
      {"memory", memory}, {"launch_returns", launch_returns}, {"stream_order", stream_order},
      {"copy_async", copy_async}, {"events", events}, {"wait_event", wait_event},
      {"priority", priority}, {"sticky_error", sticky_error}, {"wait_host", wait_host},
      {"destroy_drains", destroy_drains}, {"launch_blocking", launch_blocking}};
  if (argc != 2 || cases.count(argv[1]) == 0) {
    std::printf("usage: driver_tests CASE; cases:");
    for (const auto& [name, _] : cases) std::printf(" %s", name.c_str());
    std::printf("\n");
    return 2;
  }
  try {
    cases.at(argv[1])();
  } catch (const Failure& failure) {
    std::printf("%s\n", failure.what.c_str());
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
