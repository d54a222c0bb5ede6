// The whole accelkit PrivateUse1 layer: include this from exactly one translation unit of a
// device extension, after defining `accelkit::Runtime& accelkit::runtime()` (see
// <accelkit/runtime.h>). It registers, at load time: the allocator, the device guard (streams,
// events), the hooks, the native kernels (minimum set + random) and the boxed fallback for
// every other op, and the autocast kernels (issue #4).
#pragma once

#include <accelkit/allocator.h>
#include <accelkit/autocast.h>
#include <accelkit/context.h>
#include <accelkit/fallback.h>
#include <accelkit/generator.h>
#include <accelkit/guard.h>
#include <accelkit/hooks.h>
#include <accelkit/kernels.h>
#include <accelkit/random.h>
#include <accelkit/runtime.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

namespace accelkit::registration {

struct Registrar {
  Registrar() {
    c10::SetAllocator(kDeviceType, &DeviceAllocator::get());
    at::RegisterPrivateUse1HooksInterface(new Hooks());
  }
};
inline Registrar registrar;

}  // namespace accelkit::registration

C10_REGISTER_GUARD_IMPL(PrivateUse1, accelkit::GuardImpl);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace accelkit;
  m.impl("empty.memory_format", TORCH_FN(kernels::empty_memory_format));
  m.impl("empty_strided", TORCH_FN(kernels::empty_strided));
  m.impl("as_strided", TORCH_FN(kernels::as_strided));
  m.impl("view", TORCH_FN(kernels::view));
  m.impl("_reshape_alias", TORCH_FN(kernels::reshape_alias));
  m.impl("resize_", TORCH_FN(kernels::resize_));
  m.impl("set_.source_Storage", TORCH_FN(kernels::set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(kernels::set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(kernels::set_tensor));
  m.impl("set_", TORCH_FN(kernels::set_empty));
  m.impl("_copy_from", TORCH_FN(kernels::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(kernels::copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(kernels::local_scalar_dense));
  m.impl("convolution_overrideable", TORCH_FN(kernels::convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(kernels::convolution_backward));

  m.impl("uniform_", TORCH_FN(random::uniform_));
  m.impl("normal_", TORCH_FN(random::normal_));
  m.impl("normal.Tensor_float", TORCH_FN(random::normal_tensor_float));
  m.impl("normal.float_Tensor", TORCH_FN(random::normal_float_tensor));
  m.impl("normal.Tensor_Tensor", TORCH_FN(random::normal_tensor_tensor));
  m.impl("exponential_", TORCH_FN(random::exponential_));
  m.impl("log_normal_", TORCH_FN(random::log_normal_));
  m.impl("cauchy_", TORCH_FN(random::cauchy_));
  m.impl("geometric_", TORCH_FN(random::geometric_));
  m.impl("bernoulli_.float", TORCH_FN(random::bernoulli_scalar));
  m.impl("bernoulli_.Tensor", TORCH_FN(random::bernoulli_tensor));
  m.impl("random_", TORCH_FN(random::random_default));
  m.impl("random_.from", TORCH_FN(random::random_from));
  m.impl("random_.to", TORCH_FN(random::random_to));
  m.impl("native_dropout", TORCH_FN(random::native_dropout));
}

// The conjugate/negative-bit fallbacks would materialize a lazily conjugated source of
// _copy_from by cloning it, and the clone copies through _copy_from again (endless recursion,
// CPU and CUDA never call _copy_from). copy_from handles the bits itself.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&accelkit::boxed_fallback>());
}
