/* mockrt: the mock device's driver, a fake hardware library with a C API in the style of the
 * CUDA runtime (cudart). It is what a vendor's own driver is to their PyTorch port: the
 * integration layer (../mock_runtime.h, accelkit's Runtime seam) calls these functions as a
 * CUDA port calls cudaStreamCreate or an Ascend port calls aclrtCreateStream, and knows
 * nothing of how they work. Each function names the CUDA, Ascend (ACL) and Level Zero call it
 * stands for: a vendor replaces this library with theirs and the adapter's calls with those.
 *
 * The hardware it fakes is a device whose memory is host memory and whose work runs in queues
 * (streams) on a few worker threads, in the modes accelkit must serve, read from the
 * environment once, at the first call:
 *   ACCELKIT_MOCK_DEVICES       device count (default 8; under torchrun, the host's ranks,
 *                               LOCAL_WORLD_SIZE; 0: a host without the card)
 *   ACCELKIT_MOCK_MEMORY        capacity per device (default 8GiB; B, KB/MB/GB/TB powers of
 *                               1000, K/M/G/T and KiB/MiB/GiB/TiB powers of 1024)
 *   ACCELKIT_MOCK_HOST_ACCESSIBLE=0   discrete memory: device pointers carry a high address bit
 *                               the CPU faults on, so only mockMemcpy* (and kernels, through
 *                               mockDevicePointerToHost) reach the memory
 *   ACCELKIT_MOCK_ASYNC=1       asynchronous: launches and copies return at once and run when
 *                               their stream reaches them; otherwise every call completes
 *                               before it returns
 *   ACCELKIT_MOCK_SCHEDULE=<seed>     (with ASYNC=1) one worker runs the streams in an order
 *                               drawn from the seed: an ordering bug reproduces with its seed
 *   ACCELKIT_MOCK_LAUNCH_BLOCKING=1   every launch and copy waits for its stream
 * Invalid settings make mockGetDeviceCount fail with mockErrorInitialization and a message
 * naming the variable and a valid value; every other call then fails the same way.
 *
 * Errors: every call returns a mockError_t; mockGetErrorMessage() gives the calling thread's
 * message for its last failed call (what failed, on which device, and why). An error of queued
 * work is sticky, as CUDA's: the device runs none of the work queued after it (its waits pass
 * and its event records complete, so every host wait returns) and the next synchronizing call
 * on the device (mockDeviceSynchronize, mockStreamSynchronize, and a launch under
 * ACCELKIT_MOCK_LAUNCH_BLOCKING=1) returns mockErrorLaunchFailure with the first message, once.
 *
 * Threads: the current device is per host thread (mockSetDevice), as cudart's. Host functions
 * run on the driver's worker threads and may call the driver, but must not wait for work of
 * their own stream. The driver takes no host lock of its caller: a caller holding a lock that
 * queued work needs (Python's GIL) lets go of it around calls that wait (the adapter does). */
#ifndef MOCKRT_H
#define MOCKRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mockError {
  mockSuccess = 0,
  mockErrorNotReady = 1,            /* a query: work still pending (cudaErrorNotReady) */
  mockErrorInvalidValue = 2,        /* a null or out-of-range argument */
  mockErrorInvalidDevice = 3,       /* no such device (cudaErrorInvalidDevice) */
  mockErrorMemoryAllocation = 4,    /* out of device or host memory */
  mockErrorInvalidResourceHandle = 5, /* a stream or event used where it cannot be (another
                                         device's, timing disabled, never recorded) */
  mockErrorLaunchFailure = 6,       /* work failed (cudaErrorLaunchFailure) */
  mockErrorInitialization = 7       /* the settings are invalid (cudaErrorInitializationError) */
} mockError_t;

/* A stream: a queue of work run in order. NULL is the current device's default stream, at the
 * lowest priority. */
typedef struct mockStream* mockStream_t;
/* An event: a marker in a stream's order, with a timestamp. */
typedef struct mockEvent* mockEvent_t;
/* A host-signalled wait in progress (mockStreamWaitHost). */
typedef struct mockWait* mockWait_t;

typedef enum mockMemcpyKind {
  mockMemcpyHostToHost = 0,
  mockMemcpyHostToDevice = 1,
  mockMemcpyDeviceToHost = 2,
  mockMemcpyDeviceToDevice = 3
} mockMemcpyKind;

typedef enum mockDeviceAttr {
  mockDevAttrHostAccessible = 1, /* 1: the CPU can use device pointers as host addresses
                                    (unified memory; cudaDevAttrPageableMemoryAccess) */
  mockDevAttrAsync = 2,          /* 1: work runs when its stream reaches it (0: every call
                                    completes before it returns) */
  mockDevAttrLaunchBlocking = 3  /* 1: every launch waits for its stream (CUDA_LAUNCH_BLOCKING) */
} mockDeviceAttr;

/* Event flags, as cudaEventCreateWithFlags's. */
enum {
  mockEventDefault = 0,
  mockEventBlockingSync = 1,  /* mockEventSynchronize sleeps (it always does here) */
  mockEventDisableTiming = 2  /* no timestamp: mockEventElapsedTime refuses the event */
};

