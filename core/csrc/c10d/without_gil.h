// Private: the c10d glue's waits on its own threads, made without Python's GIL. Those threads
// may need the GIL to finish what they run (a Work's Python callback, freeing a tensor a Python
// object held), so a wait for them that keeps it deadlocks; torch's bindings keep it for
// _source_rank, and a process group's destructor runs wherever Python drops it.
#pragma once

#include <Python.h>

namespace accelkit::c10d::detail {

// Lets go of the GIL for its scope when the calling thread holds it, and takes it back after.
class WithoutGil {
 public:
  WithoutGil() : saved_(Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~WithoutGil() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* saved_;
};

}  // namespace accelkit::c10d::detail
