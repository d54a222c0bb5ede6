// bind_collectives (<accelkit/c10d/backend.h>): a collective library's Python module.
#include "c10d/transport_backend.h"  // and <accelkit/c10d/backend.h>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

namespace accelkit::c10d {
namespace {

// Backend options that Python can deep-copy (torch.distributed.split_group does; the base
// Options type cannot be copied from Python).
struct CopyableOptions : ::c10d::Backend::Options {
  CopyableOptions(std::string backend, std::chrono::milliseconds timeout)
      : ::c10d::Backend::Options(std::move(backend), timeout) {}
};

}  // namespace

void bind_collectives(pybind11::module_& m, const std::string& name, Connect connect) {
  namespace py = pybind11;
  py::class_<TransportBackend, ::c10d::Backend, c10::intrusive_ptr<TransportBackend>>(m, "Backend")
      .def(py::init([name, connect](const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                    int size, int64_t timeout_ms, const std::string& device) {
             return c10::make_intrusive<TransportBackend>(
                 connect, store, rank, size, std::chrono::milliseconds(timeout_ms),
                 c10::Device(device).type(), name);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"),
           py::arg("device"), py::call_guard<py::gil_scoped_release>())
      // new_group() on a rank outside the new group calls this on the default group's backend
      // when that supports splitting (written for NCCL's ncclCommSplit); nothing to do here:
      // groups connect only their members.
      .def("perform_nocolor_split", [](TransportBackend&, const at::Device&) {})
      .def_property_readonly("options", [](TransportBackend& self) {
        auto opts = self.getBackendOptions();
        return c10::make_intrusive<CopyableOptions>(opts->backend, opts->timeout);
      })
      .def_property_readonly("pending", &TransportBackend::pending,
                             "Operations queued or running, not yet completed.")
      .def("abort", &TransportBackend::abort, py::call_guard<py::gil_scoped_release>(),
           "Abort the group: operations in flight complete with an error within moments.");
  py::class_<CopyableOptions, ::c10d::Backend::Options, c10::intrusive_ptr<CopyableOptions>>(
      m, "Options")
      .def("__deepcopy__", [](const CopyableOptions& self, py::dict) {
        return c10::make_intrusive<CopyableOptions>(self.backend, self.timeout);
      });
}

}  // namespace accelkit::c10d