/* A kernel: host code that runs when its stream reaches it. Called exactly once: with run = 1
 * to do the work, returning NULL or a message saying why it failed (it must stay valid until
 * the kernel's thread calls the next kernel); with run = 0 when the device drops it unrun (the
 * work queued after an error), only to release what `args` holds. */
typedef const char* (*mockKernel_t)(void* args, int run);

/* Called when a stream reaches a mockStreamWaitHost, with run = 1 and the wait to resume; with
 * run = 0 (and no wait) when the device drops it after an error, to release `args`. */
typedef void (*mockWaitFn_t)(void* args, mockWait_t wait, int run);

/* ---- Errors ------------------------------------------------------------------------------ */
/* The name of an error code. CUDA: cudaGetErrorName. Ascend: aclGetRecentErrMsg. */
const char* mockGetErrorName(mockError_t error);
/* The calling thread's message for its last failed call ("" if none). */
const char* mockGetErrorMessage(void);

/* ---- Devices ----------------------------------------------------------------------------- */
/* CUDA: cudaGetDeviceCount. Ascend: aclrtGetDeviceCount. Level Zero: zeDeviceGet. */
mockError_t mockGetDeviceCount(int* count);
/* The calling thread's current device. CUDA: cudaSetDevice / cudaGetDevice. Ascend:
 * aclrtSetDevice / aclrtGetDevice. Level Zero: the device handle passed to each call. */
mockError_t mockSetDevice(int device);
mockError_t mockGetDevice(int* device);
/* CUDA: cudaDeviceGetAttribute. Ascend: aclGetDeviceCapability. Level Zero:
 * zeDeviceGetProperties. */
mockError_t mockDeviceGetAttribute(int* value, mockDeviceAttr attr, int device);
/* Free and total memory of the current device. CUDA: cudaMemGetInfo. Ascend: aclrtGetMemInfo.
 * Level Zero: zeDeviceGetMemoryProperties. */
mockError_t mockMemGetInfo(size_t* free_bytes, size_t* total_bytes);
/* Every stream of the current device has run what was queued on it; its first error, once.
 * CUDA: cudaDeviceSynchronize. Ascend: aclrtSynchronizeDevice. Level Zero:
 * zeCommandQueueSynchronize on each queue. */
mockError_t mockDeviceSynchronize(void);
/* The seed of ACCELKIT_MOCK_SCHEDULE: *seeded is 1 and *seed set if the streams run under one.
 * (No real driver has it: a simulator's reproducible interleaving.) */
mockError_t mockGetScheduleSeed(int* seeded, uint64_t* seed);

/* ---- Memory ------------------------------------------------------------------------------ */
/* `bytes` (> 0) of the current device's memory: 2 MiB-aligned, in 2 MiB pages where the host
 * allows, from 2 MiB up. CUDA: cudaMalloc. Ascend: aclrtMalloc. Level Zero: zeMemAllocDevice. */
mockError_t mockMalloc(void** ptr, size_t bytes);
/* CUDA: cudaFree. Ascend: aclrtFree. Level Zero: zeMemFree. */
mockError_t mockFree(void* ptr);
/* Page-locked host memory. CUDA: cudaMallocHost / cudaFreeHost. Ascend: aclrtMallocHost /
 * aclrtFreeHost. Level Zero: zeMemAllocHost / zeMemFree. */
mockError_t mockMallocHost(void** ptr, size_t bytes);
mockError_t mockFreeHost(void* ptr);
/* Copy now, complete on return; not ordered with queued work. CUDA: cudaMemcpy (on a program
 * with non-blocking streams only). Ascend: aclrtMemcpy. Level Zero: an immediate command list's
 * zeCommandListAppendMemoryCopy, synchronized. */
mockError_t mockMemcpy(void* dst, const void* src, size_t bytes, mockMemcpyKind kind);
/* Copy in `stream`'s order. A host source may be reused once the call returns (it is staged);
 * a host destination holds the data once the stream reaches the copy. CUDA: cudaMemcpyAsync.
 * Ascend: aclrtMemcpyAsync. Level Zero: zeCommandListAppendMemoryCopy. */
mockError_t mockMemcpyAsync(void* dst, const void* src, size_t bytes, mockMemcpyKind kind,
                            mockStream_t stream);
/* The host address behind a device pointer, for the mock's kernels, which are host code; the
 * identity unless memory is discrete. (A real device's kernels take device pointers as they
 * are: nothing outside kernels may use it.) */
void* mockDevicePointerToHost(const void* device_ptr);

/* ---- Streams ----------------------------------------------------------------------------- */
/* Priorities of the current device's streams: lower numbers run first (here 0 to -3).
 * CUDA: cudaDeviceGetStreamPriorityRange. Ascend: aclrtCreateStreamWithConfig's priority.
 * Level Zero: ZE_COMMAND_QUEUE_PRIORITY_*. */
