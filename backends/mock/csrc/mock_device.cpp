// The mock device extension: the mock runtime plus the accelkit C++ layer, and the Python
// bindings accelkit.core.device_module turns into torch.mock (issue #4). The only
// translation unit of the extension.
#include "mock_runtime.h"

#include <accelkit/device.h>
#include <accelkit/python.h>

namespace accelkit {

Runtime& runtime() {
  static accelkit_mock::MockRuntime* instance = new accelkit_mock::MockRuntime();
  return *instance;
}

}  // namespace accelkit

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  accelkit::bind_device(m);
  m.def("config_error", [] {
    return static_cast<accelkit_mock::MockRuntime&>(accelkit::runtime()).config_error();
  });
}
