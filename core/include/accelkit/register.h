// Registering a device with torch: one explicit call from the extension's init, never a side
// effect of including a header. Any number of translation units may include accelkit's
// headers; the process registers once.
//
//   PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
//     static MyRuntime runtime;                       // your driver (accelkit::Runtime)
//     accelkit::register_device(runtime, "torch_myaccel._C");
//     accelkit::bind_device(m);                       // <accelkit/python.h>
//   }
//
// register_device installs, for PrivateUse1: the allocator, the device guard (streams and
// events), the hooks (generators, pinned memory, torch.accelerator), accelkit's native kernels
// (the minimum set, the random kernels, _has_compatible_shallow_copy_type), the boxed fallback
// for every other op, and the autocast kernels.
//
// Your own kernels win, deterministically: an op that already has a PrivateUse1 kernel when
// register_device runs (your TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) blocks register while
// your extension loads, before its init runs) keeps it, and accelkit does not register its
// own; a kernel registered later replaces accelkit's (torch warns "Overriding a previously
// registered kernel"). The same holds for the boxed fallback and the autocast fallthrough.
// `accelkit doctor` lists whose kernel each op has (torch's dispatcher records where every
// kernel was registered).
#pragma once

#include <string>

namespace accelkit {

class Runtime;

// Register the PrivateUse1 device driven by `runtime` (which must outlive the process).
// `origin` names the caller in messages (e.g. "torch_myaccel._C"); the shared library's path
// is added. Raises c10::Error (RuntimeError in Python), never aborts, when a device is already
// registered in this process: by accelkit (from this or another extension; the message names
// both origins) or by another PrivateUse1 backend.
void register_device(Runtime& runtime, const std::string& origin);

}  // namespace accelkit
