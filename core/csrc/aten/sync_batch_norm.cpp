// The kernels of torch.nn.SyncBatchNorm (torch/nn/modules/_functions.py): per-rank statistics,
// their combination across ranks after the all_gather, the normalisation, and the backward's
// reductions and elementwise gradient. torch has them for CUDA only (Normalization.cu), and the
// CPU has none for the fallback to run, so SyncBatchNorm, which torch allows on a PrivateUse1
// device, failed at its first op. Here they are compositions of aten ops on the device,
// computed in float for float16 and bfloat16 input and returning statistics in that type as
// CUDA's do (at::toAccumulateType). What a vendor replaces: fused kernels of its own.
#include "runtime/registry.h"

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/native/Resize.h>

#include <tuple>
#include <vector>

namespace accelkit {
namespace {

// The dims a per-channel statistic reduces over: all but dim 1 (N, C, *).
std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel tensor of C values shaped to broadcast against input (1, C, 1, ...).
at::Tensor per_channel(const at::Tensor& t, const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return t.reshape(shape);
}

at::ScalarType accumulate_type(const at::Tensor& input) {
  return at::toAccumulateType(input.scalar_type(), /*is_cuda=*/true);
}

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  const at::Tensor x = input.to(accumulate_type(input));
  const auto dims = reduced_dims(input);
  const at::Tensor mean = x.mean(dims);
  const at::Tensor var = (x - per_channel(mean, input)).pow(2).mean(dims);
  return {mean, (var + eps).rsqrt()};
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                            const at::Tensor& invstd, double /*eps*/) {
  at::Tensor out = (input.to(mean.scalar_type()) - per_channel(mean, input)) *
                   per_channel(invstd, input);
  if (weight.has_value() && weight->defined()) out = out * per_channel(weight->to(out.scalar_type()), input);
  if (bias.has_value() && bias->defined()) out = out + per_channel(bias->to(out.scalar_type()), input);
  return out.to(input.scalar_type());
}

at::Tensor& batch_norm_elemt_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                 const at::Tensor& invstd, double eps, at::Tensor& out) {
  const at::Tensor result = (batch_norm_elemt)(input, weight, bias, mean, invstd, eps);
  at::native::resize_output(out, result.sizes());
  return out.copy_(result);
}

// Combines each rank's (mean, invstd, count) into the global ones (Chan et al.'s parallel
// variance), updating the running statistics with the unbiased variance. A rank with count 0
// (an empty input) contributes nothing.
std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(
    const at::Tensor& /*input*/, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    double momentum, double eps, const at::Tensor& counts) {
  const at::ScalarType type = mean.scalar_type();
  const at::Tensor n = counts.to(type).reshape({-1, 1});  // (ranks, 1)
  const at::Tensor present = n > 0;
  const at::Tensor total = n.sum(0);                        // (1,)
  const at::Tensor global_mean = at::where(present, n * mean, 0).sum(0) / total;
  const at::Tensor var = invstd.pow(-2) - eps;
  const at::Tensor m2 =
      at::where(present, n * (var + (mean - global_mean).pow(2)), 0).sum(0);
  const at::Tensor global_var = m2 / total;
  if (running_mean.has_value() && running_mean->defined()) {
    running_mean->copy_((*running_mean * (1 - momentum) + global_mean * momentum)
                            .to(running_mean->scalar_type()));
  }
  if (running_var.has_value() && running_var->defined()) {
    const at::Tensor unbiased = m2 / (total - 1);
    running_var->copy_((*running_var * (1 - momentum) + unbiased * momentum)
                           .to(running_var->scalar_type()));
  }
  return {global_mean, (global_var + eps).rsqrt()};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    double momentum, double eps, int64_t count) {
  const at::Tensor counts = at::full({mean.size(0)}, count, mean.options());
  return (batch_norm_gather_stats_with_counts)(input, mean, invstd, running_mean, running_var,
                                             momentum, eps, counts);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
    const at::Tensor& invstd, const std::optional<at::Tensor>& weight, bool input_g,
    bool weight_g, bool bias_g) {
  const at::ScalarType type = mean.scalar_type();
  const auto dims = reduced_dims(input);
  const at::Tensor dy = grad_out.to(type);
  const at::Tensor sum_dy = dy.sum(dims);
  const at::Tensor sum_dy_xmu = (dy * (input.to(type) - per_channel(mean, input))).sum(dims);
  const at::ScalarType weight_type =
      weight.has_value() && weight->defined() ? weight->scalar_type() : input.scalar_type();
  return {input_g ? sum_dy : at::Tensor(), input_g ? sum_dy_xmu : at::Tensor(),
          weight_g ? (sum_dy_xmu * invstd).to(weight_type) : at::Tensor(),
          bias_g ? sum_dy.to(weight_type) : at::Tensor()};
}

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,
                                     const at::Tensor& mean, const at::Tensor& invstd,
                                     const std::optional<at::Tensor>& weight,
                                     const at::Tensor& sum_dy, const at::Tensor& sum_dy_xmu,
                                     const at::Tensor& count) {
  const at::ScalarType type = mean.scalar_type();
  const at::Tensor total = count.to(type).sum();
  const at::Tensor mean_dy = per_channel(sum_dy / total, input);
  const at::Tensor mean_dy_xmu = per_channel(sum_dy_xmu / total, input);
  const at::Tensor inv = per_channel(invstd, input);
  const at::Tensor xmu = input.to(type) - per_channel(mean, input);
  at::Tensor grad = (grad_out.to(type) - mean_dy - xmu * inv.pow(2) * mean_dy_xmu) * inv;
  if (weight.has_value() && weight->defined()) grad = grad * per_channel(weight->to(type), input);
  return grad.to(input.scalar_type());
}

}  // namespace

void detail::register_sync_batch_norm(KernelTable& m) {
  m.impl("batch_norm_stats", TORCH_FN(batch_norm_stats));
  m.impl("batch_norm_elemt", TORCH_FN(batch_norm_elemt));
  m.impl("batch_norm_elemt.out", TORCH_FN(batch_norm_elemt_out));
  m.impl("batch_norm_gather_stats", TORCH_FN(batch_norm_gather_stats));
  m.impl("batch_norm_gather_stats_with_counts", TORCH_FN(batch_norm_gather_stats_with_counts));
  m.impl("batch_norm_backward_reduce", TORCH_FN(batch_norm_backward_reduce));
  m.impl("batch_norm_backward_elemt", TORCH_FN(batch_norm_backward_elemt));
}

}  // namespace accelkit
