// Native kernels of the mock for add, sub and mul: an example of the kernels a vendor ports
// first, in a file of their own (any number of files may include accelkit's headers; these
// TORCH_LIBRARY_IMPL blocks register while the extension loads, and accelkit's registration
// keeps them).
//
// The fast path is what the hardware does well: two dense tensors of one floating dtype and
// one shape. Everything else (broadcasting, type promotion, strided views, integer dtypes)
// goes back to accelkit's fallback in one line, ACCELKIT_FALLBACK.
//
// The kernel is launched as a device's is: on the current stream (Runtime::launch), computing
// on device memory (the mock's "device" is the host: MockRuntime::host_address, the driver's
// mockDevicePointerToHost, translates a discrete device's pointers; a real kernel launch takes
// the device pointers as they are).
#include "../mock_runtime.h"

#include <accelkit/accelkit.h>

#include <ATen/ops/add.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sub_ops.h>
#include <torch/library.h>

namespace {

// Both on the same mock device, same floating dtype and shape, dense and in the same layout.
bool fast_path(const at::Tensor& a, const at::Tensor& b) {
  return accelkit::is_device(b) && a.device() == b.device() &&
         a.scalar_type() == b.scalar_type() && at::isFloatingType(a.scalar_type()) &&
         a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous() && !a.is_conj() &&
         !b.is_conj() && !a.is_neg() && !b.is_neg();
}

// A CPU tensor over the device memory of `t`, for the kernel body.
at::Tensor on_host(const at::Tensor& t) {
  auto& rt = static_cast<accelkit_mock::MockRuntime&>(accelkit::runtime());
  return at::from_blob(rt.host_address(t.data_ptr()), t.sizes(), t.strides(),
                       t.options().device(c10::DeviceType::CPU));
}

// out = body(self, other), launched on the current stream of out's device. As a device kernel
// launch, it takes the memory (views of it), not the tensors: freed meanwhile, a block goes back
// to its stream's cache, whose later work runs after this kernel (stream-ordered allocation).
template <typename Body>
at::Tensor launch(const char* what, const at::Tensor& self, const at::Tensor& other, Body body) {
  at::Tensor out = at::empty(self.sizes(), self.options());  // through accelkit's allocator
  const int device = out.device().index();
  accelkit::runtime().launch(device, accelkit::current_stream(device), what,
                             [o = on_host(out), a = on_host(self), b = on_host(other),
                              body]() mutable { body(o, a, b); });
  return out;
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (!fast_path(self, other)) return ACCELKIT_FALLBACK(add_Tensor, self, other, alpha);
  return launch("add", self, other, [alpha](at::Tensor& o, const at::Tensor& a,
                                            const at::Tensor& b) { at::add_out(o, a, b, alpha); });
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (!fast_path(self, other)) return ACCELKIT_FALLBACK(sub_Tensor, self, other, alpha);
  return launch("sub", self, other, [alpha](at::Tensor& o, const at::Tensor& a,
                                            const at::Tensor& b) { at::sub_out(o, a, b, alpha); });
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  if (!fast_path(self, other)) return ACCELKIT_FALLBACK(mul_Tensor, self, other);
  return launch("mul", self, other,
                [](at::Tensor& o, const at::Tensor& a, const at::Tensor& b) { at::mul_out(o, a, b); });
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", TORCH_FN(add));
  m.impl("sub.Tensor", TORCH_FN(sub));
  m.impl("mul.Tensor", TORCH_FN(mul));
}
