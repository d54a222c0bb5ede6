// The fused RNN cells as compositions of the device's own ops. aten's LSTM/GRU cells take the
// fused path on every device that is not the CPU (aten/src/ATen/native/RNN.cpp: LSTMCell and
// GRUCell call _thnn_fused_lstm_cell / _thnn_fused_gru_cell when the input is on CUDA, XPU or
// PrivateUse1), and those ops have CUDA kernels only: no CPU kernel the fallback could run. The
// gate arithmetic below is that of the CUDA kernels (aten/src/ATen/native/cuda/RNN.cu), with
// the same workspace layout, so the autograd formulas of derivatives.yaml apply unchanged. A
// vendor with a fused kernel registers it for these ops; it then replaces these.
#include "runtime/registry.h"

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace accelkit {
namespace {

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

// LSTM: gates = input_gates + hidden_gates (+ biases), chunks (i, f, g, o); returns
// (hy, cy, workspace) with the activated gates as the workspace (N, 4H).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  const at::Tensor gates = with_bias(input_gates, input_bias) + with_bias(hidden_gates, hidden_bias);
  const auto chunks = gates.chunk(4, 1);
  const at::Tensor i = chunks[0].sigmoid();
  const at::Tensor f = chunks[1].sigmoid();
  const at::Tensor g = chunks[2].tanh();
  const at::Tensor o = chunks[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

// Returns (grad of the gates before activation, grad_cx, grad of the bias or undefined).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  const auto gates = workspace.chunk(4, 1);
  const at::Tensor &i = gates[0], &f = gates[1], &g = gates[2], &o = gates[3];
  const at::Tensor tanh_cy = cy.tanh();
  const bool has_hy = grad_hy.has_value() && grad_hy->defined();
  const bool has_cy = grad_cy.has_value() && grad_cy->defined();
  const at::Tensor ghy = has_hy ? *grad_hy : at::zeros_like(cy);
  at::Tensor gcx = ghy * o * (1 - tanh_cy * tanh_cy);
  if (has_cy) gcx = gcx + *grad_cy;
  const at::Tensor d_i = gcx * g * i * (1 - i);
  const at::Tensor d_f = gcx * cx * f * (1 - f);
  const at::Tensor d_g = gcx * i * (1 - g * g);
  const at::Tensor d_o = ghy * tanh_cy * o * (1 - o);
  at::Tensor grad_gates = at::cat({d_i, d_f, d_g, d_o}, 1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, gcx * f, grad_bias};
}

// GRU: chunks (r, z, n) of each side; n = tanh(in + r * hn); hy = n + z * (hx - n); returns
// (hy, workspace) with the workspace (N, 5H) = (r, z, n, hx, hn) as CUDA's.
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  const auto in = with_bias(input_gates, input_bias).chunk(3, 1);
  const auto hid = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  const at::Tensor r = (in[0] + hid[0]).sigmoid();
  const at::Tensor z = (in[1] + hid[1]).sigmoid();
  const at::Tensor n = (in[2] + r * hid[2]).tanh();
  at::Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, hid[2]}, 1)};
}

// Returns (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  const auto parts = workspace.chunk(5, 1);
  const at::Tensor &r = parts[0], &z = parts[1], &n = parts[2], &hx = parts[3], &hn = parts[4];
  const at::Tensor d_n = grad_hy * (1 - z) * (1 - n * n);
  const at::Tensor d_z = grad_hy * (hx - n) * z * (1 - z);
  const at::Tensor d_r = d_n * hn * r * (1 - r);
  at::Tensor grad_input = at::cat({d_r, d_z, d_n}, 1);
  at::Tensor grad_hidden = at::cat({d_r, d_z, d_n * r}, 1);
  at::Tensor grad_input_bias = has_bias ? grad_input.sum(0) : at::Tensor();
  at::Tensor grad_hidden_bias = has_bias ? grad_hidden.sum(0) : at::Tensor();
  return {grad_input, grad_hidden, grad_hy * z, grad_input_bias, grad_hidden_bias};
}

}  // namespace

void detail::register_rnn_cells(KernelTable& m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}

}  // namespace accelkit
