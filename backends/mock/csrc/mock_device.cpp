// The mock device extension: the mock runtime registered with accelkit's C++ layer, and the
// Python bindings accelkit.core.device_module turns into torch.mock.
#include "mock_runtime.h"

#include <accelkit/accelkit.h>
#include <accelkit/python.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  static auto* runtime = new accelkit_mock::MockRuntime();  // lives as long as the process
  accelkit::register_device(*runtime, "the mock device");
  accelkit::bind_device(m);
  m.def("config_error", [] { return runtime->config_error(); });
}
