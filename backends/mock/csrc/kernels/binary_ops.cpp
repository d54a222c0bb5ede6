// Native kernels of the mock for add, sub and mul: an example of the kernels a vendor ports
// first, in a file of their own (any number of files may include accelkit's headers; these
// TORCH_LIBRARY_IMPL blocks register while the extension loads, and accelkit's registration
// keeps them).
//
// The fast path is what the hardware does well: two dense tensors of one floating dtype and
// one shape. Everything else (broadcasting, type promotion, strided views, integer dtypes)
// goes back to accelkit's fallback in one line, ACCELKIT_FALLBACK.
#include <accelkit/accelkit.h>

#include <ATen/ops/add.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sub_ops.h>
#include <torch/library.h>

namespace {

// Both on the same mock device, same floating dtype and shape, dense and in the same layout,
// on memory the host can compute on (a discrete device launches a device kernel instead).
bool fast_path(const at::Tensor& a, const at::Tensor& b) {
  return accelkit::runtime().host_accessible() && accelkit::is_device(b) &&
         a.device() == b.device() && a.scalar_type() == b.scalar_type() &&
         at::isFloatingType(a.scalar_type()) && a.sizes() == b.sizes() &&
         a.is_contiguous() && b.is_contiguous() && !a.is_conj() && !b.is_conj() &&
         !a.is_neg() && !b.is_neg();
}

at::Tensor result_like(const at::Tensor& a) {
  return at::empty(a.sizes(), a.options());  // on a's device, through accelkit's allocator
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (!fast_path(self, other)) return ACCELKIT_FALLBACK(add_Tensor, self, other, alpha);
  at::Tensor out = result_like(self);
  at::Tensor host_out = accelkit::host_view(out);
  at::add_out(host_out, accelkit::host_view(self), accelkit::host_view(other), alpha);
  return out;
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (!fast_path(self, other)) return ACCELKIT_FALLBACK(sub_Tensor, self, other, alpha);
  at::Tensor out = result_like(self);
  at::Tensor host_out = accelkit::host_view(out);
  at::sub_out(host_out, accelkit::host_view(self), accelkit::host_view(other), alpha);
  return out;
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  if (!fast_path(self, other)) return ACCELKIT_FALLBACK(mul_Tensor, self, other);
  at::Tensor out = result_like(self);
  at::Tensor host_out = accelkit::host_view(out);
  at::mul_out(host_out, accelkit::host_view(self), accelkit::host_view(other));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", TORCH_FN(add));
  m.impl("sub.Tensor", TORCH_FN(sub));
  m.impl("mul.Tensor", TORCH_FN(mul));
}
