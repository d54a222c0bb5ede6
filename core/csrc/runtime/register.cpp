// register_device (<accelkit/register.h>): everything the layer installs for PrivateUse1,
// once per process, explicitly. The dispatcher is process-wide, so a marker op
// (accelkit::_registered_device, returning the first registration's origin) tells a second
// registration, from this extension or any other built on accelkit, who came first.
#include <accelkit/fallback.h>
#include <accelkit/register.h>

#include "runtime/allocator.h"
#include "runtime/registry.h"
#include "testing/faulty_runtime.h"

#include <accelkit/context.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <mutex>
#include <optional>
#include <string_view>

namespace accelkit {
namespace {

constexpr const char* kMarker = "accelkit::_registered_device";

std::mutex g_mutex;
std::string* g_origin = nullptr;  // of this process's registration; never destroyed

// The shared library this code is linked into (the calling extension).
std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&register_device), &info) != 0 && info.dli_fname) {
    return info.dli_fname;
  }
  return "an unknown library";
}

// The origin of the accelkit registration already in this process, or "".
std::string registered_origin() {
  const auto op = c10::Dispatcher::singleton().findSchema({kMarker, ""});
  if (!op.has_value()) return "";
  return op->typed<std::string()>().call();
}

// A torch::Library that lives as long as the process (destroying it would deregister).
torch::Library& library(torch::Library::Kind kind, const char* ns,
                        std::optional<c10::DispatchKey> key) {
  return *new torch::Library(kind, ns, key, __FILE__, __LINE__);
}

std::string origin_of_first() { return *g_origin; }

Runtime* g_runtime = nullptr;

// The registered runtime as an integer, for the collective library's copy of the layer (in its
// own extension), which reaches the device's streams through it (accelkit::c10d).
int64_t runtime_address() { return reinterpret_cast<int64_t>(g_runtime); }

// The driver stream of a c10 stream id, for the same copy of the layer (streams.cpp's table
// lives in this extension).
int64_t driver_stream_address(int64_t device, int64_t id) {
  return reinterpret_cast<int64_t>(driver_stream(static_cast<int>(device), id));
}

}  // namespace

bool detail::KernelTable::has_kernel(const char* name) {
  const std::string_view full(name);
  const size_t dot = full.find('.');
  const std::string op(full.substr(0, dot));
  const std::string overload = dot == std::string_view::npos ? "" : std::string(full.substr(dot + 1));
  const auto handle = c10::Dispatcher::singleton().findSchema({"aten::" + op, overload});
  TORCH_INTERNAL_ASSERT(handle.has_value(), "accelkit registers a kernel for aten::", name,
                        ", which this torch does not have");
  return handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
}

void register_device(Runtime& vendor_runtime, const std::string& origin) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::string me = origin + " (" + library_path() + ")";
  const std::string first = registered_origin();
  const std::string this_library = " (" + library_path() + ")";
  const bool same_library = first.size() >= this_library.size() &&
                            first.compare(first.size() - this_library.size(),
                                          this_library.size(), this_library) == 0;
  TORCH_CHECK(first.empty() || !same_library, "accelkit: cannot register the PrivateUse1 device "
              "of ", me, ": ", first, " already registered it: this extension calls "
              "accelkit::register_device twice. Call it once, from the extension's "
              "PYBIND11_MODULE (which runs once per process), not from a function the package "
              "calls again");
  TORCH_CHECK(first.empty(), "accelkit: cannot register the PrivateUse1 device of ", me, ": ",
              first, " already registered one in this process. torch allows one PrivateUse1 "
              "backend per process: load one device extension only (TORCH_DEVICE_BACKEND_"
              "AUTOLOAD=0 stops `import torch` from loading the installed ones)");
  TORCH_CHECK(!at::isPrivateUse1HooksRegistered(),
              "accelkit: cannot register the PrivateUse1 device of ", me, ": another PrivateUse1 "
              "backend (named '", c10::get_privateuse1_backend(), "') already registered its "
              "hooks in this process; torch allows one PrivateUse1 backend per process");
#ifdef ACCELKIT_FAULTS
  Runtime& runtime = faults::with_faults(vendor_runtime);
#else
  Runtime& runtime = vendor_runtime;
#endif
  detail::install_runtime(runtime);

  g_origin = new std::string(me);
  g_runtime = &runtime;
  library(torch::Library::FRAGMENT, "accelkit", std::nullopt)
      .def("_registered_device() -> str", &origin_of_first)
      .def("_runtime() -> int", &runtime_address)
      .def("_driver_stream(int device, int id) -> int", &driver_stream_address);

  c10::SetAllocator(kDeviceType, &DeviceAllocator::get());
  detail::register_guard();
  detail::register_hooks();

  detail::KernelTable table(library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1));
  detail::register_kernels(table);
  detail::register_random(table);
  detail::register_rnn_cells(table);
  detail::register_sync_batch_norm(table);

  // The conjugate/negative-bit fallbacks would materialize a lazily conjugated source of
  // _copy_from by cloning it, and the clone copies through _copy_from again (endless
  // recursion; CPU and CUDA never call _copy_from). copy_from handles the bits itself.
  for (const auto key : {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative}) {
    library(torch::Library::IMPL, "aten", key)
        .impl("_copy_from", torch::CppFunction::makeFallthrough())
        .impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  }

  auto& dispatcher = c10::Dispatcher::singleton();
  if (!dispatcher.hasBackendFallbackForDispatchKey(c10::DispatchKey::PrivateUse1)) {
    library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1)
        .fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
  detail::register_layouts(&library);
  if (!dispatcher.hasBackendFallbackForDispatchKey(c10::DispatchKey::AutocastPrivateUse1)) {
    library(torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1)
        .fallback(torch::CppFunction::makeFallthrough());
    detail::register_autocast(
        library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1));
  }
}

}  // namespace accelkit
