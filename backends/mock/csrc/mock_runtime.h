// The mock's runtime: accelkit's Runtime seam (<accelkit/runtime.h>) implemented by calling
// the mock's driver (driver/mockrt.h), as a vendor's port calls cudart, ACL or Level Zero. It
// holds no device logic of its own: each function is the driver call that does the work, the
// translation of its arguments (device indices to the driver's current device, accelkit's
// event flags to the driver's) and of its errors (a driver error becomes a torch error naming
// the call and the driver's message). A vendor keeps this file's shape and replaces each
// mock* call with their driver's (the comments name the CUDA call), and driver/ with their
// driver.
//
// One thing the seam asks that no driver does: calls that wait for queued work let go of
// Python's GIL while they wait (queued work may need it: the last reference to a tensor whose
// Python object it frees), as a driver's blocking calls must not hold a host lock its
// callbacks take.
#pragma once

#include <Python.h>  // the mock lives in a Python extension: its waits let go of the GIL

#include "driver/mockrt.h"

#include <accelkit/runtime.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace accelkit_mock {

class MockRuntime final : public accelkit::Runtime {
 public:
  MockRuntime() {
    int count = 0;
    if (mockGetDeviceCount(&count) != mockSuccess) {
      error_ = mockGetErrorMessage();
      return;
    }
    if (count == 0) return;  // no card: nothing to ask it
    int value = 0;
    check(mockDeviceGetAttribute(&value, mockDevAttrHostAccessible, 0), "mockDeviceGetAttribute");
    host_accessible_ = value != 0;
    check(mockDeviceGetAttribute(&value, mockDevAttrAsync, 0), "mockDeviceGetAttribute");
    async_ = value != 0;
    check(mockDeviceGetAttribute(&value, mockDevAttrLaunchBlocking, 0), "mockDeviceGetAttribute");
    launch_blocking_ = value != 0;
  }

  // The seed of ACCELKIT_MOCK_SCHEDULE, if the streams run under one.
  std::optional<uint64_t> schedule_seed() const {
    int seeded = 0;
    uint64_t seed = 0;
    if (mockGetScheduleSeed(&seeded, &seed) != mockSuccess || !seeded) return std::nullopt;
    return seed;
  }

  // The driver's configuration error, if any (the Python package raises it; device_count() is 0).
  const std::string& config_error() const { return error_; }

  // CUDA: cudaGetDeviceCount.
  int device_count() noexcept override {
    int count = 0;
    return mockGetDeviceCount(&count) == mockSuccess ? count : 0;
  }

  // CUDA: cudaSetDevice.
  void set_device(int device) override { check(mockSetDevice(device), "mockSetDevice"); }

  // CUDA: cudaMemGetInfo (total).
  size_t capacity(int device) override {
    use(device);
    size_t free_bytes = 0, total = 0;
    check(mockMemGetInfo(&free_bytes, &total), "mockMemGetInfo");
    return total;
  }

  // CUDA: cudaMalloc; out of memory is nullptr (the layer raises torch.OutOfMemoryError).
  void* allocate(int device, size_t nbytes) override {
    use(device);
    void* ptr = nullptr;
    const mockError_t error = mockMalloc(&ptr, nbytes);
    if (error == mockErrorMemoryAllocation) return nullptr;
    check(error, "mockMalloc");
    return ptr;
  }

  // CUDA: cudaFree.
  void release(int /*device*/, void* ptr) noexcept override { mockFree(ptr); }

  // The host address behind a device pointer: what the mock's kernels (host code) compute on.
  void* host_address(const void* device_ptr) const noexcept {
    return mockDevicePointerToHost(device_ptr);
  }

  // CUDA: cudaMallocHost / cudaFreeHost.
  void* allocate_pinned(size_t nbytes) override {
    void* ptr = nullptr;
    return mockMallocHost(&ptr, nbytes) == mockSuccess ? ptr : nullptr;
  }
  void release_pinned(void* ptr) noexcept override { mockFreeHost(ptr); }

  // CUDA: cudaMemcpy / cudaMemcpyPeer.
  void copy(void* dst, int dst_device, const void* src, int src_device,
            size_t nbytes) override {
    check(mockMemcpy(dst, src, nbytes, kind(dst_device, src_device)), "mockMemcpy");
  }

  // CUDA: cudaDeviceSynchronize.
  void synchronize(int device) override {
    use(device);
    raise(waiting([] { return mockDeviceSynchronize(); }), "mockDeviceSynchronize");
  }

  bool host_accessible() const noexcept override { return host_accessible_; }

  bool async() const noexcept override { return async_; }

  // ACCELKIT_MOCK_LAUNCH_BLOCKING=1: every launch waits for its stream on the host.
  bool launch_blocking() const noexcept { return launch_blocking_; }

