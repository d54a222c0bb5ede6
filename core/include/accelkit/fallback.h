// accelkit's boxed fallback: every aten op without a PrivateUse1 kernel runs through it (see
// core/csrc/aten/fallback.cpp for what it does: CUDA's device checks, device-generator randomness,
// zero-copy CPU kernels on host-accessible memory, copies otherwise).
//
// A native kernel hands the cases it does not support (other dtypes, broadcasting, ...) back
// to the fallback in one line, with the op's at::_ops name and its arguments:
//
//   #include <ATen/ops/add_ops.h>
//   at::Tensor my_add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
//     if (self.scalar_type() != at::kFloat || self.sizes() != other.sizes())
//       return ACCELKIT_FALLBACK(add_Tensor, self, other, alpha);
//     ...
//   }
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/native/CPUFallback.h>

namespace accelkit {

// The boxed fallback (registered for PrivateUse1 by register_device).
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace accelkit

// Run aten op `op` (its at::_ops name, e.g. add_Tensor; include <ATen/ops/<op>_ops.h>) with the
// kernel's arguments through accelkit's fallback.
#define ACCELKIT_FALLBACK(op, ...) \
  (at::native::call_fallback_fn<&::accelkit::fallback, at::_ops::op>::call(__VA_ARGS__))
