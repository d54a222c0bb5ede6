// torch.autocast(device_type=<device>): the AutocastPrivateUse1 kernels, with CUDA's op lists
// and policies from <ATen/autocast_mode.h> (lower precision for matmul/conv/linear, fp32 for
// reductions and pointwise transcendental ops, promotion for mixed-dtype ops). Without them
// every op inside an autocast region fails ("Could not run ... from the 'Autocast<name>'
// backend"). torch.<name>.get_amp_supported_dtype() says which dtypes may be asked for.
#include "runtime/registry.h"

#include <ATen/autocast_mode.h>

namespace accelkit {

void detail::register_autocast(torch::Library& m) {
  using namespace at;
  using namespace at::autocast;
#define ACCELKIT_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define ACCELKIT_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define ACCELKIT_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define ACCELKIT_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(ACCELKIT_LOWER_PRECISION_FP)
  AT_FORALL_FP32(ACCELKIT_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(ACCELKIT_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(ACCELKIT_PROMOTE)
#undef ACCELKIT_LOWER_PRECISION_FP
#undef ACCELKIT_FP32
#undef ACCELKIT_FP32_SET_OPT_DTYPE
#undef ACCELKIT_PROMOTE
}

}  // namespace accelkit