  // CUDA: cudaDeviceGetStreamPriorityRange.
  std::pair<int, int> stream_priority_range(int device) override {
    use(device);
    int least = 0, greatest = 0;
    check(mockDeviceGetStreamPriorityRange(&least, &greatest), "mockDeviceGetStreamPriorityRange");
    return {least, greatest};
  }

  // CUDA: cudaStreamCreateWithPriority.
  accelkit::DriverStream stream_create(int device, int priority) override {
    use(device);
    mockStream_t stream = nullptr;
    check(mockStreamCreateWithPriority(&stream, priority), "mockStreamCreateWithPriority");
    return stream;
  }

  // CUDA: cudaStreamDestroy.
  void stream_destroy(int /*device*/, accelkit::DriverStream stream) noexcept override {
    waiting([stream] { return mockStreamDestroy(as_stream(stream)); });
  }

  // CUDA: a kernel launch (cudaLaunchHostFunc for host code). On a synchronous device the
  // kernel runs inside the call, and its exception reaches the caller as it was thrown.
  void launch(int device, accelkit::DriverStream stream, const char* what,
              std::function<void()> fn) override {
    use(device);
    if (!async_) {
      Kernel kernel{std::move(fn), nullptr};
      const mockError_t error = mockLaunchKernel(as_stream(stream), what, &run_here, &kernel);
      if (kernel.error) std::rethrow_exception(kernel.error);
      check(error, "mockLaunchKernel");
      return;
    }
    auto* kernel = new Kernel{std::move(fn), nullptr};
    auto submit = [&] { return mockLaunchKernel(as_stream(stream), what, &run_queued, kernel); };
    raise(launch_blocking_ ? waiting(submit) : submit(), "mockLaunchKernel");
  }

  // CUDA: cuStreamWaitValue32 on a flag the host writes.
  void stream_wait(int device, accelkit::DriverStream stream, const char* what,
                   std::function<void(Resume)> when_ready) override {
    use(device);
    auto* wait = new std::function<void(Resume)>(std::move(when_ready));
    auto submit = [&] { return mockStreamWaitHost(as_stream(stream), what, &wait_ready, wait); };
    if (async_) {
      raise(submit(), "mockStreamWaitHost");
    } else {
      check(waiting(submit), "mockStreamWaitHost");  // the host resumed it with an error
    }
  }

  // CUDA: cudaMemcpyAsync.
  void copy_async(void* dst, int dst_device, const void* src, int src_device, size_t nbytes,
                  int device, accelkit::DriverStream stream) override {
    use(device);
    auto submit = [&] {
      return mockMemcpyAsync(dst, src, nbytes, kind(dst_device, src_device), as_stream(stream));
    };
    raise(launch_blocking_ ? waiting(submit) : submit(), "mockMemcpyAsync");
  }

  // CUDA: cudaStreamQuery.
  bool stream_query(int device, accelkit::DriverStream stream) override {
    use(device);
    const mockError_t error = mockStreamQuery(as_stream(stream));
    if (error == mockErrorNotReady) return false;
    check(error, "mockStreamQuery");
    return true;
  }

  // CUDA: cudaStreamSynchronize.
  void stream_synchronize(int device, accelkit::DriverStream stream) override {
    use(device);
    mockStream_t s = as_stream(stream);
    const bool idle = mockStreamQuery(s) == mockSuccess;
    raise(idle ? mockStreamSynchronize(s) : waiting([s] { return mockStreamSynchronize(s); }),
          "mockStreamSynchronize");
  }

  // CUDA: cudaEventCreateWithFlags.
  accelkit::DriverEvent event_create(int device, unsigned flags) override {
    use(device);
    unsigned driver_flags = (flags & kEventTiming) != 0 ? mockEventDefault : mockEventDisableTiming;
    if ((flags & kEventBlockingSync) != 0) driver_flags |= mockEventBlockingSync;
    mockEvent_t event = nullptr;
    check(mockEventCreateWithFlags(&event, driver_flags), "mockEventCreateWithFlags");
    return event;
  }

  // CUDA: cudaEventDestroy.
  void event_destroy(int /*device*/, accelkit::DriverEvent event) noexcept override {
    mockEventDestroy(as_event(event));
  }

  // CUDA: cudaEventRecord.
  void event_record(int device, accelkit::DriverEvent event,
                    accelkit::DriverStream stream) override {
    use(device);
    check(mockEventRecord(as_event(event), as_stream(stream)), "mockEventRecord");
  }

  // CUDA: cudaStreamWaitEvent.
  void stream_wait_event(int device, accelkit::DriverStream stream,
                         accelkit::DriverEvent event) override {
    use(device);
    check(mockStreamWaitEvent(as_stream(stream), as_event(event), 0), "mockStreamWaitEvent");
  }

