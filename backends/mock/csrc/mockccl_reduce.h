// mockccl reduction kernels: out[i] = op(src[0][i], ..., src[n-1][i]) on host memory.
//
// float16 and bfloat16 accumulate in float32 over all sources and round once (as NCCL does);
// bool treats SUM/MAX/BOR as OR, PRODUCT/MIN/BAND as AND and BXOR as XOR; complex supports SUM
// and PRODUCT (the glue rejects the rest). A vendor's library has its own kernels on device.
#pragma once

#include <algorithm>
#include <cstdint>

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <c10/util/complex.h>

#include <accelkit/c10d/transport.h>

namespace mockccl {

using accelkit::c10d::RedOp;

template <typename T, typename Acc, typename F>
void reduce_blocks(void* out, const void* const* srcs, int nsrc, int64_t n, F f) {
  constexpr int64_t kBlock = 1024;
  Acc acc[kBlock];
  T* dst = static_cast<T*>(out);
  for (int64_t base = 0; base < n; base += kBlock) {
    const int64_t m = std::min(kBlock, n - base);
    const T* s0 = static_cast<const T*>(srcs[0]) + base;
    for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<Acc>(s0[i]);
    for (int r = 1; r < nsrc; ++r) {
      const T* s = static_cast<const T*>(srcs[r]) + base;
      for (int64_t i = 0; i < m; ++i) acc[i] = f(acc[i], static_cast<Acc>(s[i]));
    }
    for (int64_t i = 0; i < m; ++i) dst[base + i] = static_cast<T>(acc[i]);
  }
}

template <typename T, typename Acc>
void reduce_arith(RedOp op, void* out, const void* const* srcs, int nsrc, int64_t n) {
  switch (op) {
    case RedOp::kSum:
      return reduce_blocks<T, Acc>(out, srcs, nsrc, n, [](Acc a, Acc b) { return a + b; });
    case RedOp::kProduct:
      return reduce_blocks<T, Acc>(out, srcs, nsrc, n, [](Acc a, Acc b) { return a * b; });
    case RedOp::kMin:
      return reduce_blocks<T, Acc>(out, srcs, nsrc, n, [](Acc a, Acc b) { return b < a ? b : a; });
    case RedOp::kMax:
      return reduce_blocks<T, Acc>(out, srcs, nsrc, n, [](Acc a, Acc b) { return b > a ? b : a; });
    default:
      TORCH_CHECK(false, "mockccl: reduce op ", accelkit::c10d::redop_name(op),
                  " is not defined for floating-point tensors");
  }
}

template <typename T>
void reduce_integer(RedOp op, void* out, const void* const* srcs, int nsrc, int64_t n) {
  switch (op) {
    case RedOp::kBand:
      return reduce_blocks<T, T>(out, srcs, nsrc, n, [](T a, T b) { return static_cast<T>(a & b); });
    case RedOp::kBor:
      return reduce_blocks<T, T>(out, srcs, nsrc, n, [](T a, T b) { return static_cast<T>(a | b); });
    case RedOp::kBxor:
      return reduce_blocks<T, T>(out, srcs, nsrc, n, [](T a, T b) { return static_cast<T>(a ^ b); });
    default:
      return reduce_arith<T, T>(op, out, srcs, nsrc, n);
  }
}

inline void reduce_bool(RedOp op, void* out, const void* const* srcs, int nsrc, int64_t n) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kMax:
    case RedOp::kBor:
      return reduce_blocks<bool, bool>(out, srcs, nsrc, n, [](bool a, bool b) { return a || b; });
    case RedOp::kBxor:
      return reduce_blocks<bool, bool>(out, srcs, nsrc, n, [](bool a, bool b) { return a != b; });
    default:
      return reduce_blocks<bool, bool>(out, srcs, nsrc, n, [](bool a, bool b) { return a && b; });
  }
}

template <typename C>
void reduce_complex(RedOp op, void* out, const void* const* srcs, int nsrc, int64_t n) {
  switch (op) {
    case RedOp::kSum:
      return reduce_blocks<C, C>(out, srcs, nsrc, n, [](C a, C b) { return a + b; });
    case RedOp::kProduct:
      return reduce_blocks<C, C>(out, srcs, nsrc, n, [](C a, C b) { return a * b; });
    default:
      TORCH_CHECK(false, "mockccl: reduce op ", accelkit::c10d::redop_name(op),
                  " is not defined for complex tensors");
  }
}

// out[i] = op over srcs[r][i], r < nsrc; `out` may alias a source.
inline void reduce(c10::ScalarType dtype, RedOp op, void* out, const void* const* srcs, int nsrc,
                   int64_t n) {
  if (n == 0) return;
  switch (dtype) {
    case c10::kFloat: return reduce_arith<float, float>(op, out, srcs, nsrc, n);
    case c10::kDouble: return reduce_arith<double, double>(op, out, srcs, nsrc, n);
    case c10::kHalf: return reduce_arith<c10::Half, float>(op, out, srcs, nsrc, n);
    case c10::kBFloat16: return reduce_arith<c10::BFloat16, float>(op, out, srcs, nsrc, n);
    case c10::kByte: return reduce_integer<uint8_t>(op, out, srcs, nsrc, n);
    case c10::kChar: return reduce_integer<int8_t>(op, out, srcs, nsrc, n);
    case c10::kShort: return reduce_integer<int16_t>(op, out, srcs, nsrc, n);
    case c10::kInt: return reduce_integer<int32_t>(op, out, srcs, nsrc, n);
    case c10::kLong: return reduce_integer<int64_t>(op, out, srcs, nsrc, n);
    case c10::kUInt16: return reduce_integer<uint16_t>(op, out, srcs, nsrc, n);
    case c10::kUInt32: return reduce_integer<uint32_t>(op, out, srcs, nsrc, n);
    case c10::kUInt64: return reduce_integer<uint64_t>(op, out, srcs, nsrc, n);
    case c10::kBool: return reduce_bool(op, out, srcs, nsrc, n);
    case c10::kComplexFloat: return reduce_complex<c10::complex<float>>(op, out, srcs, nsrc, n);
    case c10::kComplexDouble: return reduce_complex<c10::complex<double>>(op, out, srcs, nsrc, n);
    default:
      TORCH_CHECK(false, "mockccl: reductions on ", dtype, " tensors are not supported (supported: "
                  "float16/32/64, bfloat16, complex64/128, bool, int8..int64, uint8..uint64); "
                  "broadcast, gather, scatter and all-to-all work on every dtype");
  }
}

}  // namespace mockccl
