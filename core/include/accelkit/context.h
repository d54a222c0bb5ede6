// The device context: per-thread current device (the CUDA model: cudaSetDevice is per thread,
// device 0 by default), device-index validation with CUDA's message, the device's name (the
// one PrivateUse1 was renamed to) and the "initialized" flag DeviceMesh reads.
#pragma once

#include <accelkit/runtime.h>

#include <c10/core/DeviceType.h>

#include <cstdint>
#include <string>

namespace accelkit {

constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;

// The device type's name ("mock"; torch.utils.rename_privateuse1_backend).
std::string device_name();

// Number of devices (Runtime::device_count, read once at registration).
int device_count() noexcept;

// True once any device was used (a tensor allocated, the current device set): the cuda-like
// is_initialized() that DeviceMesh reads before choosing each rank's device.
bool initialized() noexcept;
void mark_initialized() noexcept;

// Raises CUDA's "invalid device ordinal" error, with the count and the fix, for an index
// outside 0..device_count()-1.
void check_device_index(int64_t index);

// The calling thread's current device.
int current_device() noexcept;

// Make `index` the calling thread's current device (validated; marks the device initialized;
// calls Runtime::set_device when it changes).
void set_current_device(int index);

// Change the thread's current index without validation or driver call (restoring a saved
// index, DeviceGuardImplInterface::uncheckedSetDevice).
void set_current_device_unchecked(int index) noexcept;

// Index of a device argument that may be negative ("the current device").
int resolve_index(int64_t index);

// Streams. A c10 stream id (torch.Stream.stream_id) names one of the layer's streams of a
// device: 0 the default stream, then the pool's streams (per priority, created on first use and
// handed out round-robin, as c10/cuda/CUDAStream.cpp), then external streams; each is a
// DriverStream of the runtime (Runtime::stream_create), where the work issued on it is queued.

// The calling thread's current stream on `device`, as the driver's stream: where the layer
// queues the work it issues (Runtime::launch, Runtime::copy_async) and where a vendor kernel
// launches its own.
DriverStream current_stream(int device);
// ... and as its c10 stream id.
int64_t current_stream_id(int device);
void set_current_stream(int device, int64_t id);

// The driver stream of c10 stream `id` of `device` (raises, naming the id, for an id the layer
// never handed out).
DriverStream driver_stream(int device, int64_t id);

// The c10 stream id of a pool stream of `device` at `priority` (clamped into the device's
// range, Runtime::stream_priority_range), the next one round-robin.
int64_t pool_stream(int device, int priority);
// The c10 stream id for a stream the caller created with the driver (torch.cuda.ExternalStream):
// work issued on it is queued on `stream`, which the caller keeps alive and destroys.
int64_t external_stream(int device, DriverStream stream);
// The priority a c10 stream id has (0 for the default and external streams).
int stream_priority(int device, int64_t id);

}  // namespace accelkit
