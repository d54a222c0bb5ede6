// The mock device extension: the mock runtime registered with accelkit's C++ layer, and the
// Python bindings accelkit.core.device_module turns into torch.mock.
#include "mock_runtime.h"

#include <accelkit/accelkit.h>
#include <accelkit/python.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  static auto* runtime = new accelkit_mock::MockRuntime();  // lives as long as the process
  accelkit::register_device(*runtime, "the mock device");
  accelkit::bind_device(m);
  m.def("config_error", [] { return runtime->config_error(); });
  // A kernel that keeps the current stream busy for `ms` milliseconds (as torch.cuda._sleep):
  // for tests of asynchronous behaviour (ACCELKIT_MOCK_ASYNC=1).
  m.def("_sleep", [](int64_t ms) {
    const int device = accelkit::current_device();
    runtime->launch(device, accelkit::current_stream(device), "_sleep",
                    [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); });
  });
  // A kernel that fails with `message` when the current stream runs it: how an error of
  // queued work surfaces (at the next synchronizing call, naming the kernel).
  m.def("_fail", [](const std::string& message) {
    const int device = accelkit::current_device();
    runtime->launch(device, accelkit::current_stream(device), "_fail",
                    [message] { throw std::runtime_error(message); });
  });
}
