// The device context (<accelkit/context.h>) and the registered runtime (<accelkit/runtime.h>).
#include <accelkit/context.h>

#include "runtime/registry.h"
#include "testing/faults.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <vector>

namespace accelkit {
namespace {

Runtime* g_runtime = nullptr;
int g_device_count = 0;
std::atomic<bool> g_initialized{false};
thread_local int t_current_device = 0;

}  // namespace

void detail::install_runtime(Runtime& runtime) {
  g_runtime = &runtime;
  g_device_count = runtime.device_count();
}

Runtime& runtime() {
  TORCH_CHECK(g_runtime != nullptr,
              "accelkit: no device runtime is registered in this extension; call "
              "accelkit::register_device(runtime, origin) from its PYBIND11_MODULE first");
  return *g_runtime;
}

std::string device_name() { return c10::get_privateuse1_backend(); }

int device_count() noexcept { return g_device_count; }

bool initialized() noexcept {
#ifdef ACCELKIT_FAULTS
  if (faults::active("is_initialized_always")) return true;
#endif
  return g_initialized.load();
}

void mark_initialized() noexcept { g_initialized = true; }

// CUDA raises RuntimeError "CUDA error: invalid device ordinal"; so do we, with the count
// and the fix.
void check_device_index(int64_t index) {
  const int count = device_count();
  TORCH_CHECK(index >= 0 && index < count, device_name(),
              " error: invalid device ordinal: device ", index, " requested but ", count, " ",
              device_name(), " device", count == 1 ? " is" : "s are",
              " available (valid indices 0..", count - 1, "). ", runtime().device_count_hint());
}

int current_device() noexcept { return t_current_device; }

void set_current_device(int index) {
  check_device_index(index);
  mark_initialized();
#ifdef ACCELKIT_FAULTS
  if (faults::active("set_device_ignored")) return;
#endif
  if (t_current_device != index) {
    runtime().set_device(index);
    t_current_device = index;
  }
}

void set_current_device_unchecked(int index) noexcept { t_current_device = index; }

int resolve_index(int64_t index) {
  if (index < 0) return current_device();
  check_device_index(index);
  return static_cast<int>(index);
}

}  // namespace accelkit