mockError_t mockDeviceGetStreamPriorityRange(int* least, int* greatest);
/* A new stream on the current device; priorities outside the range are clamped to it.
 * CUDA: cudaStreamCreateWithPriority. Ascend: aclrtCreateStreamWithConfig. Level Zero:
 * zeCommandQueueCreate / zeCommandListCreateImmediate. */
mockError_t mockStreamCreateWithPriority(mockStream_t* stream, int priority);
/* Waits for the stream's queued work, then frees it. CUDA: cudaStreamDestroy (which returns
 * at once and frees later). Ascend: aclrtDestroyStream. Level Zero: zeCommandQueueDestroy. */
mockError_t mockStreamDestroy(mockStream_t stream);
/* mockSuccess when the stream has run what was queued on it, else mockErrorNotReady (errors
 * are reported by synchronizing calls). CUDA: cudaStreamQuery. Ascend: aclrtStreamQuery.
 * Level Zero: zeCommandQueueSynchronize(queue, 0). */
mockError_t mockStreamQuery(mockStream_t stream);
/* CUDA: cudaStreamSynchronize. Ascend: aclrtSynchronizeStream. Level Zero:
 * zeCommandQueueSynchronize(queue, UINT64_MAX). */
mockError_t mockStreamSynchronize(mockStream_t stream);
/* Queue `kernel(args, 1)` on the stream (`name` says what failed in an error). A synchronous
 * device runs it now and returns its failure as mockErrorLaunchFailure. CUDA: a kernel launch
 * (cudaLaunchKernel; cudaLaunchHostFunc for host code). Ascend: aclrtLaunchKernel /
 * aclrtLaunchCallback. Level Zero: zeCommandListAppendLaunchKernel. */
mockError_t mockLaunchKernel(mockStream_t stream, const char* name, mockKernel_t kernel,
                             void* args);
/* Make the stream wait for the host: when it reaches this point the driver calls
 * `fn(args, wait, 1)` on a worker, and the stream runs nothing more (holding no thread) until
 * mockWaitResume(wait, ...) is called, at once or later from any thread. CUDA:
 * cuStreamWaitValue32 on a flag the host writes. Ascend: aclrtStreamWaitEvent on an event the
 * host records. Level Zero: zeCommandListAppendWaitOnEvents on an event zeEventHostSignal
 * signals. */
mockError_t mockStreamWaitHost(mockStream_t stream, const char* name, mockWaitFn_t fn,
                               void* args);
/* Resume a waiting stream, exactly once; a non-NULL `error` fails the stream's device with it
 * (a sticky error naming the wait). */
void mockWaitResume(mockWait_t wait, const char* error);

/* ---- Events ------------------------------------------------------------------------------ */
/* A new event on the current device. CUDA: cudaEventCreateWithFlags. Ascend:
 * aclrtCreateEventWithFlag. Level Zero: zeEventCreate (in a pool with
 * ZE_EVENT_POOL_FLAG_KERNEL_TIMESTAMP for timing). */
mockError_t mockEventCreateWithFlags(mockEvent_t* event, unsigned flags);
/* Freed once its pending records complete. CUDA: cudaEventDestroy. Ascend: aclrtDestroyEvent.
 * Level Zero: zeEventDestroy. */
mockError_t mockEventDestroy(mockEvent_t event);
/* The event completes, with a timestamp, when the stream (of the event's device) reaches this
 * point; a later record replaces an earlier one. CUDA: cudaEventRecord. Ascend:
 * aclrtRecordEvent. Level Zero: zeCommandListAppendSignalEvent. */
mockError_t mockEventRecord(mockEvent_t event, mockStream_t stream);
/* mockSuccess when the latest record has completed (or there was none), else
 * mockErrorNotReady. CUDA: cudaEventQuery. Ascend: aclrtQueryEventStatus. Level Zero:
 * zeEventQueryStatus. */
mockError_t mockEventQuery(mockEvent_t event);
/* Blocks the host until the latest record has completed (errors of the work before it are
 * reported by mockStreamSynchronize and mockDeviceSynchronize). CUDA: cudaEventSynchronize. Ascend: aclrtSynchronizeEvent. Level Zero:
 * zeEventHostSynchronize. */
mockError_t mockEventSynchronize(mockEvent_t event);
/* Milliseconds from `start`'s timestamp to `end`'s (both with timing, recorded, complete).
 * CUDA: cudaEventElapsedTime. Ascend: aclrtEventElapsedTime. Level Zero:
 * zeEventQueryKernelTimestamp. */
mockError_t mockEventElapsedTime(float* ms, mockEvent_t start, mockEvent_t end);
/* The stream runs the work queued after this call only once the event's latest record (at the
 * time of the call) has completed; no host thread waits. `flags` must be 0. CUDA:
 * cudaStreamWaitEvent. Ascend: aclrtStreamWaitEvent. Level Zero:
 * zeCommandListAppendWaitOnEvents. */
mockError_t mockStreamWaitEvent(mockStream_t stream, mockEvent_t event, unsigned flags);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* MOCKRT_H */