  // CUDA: cudaEventQuery.
  bool event_query(accelkit::DriverEvent event) override {
    const mockError_t error = mockEventQuery(as_event(event));
    if (error == mockErrorNotReady) return false;
    check(error, "mockEventQuery");
    return true;
  }

  // CUDA: cudaEventSynchronize.
  void event_synchronize(accelkit::DriverEvent event) override {
    mockEvent_t e = as_event(event);
    if (mockEventQuery(e) == mockSuccess) return;
    check(waiting([e] { return mockEventSynchronize(e); }), "mockEventSynchronize");
  }

  // CUDA: cudaEventElapsedTime.
  double event_elapsed_ms(accelkit::DriverEvent start, accelkit::DriverEvent end) override {
    float ms = 0;
    check(mockEventElapsedTime(&ms, as_event(start), as_event(end)), "mockEventElapsedTime");
    return ms;
  }

  std::string capacity_hint() const override {
    return "Set ACCELKIT_MOCK_MEMORY (e.g. ACCELKIT_MOCK_MEMORY=16GiB) to change the capacity "
           "of each mock device.";
  }
  std::string device_count_hint() const override {
    return "Set ACCELKIT_MOCK_DEVICES to change the number of mock devices.";
  }

 private:
  // A launched kernel: the layer's function and, on a synchronous device, its exception.
  struct Kernel {
    std::function<void()> fn;
    std::exception_ptr error;
  };

  static const char* describe(std::exception_ptr error) {
    thread_local std::string message;  // valid until this thread's next kernel (mockrt.h)
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "an unknown error";
    }
    return message.c_str();
  }

  // mockKernel_t of a kernel run inside the launch (the Kernel lives on the caller's stack).
  static const char* run_here(void* args, int run) {
    auto* kernel = static_cast<Kernel*>(args);
    if (!run) return nullptr;
    try {
      kernel->fn();
    } catch (...) {
      kernel->error = std::current_exception();
      return describe(kernel->error);
    }
    return nullptr;
  }

  // mockKernel_t of a queued kernel: it owns the Kernel (its captures go once it ran).
  static const char* run_queued(void* args, int run) {
    std::unique_ptr<Kernel> kernel(static_cast<Kernel*>(args));
    if (!run) return nullptr;
    try {
      kernel->fn();
    } catch (...) {
      return describe(std::current_exception());
    }
    return nullptr;
  }

  // mockWaitFn_t: hands the layer's condition a Resume that resumes the driver's wait.
  static void wait_ready(void* args, mockWait_t wait, int run) {
    std::unique_ptr<std::function<void(Resume)>> when_ready(
        static_cast<std::function<void(Resume)>*>(args));
    if (!run) return;
    (*when_ready)([wait](std::exception_ptr error) {
      mockWaitResume(wait, error ? describe(error) : nullptr);
    });
  }

  static mockStream_t as_stream(accelkit::DriverStream stream) {
    return static_cast<mockStream_t>(stream);
  }
  static mockEvent_t as_event(accelkit::DriverEvent event) {
    return static_cast<mockEvent_t>(event);
  }

  static mockMemcpyKind kind(int dst_device, int src_device) {
    const bool from_host = src_device == accelkit::kHost;
    if (dst_device == accelkit::kHost) return from_host ? mockMemcpyHostToHost : mockMemcpyDeviceToHost;
    return from_host ? mockMemcpyHostToDevice : mockMemcpyDeviceToDevice;
  }

  // The driver's current device for the calls that follow (its default stream, its memory).
  static void use(int device) { check(mockSetDevice(device), "mockSetDevice"); }

  // `call`, with Python's GIL let go of meanwhile if this thread holds it.
  template <typename Call>
  static mockError_t waiting(Call call) {
    PyThreadState* released =
        Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
    const mockError_t error = call();
    if (released != nullptr) PyEval_RestoreThread(released);
    return error;
  }

  static void check(mockError_t error, const char* call) {
    if (error == mockSuccess) return;
    TORCH_CHECK(false, "mock: ", call, " failed (", mockGetErrorName(error), "): ",
                mockGetErrorMessage());
  }

  // As check, for the calls that report errors of queued work (mockErrorLaunchFailure).
  static void raise(mockError_t error, const char* call) {
    if (error != mockErrorLaunchFailure) return check(error, call);
    TORCH_CHECK(false, "mock: an asynchronous operation failed: ", mockGetErrorMessage(),
                " (ACCELKIT_MOCK_LAUNCH_BLOCKING=1 raises it where it is issued)");
  }

  bool host_accessible_ = true;
  bool async_ = false;
  bool launch_blocking_ = false;
  std::string error_;
};

}  // namespace accelkit_mock
