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

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace accelkit {

// A device index, or kHost for host (CPU) memory in Runtime::copy.
constexpr int kHost = -1;

// A driver's stream and event objects (see Runtime's streams and events), opaque to accelkit.
using DriverStream = void*;
using DriverEvent = void*;

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

  // ---- Streams and events ------------------------------------------------------------------
  // A device whose work runs in queues (streams) overrides these together and returns true
  // from async(); the defaults describe a synchronous device, whose work is complete when the
  // call that issued it returns. Streams and events are the driver's objects, opaque to the
  // layer (cudaStream_t / cudaEvent_t, aclrtStream / aclrtEvent, a Level Zero command queue /
  // ze_event_handle_t); a null DriverStream is the device's default stream. The layer maps c10
  // streams onto driver streams as c10/cuda/CUDAStream.cpp does (a per-device, per-priority pool
  // created on first use and handed out round-robin, the default stream, external streams) and
  // torch.Event onto driver events; a kernel launches on the DriverStream current_stream()
  // gives (<accelkit/context.h>).

  virtual bool async() const noexcept { return false; }

  // Stream priorities of `device` as {least, greatest}: lower numbers run first, as
  // cudaDeviceGetStreamPriorityRange (CUDA: {0, -5}; Ascend: aclrtCreateStreamWithConfig's
  // priority). The layer uses up to kStreamPriorities levels from `least` toward `greatest`;
  // {0, 0} (the default): one priority.
  static constexpr int kStreamPriorities = 4;
  virtual std::pair<int, int> stream_priority_range(int device) {
    (void)device;
    return {0, 0};
  }

  // A new stream on `device` with `priority` (within stream_priority_range); the layer creates
  // its pool's streams once and never destroys them while the device is in use, as CUDA's.
  // CUDA: cudaStreamCreateWithPriority(cudaStreamNonBlocking). Ascend: aclrtCreateStream.
  // Level Zero: zeCommandQueueCreate / zeCommandListCreateImmediate. The default gives each call
  // a distinct handle that means nothing to a synchronous device.
  virtual DriverStream stream_create(int device, int priority);
  // CUDA: cudaStreamDestroy. Ascend: aclrtDestroyStream.
  virtual void stream_destroy(int device, DriverStream stream) noexcept {
    (void)device, (void)stream;
  }

  // Run `fn` on the host in `stream`'s order: after the work queued on it before, before the
  // work queued after. An exception from `fn` is raised, naming `what`, by the next
  // synchronizing call (synchronize, stream_synchronize, a copy to the host). This is how a
  // device kernel computed on the host is launched, and how the default events are built.
  // CUDA: cudaLaunchHostFunc (a kernel launch for device code). Ascend: aclrtLaunchCallback.
  virtual void launch(int device, DriverStream stream, const char* what,
                      std::function<void()> fn) {
    (void)device, (void)stream, (void)what;
    fn();
  }

  // How a stream's wait resumes: called once, with the error the waiting stream then carries
  // (nullptr for none; the runtime raises it as an error of the stream's work).
  using Resume = std::function<void(std::exception_ptr)>;

  // Make `stream` wait for a condition the host fulfils (a collective's completion), in
  // `stream`'s order: once the stream reaches the wait the runtime calls `when_ready(resume)`,
  // which calls `resume` exactly once, at once if the condition holds, else later from the
  // thread that fulfils it; the work queued after the wait runs after that. A runtime that runs
  // streams on a bounded set of threads parks the stream meanwhile instead of blocking a thread
  // (the mock does); the default launches a task that blocks until `resume`, which needs a
  // thread per stream. CUDA: cuStreamWaitValue32 on a flag the host writes (NCCL's own work
  // runs on its stream instead). Ascend: aclrtStreamWaitEvent on an event the host records.
  virtual void stream_wait(int device, DriverStream stream, const char* what,
                           std::function<void(Resume)> when_ready);

  // Copy in `stream`'s order (`device` is the device of the stream). Host memory given as
  // `src` may be reused as soon as the call returns (pageable memory is staged); host memory
  // given as `dst` holds the data once the stream reaches the copy. CUDA: cudaMemcpyAsync.
  // Ascend: aclrtMemcpyAsync. Level Zero: zeCommandListAppendMemoryCopy.
  virtual void copy_async(void* dst, int dst_device, const void* src, int src_device,
                          size_t nbytes, int device, DriverStream stream) {
    (void)device, (void)stream;
    copy(dst, dst_device, src, src_device, nbytes);
  }

  // Wait until all work queued on `stream` is done; raises the first error of the device's
  // work. CUDA: cudaStreamSynchronize. Ascend: aclrtSynchronizeStream.
  virtual void stream_synchronize(int device, DriverStream stream) {
    (void)device, (void)stream;
  }

  // True when all work queued on `stream` is done. CUDA: cudaStreamQuery. Ascend:
  // aclrtStreamQuery. Level Zero: zeCommandQueueSynchronize(queue, 0).
  virtual bool stream_query(int device, DriverStream stream) {
    (void)device, (void)stream;
    return true;
  }

  // Events: markers in a stream's order. event_record(e, stream) makes `e` complete when the
  // stream reaches that point (a later record replaces the earlier one, as CUDA's); a wait on
  // `e` or a query of it is for its latest record at the time of the call; an event never
  // recorded is complete. With kEventTiming the driver takes a timestamp when the stream
  // reaches the record, and event_elapsed_ms gives the milliseconds between two completed
  // records. The defaults build all of this on launch and stream_wait (a marker task that
  // completes the event and reads the host clock when the stream runs it), which is exact for
  // a device whose kernels run as host functions; a driver with events of its own overrides
  // them all together.
  enum EventFlags : unsigned {
    kEventDefault = 0,
    kEventTiming = 1,        // timestamps for event_elapsed_ms (cudaEventDefault, not
                             // cudaEventDisableTiming)
    kEventBlockingSync = 2,  // event_synchronize sleeps instead of spinning
                             // (cudaEventBlockingSync)
  };
  // CUDA: cudaEventCreateWithFlags. Ascend: aclrtCreateEventWithFlag. Level Zero:
  // zeEventCreate (in a pool with ZE_EVENT_POOL_FLAG_KERNEL_TIMESTAMP for timing).
  virtual DriverEvent event_create(int device, unsigned flags);
  // CUDA: cudaEventDestroy (an event still pending is released once it completes).
  virtual void event_destroy(int device, DriverEvent event) noexcept;
  // CUDA: cudaEventRecord. Ascend: aclrtRecordEvent. Level Zero:
  // zeCommandListAppendSignalEvent.
  virtual void event_record(int device, DriverEvent event, DriverStream stream);
  // `stream` runs the work queued after this call only once `event`'s latest record has
  // completed; no host thread waits. CUDA: cudaStreamWaitEvent. Ascend: aclrtStreamWaitEvent.
  // Level Zero: zeCommandListAppendWaitOnEvents.
  virtual void stream_wait_event(int device, DriverStream stream, DriverEvent event);
  // True when the latest record has completed. CUDA: cudaEventQuery. Ascend:
  // aclrtQueryEventStatus. Level Zero: zeEventQueryStatus.
  virtual bool event_query(DriverEvent event);
  // Block the host until the latest record has completed. CUDA: cudaEventSynchronize. Ascend:
  // aclrtSynchronizeEvent. Level Zero: zeEventHostSynchronize.
  virtual void event_synchronize(DriverEvent event);
  // Milliseconds from `start`'s timestamp to `end`'s, both recorded with kEventTiming and
  // complete (the layer checks both first). CUDA: cudaEventElapsedTime. Ascend:
  // aclrtEventElapsedTime. Level Zero: zeEventQueryKernelTimestamp.
  virtual double event_elapsed_ms(DriverEvent start, DriverEvent end);

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
