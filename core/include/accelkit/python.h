// The Python bindings every device extension exposes; accelkit.core.device_module builds the
// cuda-like torch.<name> module from them. Call accelkit::bind_device(m) in the extension's
// PYBIND11_MODULE, after accelkit::register_device.
#pragma once

#include <pybind11/pybind11.h>

namespace accelkit {

void bind_device(pybind11::module_& m);

}  // namespace accelkit
