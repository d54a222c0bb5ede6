// accelkit runtime interface: the part of a PrivateUse1 device a vendor replaces with calls
// into their driver. Everything else in accelkit's C++ layer (allocator, guard, streams,
// generator, hooks, kernels, fallback) is written against this interface and knows no device
// name: the name comes from torch.utils.rename_privateuse1_backend
// (c10::get_privateuse1_backend()).
//
// A backend hands its Runtime to accelkit::register_device (<accelkit/register.h>) once, from
// its extension's init. See backends/mock/csrc/mock_runtime.h for the reference
// implementation over host memory.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace accelkit {

// A device index, or kHost for host (CPU) memory in Runtime::copy.
constexpr int kHost = -1;

class Runtime {
 public:
  virtual ~Runtime() = default;

  // Number of devices; must not throw (report 0 if the driver is unusable).
  // CUDA: cudaGetDeviceCount. Ascend: aclrtGetDeviceCount.
  virtual int device_count() noexcept = 0;

  // Make `device` current for the calling thread's driver calls (the layer keeps the
  // per-thread index itself and calls this when it changes).
  // CUDA: cudaSetDevice. Ascend: aclrtSetDevice.
  virtual void set_device(int device) = 0;

  // Bytes of memory on `device` the allocator may hand out (its capacity).
  // CUDA: cudaMemGetInfo (total). Ascend: aclrtGetMemInfo.
  virtual size_t capacity(int device) = 0;

  // Allocate `nbytes` (> 0) on `device`; nullptr when the driver is out of memory (the layer
  // then raises torch.OutOfMemoryError). CUDA: cudaMalloc. Ascend: aclrtMalloc.
  virtual void* allocate(int device, size_t nbytes) = 0;

  // Free memory returned by allocate. CUDA: cudaFree. Ascend: aclrtFree.
  virtual void release(int device, void* ptr) noexcept = 0;

  // Page-locked host memory for pin_memory(). CUDA: cudaHostAlloc / cudaFreeHost.
  virtual void* allocate_pinned(size_t nbytes) = 0;
  virtual void release_pinned(void* ptr) noexcept = 0;

  // Copy `nbytes` between host and device memory or between two devices; a device of kHost
  // means host memory. Synchronous: complete when it returns; not ordered with work queued on
  // streams (the layer orders its copies with copy_async). CUDA: cudaMemcpy / cudaMemcpyPeer.
  // Ascend: aclrtMemcpy.
  virtual void copy(void* dst, int dst_device, const void* src, int src_device,
                    size_t nbytes) = 0;

  // Wait until all work queued on `device` is done; raises the first error of that work.
  // CUDA: cudaDeviceSynchronize. Ascend: aclrtSynchronizeDevice.
  virtual void synchronize(int device) = 0;

  // ---- Asynchronous execution -------------------------------------------------------------
  // A device whose work runs in queues (streams) overrides these together and returns true
  // from async(); the defaults describe a synchronous device, whose work is complete when the
  // call that issued it returns. Streams are c10 stream ids of a device (0: its default
  // stream). accelkit builds events, stream waits and the stream-ordered allocator on them.

  virtual bool async() const noexcept { return false; }

  // Run `fn` on the host in `stream`'s order: after the work queued on it before, before the
  // work queued after. An exception from `fn` is raised, naming `what`, by the next
  // synchronizing call (synchronize, stream_synchronize, a copy to the host). This is how the
  // layer's events and waits are built, and how a device kernel computed on the host is
  // launched. CUDA: cudaLaunchHostFunc (a kernel launch for device code).
  virtual void launch(int device, int64_t stream, const char* what, std::function<void()> fn) {
    (void)device, (void)stream, (void)what;
    fn();
  }

  // How a stream's wait resumes: called once, with the error the waiting stream then carries
  // (nullptr for none; the runtime raises it as an error of the stream's work).
  using Resume = std::function<void(std::exception_ptr)>;

  // Make `stream` wait for a condition the host or another stream fulfils (an event's record,
  // a collective's completion), in `stream`'s order: once the stream reaches the wait the
  // runtime calls `when_ready(resume)`, which calls `resume` exactly once, at once if the
  // condition holds, else later from the thread that fulfils it; the work queued after the
  // wait runs after that. A runtime that runs streams on a bounded set of threads parks the
  // stream meanwhile instead of blocking a thread (the mock does); the default launches a
  // task that blocks until `resume`, which needs a thread per stream.
  // CUDA: cudaStreamWaitEvent (cuStreamWaitValue32 for a flag the host sets).
  virtual void stream_wait(int device, int64_t stream, const char* what,
                           std::function<void(Resume)> when_ready) {
    launch(device, stream, what, [when_ready = std::move(when_ready)] {
      struct Latch {
        std::mutex mutex;
        std::condition_variable cv;
        bool done = false;
        std::exception_ptr error;
      };
      auto latch = std::make_shared<Latch>();
      when_ready([latch](std::exception_ptr error) {
        {
          std::lock_guard<std::mutex> lock(latch->mutex);
          latch->done = true;
          latch->error = error;
        }
        latch->cv.notify_all();
      });
      std::unique_lock<std::mutex> lock(latch->mutex);
      latch->cv.wait(lock, [&] { return latch->done; });
      if (latch->error) std::rethrow_exception(latch->error);
    });
  }

  // Copy in `stream`'s order (`device` is the device of the stream). Host memory given as
  // `src` may be reused as soon as the call returns (pageable memory is staged); host memory
  // given as `dst` holds the data once the stream reaches the copy. CUDA: cudaMemcpyAsync.
  virtual void copy_async(void* dst, int dst_device, const void* src, int src_device,
                          size_t nbytes, int device, int64_t stream) {
    (void)device, (void)stream;
    copy(dst, dst_device, src, src_device, nbytes);
  }

  // Wait until all work queued on `stream` is done; raises the first error of the device's
  // work. CUDA: cudaStreamSynchronize.
  virtual void stream_synchronize(int device, int64_t stream) { (void)device, (void)stream; }

  // True when all work queued on `stream` is done. CUDA: cudaStreamQuery.
  virtual bool stream_query(int device, int64_t stream) {
    (void)device, (void)stream;
    return true;
  }

  // True when device memory is ordinary host memory the CPU can read and write (the mock,
  // unified-memory parts). The layer then runs ops without a native kernel as CPU kernels
  // directly on device memory (zero copy); otherwise it runs them on host copies of the
  // arguments and copies results back (the fallback), and generates random numbers on the
  // host, then copies them.
  virtual bool host_accessible() const noexcept = 0;

  // A sentence appended to out-of-memory and invalid-device errors saying how to change
  // the capacity or the device count (e.g. an environment variable); may be empty.
  virtual std::string capacity_hint() const { return ""; }
  virtual std::string device_count_hint() const { return ""; }
};

// The runtime registered with accelkit::register_device; raises if there is none.
Runtime& runtime();

}  // namespace accelkit
