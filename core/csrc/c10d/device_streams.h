// Private: the device side of the c10d glue, shared by its Work (work.cpp) and its queueing
// (backend.cpp): whether a call's device runs work asynchronously, and its current stream.
#pragma once

#include <accelkit/c10d/backend.h>
#include <accelkit/runtime.h>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>

namespace accelkit::c10d::detail {

// A PrivateUse1 device whose runtime queues work (Runtime::async): Work.wait() orders the
// caller's stream, and a collective first waits for the work producing its inputs.
inline bool async_device(const std::optional<c10::Device>& device) {
  accelkit::Runtime* rt = device_runtime();
  return device.has_value() && device->type() == c10::DeviceType::PrivateUse1 && rt != nullptr &&
         rt->async();
}

inline c10::Stream current_stream_of(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

// The runtime's stream behind a c10 stream of the device (the device's copy of the layer maps
// them: accelkit::driver_stream, reached through its accelkit::_driver_stream op).
accelkit::DriverStream driver_stream_of(const c10::Stream& stream);

}  // namespace accelkit::c10d::detail
