// Sparse (COO and compressed: CSR, CSC, BSR, BSC) and nested tensors on the device.
//
// torch builds them on any device: torch.sparse_coo_tensor(..., device=D) dispatches with the
// SparsePrivateUse1 key, a CSR tensor's ops with SparseCsrPrivateUse1 and a nested tensor's
// with NestedTensorPrivateUse1 (SparseCsrTensorImpl.cpp and NestedTensorImpl.cpp give a
// PrivateUse1 buffer those keys). torch registers no kernel for them, so every op failed with
// "Could not run 'aten::...' with arguments from the 'Sparse<device>' backend". Each key gets
// a boxed fallback here:
//
// - Metadata ops (constructing from indices and values, the indices/values accessors, nnz,
//   dims, the coalesced flag, resizing; a nested tensor's views and its size/stride/offset
//   tensors) only touch the tensor's structure, never its data: they run as the CPU kernels
//   they are (SparseCPU, SparseCsrCPU, NestedTensorCPU), on the device tensors themselves, so
//   the indices and values stay on the device and views stay views.
// - Every other op runs through the CPU: each device argument is downloaded (a sparse tensor
//   as its indices and values, a nested one as its buffer with its size, stride and offset
//   metadata), the op runs on the CPU, results are uploaded as tensors of the same layout to
//   the device the op asked for (asked_device: `.cpu()` and `.to("<device>:1")` included),
//   and an argument the op writes (in place, out=) gets the result's indices, values or
//   buffer, and is what the op returns.
// - Either way the op's device is current while it runs, as in CUDA's generated kernels. The downloads wait for the work queued on the device, so on an asynchronous
//   device the host waits for these ops.
//
// What a vendor replaces: the ops its sparse or nested library implements, registered for the
// same keys (a kernel registered for an op wins over the fallback).
#include <accelkit/context.h>
#include <accelkit/host_tensor.h>

#include "runtime/registry.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <ATen/NestedTensorImpl.h>
#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/native/SparseTensorUtils.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace accelkit {
namespace {

// Ops that read or change only a sparse tensor's structure (aten op names). Their CPU kernels
// (aten/src/ATen/native/sparse/SparseTensor.cpp, SparseCsrTensor.cpp) call ops that dispatch
// for the indices and values, which are device tensors.
bool sparse_metadata_op(std::string_view name) {
  for (const std::string_view op :
       {"_sparse_coo_tensor_with_dims_and_tensors", "_sparse_coo_tensor_with_dims", "empty",
        "_indices", "_values", "indices", "values", "_nnz", "sparse_dim", "dense_dim", "_dimI",
        "_dimV", "is_coalesced", "_coalesced_", "sparse_resize_", "sparse_resize_and_clear_",
        "crow_indices", "col_indices", "ccol_indices", "row_indices",
        "_sparse_compressed_tensor_with_dims"}) {
    if (name == op) return true;
  }
  return false;
}

// Nested-tensor ops that read only the metadata (which lives on the CPU for every device, as
// on CUDA) or return views of the buffer: the nested CPU kernels build them from metadata and
// as_strided views of the device buffer (aten/src/ATen/native/nested/NestedTensorMath.cpp).
bool nested_metadata_op(const c10::FunctionSchema& schema) {
  const std::string_view name = schema.name();
  if (name == "aten::_nested_tensor_size" || name == "aten::_nested_tensor_strides" ||
      name == "aten::_nested_tensor_storage_offsets") {
    return true;
  }
  for (const c10::Argument& ret : schema.returns()) {
    if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) return true;  // a view
  }
  return false;
}

bool compressed(at::Layout layout) {
  return layout == at::kSparseCsr || layout == at::kSparseCsc || layout == at::kSparseBsr ||
         layout == at::kSparseBsc;
}

at::Tensor nested_with_buffer(const at::Tensor& nested, const at::Tensor& buffer) {
  const auto* impl = at::native::get_nested_tensor_impl(nested);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      buffer, impl->get_nested_sizes(), impl->get_nested_strides(), impl->get_storage_offsets());
}

at::Tensor nested_buffer(const at::Tensor& nested) {
  return at::native::get_nested_tensor_impl(nested)->get_unsafe_storage_as_tensor();
}

}  // namespace

