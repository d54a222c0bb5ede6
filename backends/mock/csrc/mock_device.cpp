// The mock device extension: the mock runtime registered with accelkit's C++ layer, and the
// Python bindings accelkit.core.device_module turns into torch.mock.
#include "mock_runtime.h"

#include <accelkit/accelkit.h>
#include <accelkit/python.h>

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// A wait the host releases (as a kernel spinning on a flag the host writes:
// cuStreamWaitValue32): each wait() holds the current stream until release(). For tests that
// queue work on several streams and then let the device choose among all of it at once.
class HoldState {
 public:
  void when_released(accelkit::Runtime::Resume resume) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!released_) {
        waiters_.push_back(std::move(resume));
        return;
      }
    }
    resume(nullptr);
  }

  void release() {
    std::vector<accelkit::Runtime::Resume> waiters;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released_ = true;
      waiters.swap(waiters_);
    }
    for (auto& resume : waiters) resume(nullptr);
  }

 private:
  std::mutex mutex_;
  bool released_ = false;
  std::vector<accelkit::Runtime::Resume> waiters_;
};

// torch.mock's _Hold: the handle Python holds. Dropping it releases its waits: nobody could
// release them any more, and a stream parked forever would hang every synchronize().
class Hold {
 public:
  ~Hold() {
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release no_gil;  // resumed work may need the GIL on another thread
      state_->release();
    } else {
      state_->release();
    }
  }
  const std::shared_ptr<HoldState>& state() const { return state_; }

 private:
  std::shared_ptr<HoldState> state_ = std::make_shared<HoldState>();
};

}  // namespace

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
  // A stream made with the driver itself (cudaStreamCreateWithPriority), as an integer handle
  // for torch.mock.ExternalStream; _destroy_stream runs its queued work, then frees it.
  m.def("_create_stream", [](int64_t priority) {
    return reinterpret_cast<uintptr_t>(
        runtime->stream_create(accelkit::current_device(), static_cast<int>(priority)));
  });
  m.def("_destroy_stream", [](uintptr_t stream) {
    runtime->stream_destroy(accelkit::current_device(), reinterpret_cast<void*>(stream));
  }, pybind11::call_guard<pybind11::gil_scoped_release>());
  pybind11::class_<Hold>(m, "_Hold")
      .def(pybind11::init<>())
      .def("wait",
           [](const Hold& hold) {
             // The host would wait for its own release() forever: on a synchronous device at
             // this call, with launch blocking at the next launch on the held stream.
             if (!runtime->async() || runtime->launch_blocking()) {
               throw std::runtime_error(
                   "_Hold.wait() holds a stream until the host releases it: it needs the "
                   "asynchronous mock (ACCELKIT_MOCK_ASYNC=1) without "
                   "ACCELKIT_MOCK_LAUNCH_BLOCKING=1; otherwise the host would wait for the held "
                   "stream, and it is the only one that can release it");
             }
             const int device = accelkit::current_device();
             runtime->stream_wait(device, accelkit::current_stream(device), "_Hold.wait",
                                  [state = hold.state()](accelkit::Runtime::Resume resume) {
                                    state->when_released(std::move(resume));
                                  });
           })
      .def("release", [](const Hold& hold) { hold.state()->release(); },
           pybind11::call_guard<pybind11::gil_scoped_release>());
  // A kernel that fails with `message` when the current stream runs it: how an error of
  // queued work surfaces (at the next synchronizing call, naming the kernel).
  m.def("_fail", [](const std::string& message) {
    const int device = accelkit::current_device();
    runtime->launch(device, accelkit::current_stream(device), "_fail",
                    [message] { throw std::runtime_error(message); });
  });
}
