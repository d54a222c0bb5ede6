// Per-thread current device, device-index validation and naming (the CUDA context model:
// cudaSetDevice is per thread, device 0 by default). Device-name agnostic: the name is the
// one PrivateUse1 was renamed to. Part of the accelkit C++ layer (issue #4).
#pragma once

#include <accelkit/runtime.h>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <string>

namespace accelkit {

constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;

inline std::string device_name() { return c10::get_privateuse1_backend(); }

inline int device_count() noexcept {
  static const int count = runtime().device_count();
  return count;
}

// True once any device was used (a tensor allocated, the current device set): the cuda-like
// is_initialized() that DeviceMesh reads before choosing each rank's device.
inline std::atomic<bool>& initialized_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

// CUDA raises RuntimeError "CUDA error: invalid device ordinal"; so do we, with the count
// and the fix.
inline void check_device_index(int64_t index) {
  const int count = device_count();
  TORCH_CHECK(index >= 0 && index < count, device_name(),
                    " error: invalid device ordinal: device ", index, " requested but ", count,
                    " ", device_name(), " device", count == 1 ? " is" : "s are",
                    " available (valid indices 0..", count - 1, "). ",
                    runtime().device_count_hint());
}

inline int& thread_current_device() {
  thread_local int current = 0;
  return current;
}

inline int current_device() { return thread_current_device(); }

inline void set_current_device(int index) {
  check_device_index(index);
  initialized_flag() = true;
  if (thread_current_device() != index) {
    runtime().set_device(index);
    thread_current_device() = index;
  }
}

// Index of a device argument that may be -1 ("the current device").
inline int resolve_index(int64_t index) {
  if (index < 0) return current_device();
  check_device_index(index);
  return static_cast<int>(index);
}

}  // namespace accelkit