// The same tensor on `device` (the CPU or the device): a sparse tensor rebuilt around its
// moved indices and values, a nested one around its moved buffer (the metadata stays where
// torch keeps it, on the CPU).
at::Tensor detail::move_layout(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || t.device() == device) return t;
  if (t.is_nested()) return nested_with_buffer(t, nested_buffer(t).to(device));
  if (t.layout() == at::kSparse) {
    const auto* impl = at::sparse::get_sparse_impl(t);
    return at::_sparse_coo_tensor_with_dims_and_tensors(
        impl->sparse_dim(), impl->dense_dim(), t.sizes(), impl->indices().to(device),
        impl->values().to(device), t.options().device(device), impl->coalesced());
  }
  if (compressed(t.layout())) {
    const auto* impl = at::sparse_csr::get_sparse_csr_impl(t);
    return at::_sparse_compressed_tensor_unsafe(
        impl->compressed_indices().to(device), impl->plain_indices().to(device),
        impl->values().to(device), t.sizes(), t.options().device(device));
  }
  return t.to(device);
}

namespace {

// Gives device tensor `target` the value the op wrote into its CPU copy `written`.
void write_back(const at::Tensor& target, const at::Tensor& written) {
  const c10::Device device = target.device();
  if (target.is_nested()) {
    nested_buffer(target).copy_(nested_buffer(written));
  } else if (target.layout() == at::kSparse) {
    auto* impl = at::sparse::get_sparse_impl(target);
    const auto* from = at::sparse::get_sparse_impl(written);
    impl->raw_resize_(from->sparse_dim(), from->dense_dim(), written.sizes());
    impl->set_indices_and_values_unsafe(from->indices().to(device), from->values().to(device));
    impl->set_coalesced(from->coalesced());
  } else if (compressed(target.layout())) {
    const auto* from = at::sparse_csr::get_sparse_csr_impl(written);
    at::sparse_csr::get_sparse_csr_impl(target)->set_member_tensors(
        from->compressed_indices().to(device), from->plain_indices().to(device),
        from->values().to(device), written.sizes());
  } else {
    if (target.sizes() != written.sizes()) target.resize_(written.sizes());
    target.copy_(written);
  }
}

// The device an op's results belong on, as CUDA's generated kernels choose the device of their
// guard: an explicit device argument (a factory's, `.to(device)`'s; the CPU's too: `.cpu()`),
// else the first device tensor argument's, else the current device.
std::optional<c10::Device> asked_device(const c10::FunctionSchema& schema,
                                        const torch::jit::Stack& stack) {
  const auto& args = schema.arguments();
  const size_t first = stack.size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isDevice()) {
      const c10::Device d = v.toDevice();
      if (d.type() != kDeviceType) return d;
      return c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(resolve_index(d.index())));
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor() && is_device(v.toTensor())) return v.toTensor().device();
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList())
        if (is_device(t)) return t.device();
    }
  }
  return std::nullopt;
}

