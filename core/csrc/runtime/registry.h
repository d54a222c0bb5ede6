// Private to the layer: what register.cpp assembles from the other translation units.
#pragma once

#include <accelkit/runtime.h>

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <utility>

namespace accelkit::detail {

// Makes `runtime` the one runtime() returns (called once, by register_device).
void install_runtime(Runtime& runtime);

// Registers aten kernels for PrivateUse1, except for ops that already have one (the vendor's,
// registered while its extension loaded): the vendor's kernel is kept.
class KernelTable {
 public:
  explicit KernelTable(torch::Library& library) : library_(library) {}

  template <typename Fn>
  void impl(const char* name, Fn&& fn) {
    if (!has_kernel(name)) library_.impl(name, std::forward<Fn>(fn));
  }

 private:
  // True when aten::<name> already has a PrivateUse1 kernel.
  static bool has_kernel(const char* name);

  torch::Library& library_;
};

// The aten kernels of each part of the layer.
void register_kernels(KernelTable& table);  // kernels.cpp: the minimum native set
void register_random(KernelTable& table);   // random.cpp: offset-exact random kernels
void register_rnn_cells(KernelTable& table);  // rnn_cells.cpp: the fused LSTM/GRU cells
void register_sync_batch_norm(KernelTable& table);  // sync_batch_norm.cpp: SyncBatchNorm's ops
void register_autocast(torch::Library& library);  // autocast.cpp: AutocastPrivateUse1

// layouts.cpp: sparse COO (SparsePrivateUse1), sparse compressed (SparseCsrPrivateUse1) and
// nested (NestedTensorPrivateUse1) tensors on the device, through libraries `library` makes.
using LibraryFor = torch::Library& (*)(torch::Library::Kind kind, const char* ns,
                                       std::optional<c10::DispatchKey> key);
void register_layouts(LibraryFor library);
// fallback.cpp: the index of the argument a return of `schema` aliases (same alias set), or -1.
int aliased_argument(const c10::FunctionSchema& schema, const c10::Argument& ret);

// A tensor of any layout moved to `device` (a sparse tensor's indices and values, a nested
// tensor's buffer).
at::Tensor move_layout(const at::Tensor& t, c10::Device device);

// The device guard (streams, events) and the hooks, created by register_device.
void register_guard();
void register_hooks();

}  // namespace accelkit::detail