template <c10::DispatchKey CpuKey>
void layout_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const c10::Device target = asked_device(schema, *stack).value_or(
      c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(current_device())));
  // The device the op works on is current while it runs, as in CUDA's kernels: what the CPU
  // kernels below create on "the device" (a sparse tensor's empty indices, its impl) lands on
  // it, not on whichever device the caller had current.
  c10::OptionalDeviceGuard guard;
  if (target.type() == kDeviceType) guard.reset_device(target);
  const bool metadata = CpuKey == c10::DispatchKey::NestedTensorCPU
                            ? nested_metadata_op(schema)
                            : sparse_metadata_op(std::string_view(schema.name()).substr(6));
  if (metadata) {
    op.redispatchBoxed(c10::DispatchKeySet(CpuKey), stack);
    return;
  }
  const auto& args = schema.arguments();
  const size_t first = stack->size() - args.size();
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (device tensor, its CPU copy)
  std::vector<at::Tensor> written_args(args.size());
  const auto download = [&](const at::Tensor& t, size_t i) {
    if (!is_device(t)) return t;
    at::Tensor cpu = detail::move_layout(t, c10::Device(c10::kCPU));
    // Some CPU kernels read it: _sparse_mm_reduce_impl computes the argmax indices its
    // backward reads only for inputs that require grad (without them the backward crashed).
    // Autograd is below us here, so the copy records nothing.
    if (t.requires_grad() && !cpu.requires_grad()) cpu.set_requires_grad(true);
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) {
      written.emplace_back(t, cpu);
      written_args[i] = t;
    }
    return cpu;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isTensor()) {
      v = c10::IValue(download(v.toTensor(), i));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> cpu;
      for (const at::Tensor& t : v.toTensorList()) cpu.push_back(download(t, i));
      v = c10::IValue(std::move(cpu));
    } else if (v.isList() && args[i].type()->isSubtypeOf(
                                 *c10::ListType::create(c10::OptionalType::ofTensor()))) {
      c10::List<std::optional<at::Tensor>> cpu;
      for (const c10::IValue& e : v.toListRef()) {
        cpu.push_back(e.isTensor() ? std::optional<at::Tensor>(download(e.toTensor(), i))
                                   : std::nullopt);
      }
      v = c10::IValue(std::move(cpu));
    } else if (v.isDevice() && v.toDevice().type() == kDeviceType) {
      v = c10::IValue(c10::Device(c10::kCPU));
    }
  }
  op.callBoxed(stack);
  for (const auto& [device_tensor, cpu] : written) write_back(device_tensor, cpu);
  const auto& returns = schema.returns();
  const size_t rfirst = stack->size() - returns.size();
  for (size_t r = 0; r < returns.size(); ++r) {
    c10::IValue& v = (*stack)[rfirst + r];
    const bool written_return = returns[r].alias_info() != nullptr && returns[r].alias_info()->isWrite();
    const int arg = written_return ? detail::aliased_argument(schema, returns[r]) : -1;
    if (arg >= 0 && written_args[arg].defined()) {
      v = c10::IValue(written_args[arg]);  // an in-place or out= op returns its argument itself
    } else if (v.isTensor()) {
      v = c10::IValue(detail::move_layout(v.toTensor(), target));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> moved;
      for (const at::Tensor& t : v.toTensorList()) moved.push_back(detail::move_layout(t, target));
      v = c10::IValue(std::move(moved));
    }
  }
}

}  // namespace

void detail::register_layouts(LibraryFor library) {
  auto& dispatcher = c10::Dispatcher::singleton();
  const std::vector<c10::OperatorName> names = dispatcher.getAllOpNames();
  for (const auto& [key, cpu_key, function] :
       {std::tuple{c10::DispatchKey::SparsePrivateUse1, c10::DispatchKey::SparseCPU,
                   &torch::CppFunction::makeFromBoxedFunction<
                       &layout_fallback<c10::DispatchKey::SparseCPU>>},
        std::tuple{c10::DispatchKey::SparseCsrPrivateUse1, c10::DispatchKey::SparseCsrCPU,
                   &torch::CppFunction::makeFromBoxedFunction<
                       &layout_fallback<c10::DispatchKey::SparseCsrCPU>>},
        std::tuple{c10::DispatchKey::NestedTensorPrivateUse1, c10::DispatchKey::NestedTensorCPU,
                   &torch::CppFunction::makeFromBoxedFunction<
                       &layout_fallback<c10::DispatchKey::NestedTensorCPU>>}}) {
    // Every aten op with a kernel for the CPU's layout key gets the fallback as its kernel for
    // the device's key (unless it has one, the vendor's): a CompositeExplicitAutograd kernel
    // (a dense implementation, e.g. is_coalesced_default, which refuses sparse tensors) would
    // otherwise be picked before the backend fallback. The other ops reach the fallback too,
    // and the CPU's "Could not run ..." names what no CPU kernel exists for.
    torch::Library& ops = library(torch::Library::IMPL, "aten", key);
    for (const c10::OperatorName& name : names) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      const auto op = dispatcher.findOp(name);
      if (!op.has_value() || !op->hasKernelForDispatchKey(cpu_key) ||
          op->hasKernelForDispatchKey(key)) {
        continue;
      }
      const std::string op_name = name.overload_name.empty()
                                      ? name.name.substr(6)
                                      : name.name.substr(6) + "." + name.overload_name;
      ops.impl(op_name.c_str(), function());
    }
    if (!dispatcher.hasBackendFallbackForDispatchKey(key)) {
      library(torch::Library::IMPL, "_", key).fallback(function());
    }
  }
}

}  // namespace accelkit
