// Native random kernels drawing from the device's Philox generator, offset-exact (see
// <accelkit/philox.h>): uniform_, normal_, bernoulli_ (float and tensor p), random_ (all
// overloads), exponential_, log_normal_, cauchy_, geometric_, normal (tensor mean/std) and
// native_dropout; rand/randn/randint/*_like, bernoulli, dropout and nn.init.* reach them.
// Each op reserves ceil4(numel) of the generator's offset.
//
// Numbers are generated on the host: straight into the tensor when it is contiguous host
// memory (on an asynchronous device, by a kernel launched on the current stream), else into a
// contiguous CPU buffer copied in. A vendor with device-side Philox replaces fill()
// with a kernel launch taking (seed, offset).
#include <accelkit/generator.h>
#include <accelkit/host_tensor.h>
#include <accelkit/philox.h>

#include "runtime/registry.h"
#include "testing/faults.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <mutex>

namespace accelkit {
namespace {

// Run f(i, words) for every element i in [0, n), in parallel chunks (the values do not depend
// on the chunking).
template <int M, typename F>
void draw(uint64_t seed, uint64_t offset, int64_t n, const F& f) {
  at::parallel_for(0, n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    philox::for_each_element<M>(seed, offset + static_cast<uint64_t>(begin), end - begin,
                                [&](int64_t j, const uint32_t* w) { f(begin + j, w); });
  });
}

// fill(contiguous CPU tensor, seed, offset) into the device memory `view` covers (a CPU tensor
// over it: host_view, taken when the op was called), now: in place on host-accessible memory,
// else through a host buffer copied in with the runtime's plain copy (on an asynchronous device
// this runs as the stream's task, so that copy is in stream order).
template <typename Fill>
void fill_in_order(const at::Tensor& view, int device, uint64_t seed, uint64_t offset,
                   const Fill& f) {
  const bool zero_copy = runtime().host_accessible();
  if (zero_copy && view.is_contiguous()) {
    at::Tensor host = view;
    f(host, seed, offset);
    return;
  }
  at::Tensor host = at::empty(view.sizes(), view.options());
  f(host, seed, offset);
  if (zero_copy) {
    view.copy_(host);
    return;
  }
  void* data = view.storage().mutable_data();
  const size_t nbytes = view.storage().nbytes();
  if (view.is_contiguous()) {
    runtime().copy(static_cast<char*>(data) +
                       view.storage_offset() * static_cast<int64_t>(view.itemsize()),
                   device, host.data_ptr(), kHost, host.nbytes());
    return;
  }
  at::Tensor bytes = at::empty({static_cast<int64_t>(nbytes)}, at::kByte);
  runtime().copy(bytes.data_ptr(), kHost, data, device, nbytes);
  host_tensor(bytes.storage(), view).copy_(host);
  runtime().copy(data, device, bytes.data_ptr(), kHost, nbytes);
}

// Reserve the generator's stream for `self` and call fill(contiguous CPU tensor, seed,
// offset); the result lands in `self`.
template <typename Fill>
at::Tensor& fill(at::Tensor& self, const std::optional<at::Generator>& gen, const Fill& f) {
  PhiloxGenerator* g = generator_for(gen, self.device().index());
  uint64_t seed = 0, offset = 0;
  {
    std::lock_guard<std::mutex> lock(g->mutex_);
    seed = g->current_seed();
    offset = g->reserve(static_cast<uint64_t>(self.numel()));
#ifdef ACCELKIT_FAULTS
    if (faults::active("rng_offset_not_advanced")) g->set_offset(offset);
    if (faults::active("rng_offset_unrounded")) g->set_offset(offset + self.numel());
#endif
  }
  if (self.numel() == 0) return self;
  const int device = self.device().index();
  at::Tensor view = host_view(self);  // the memory self has now, as a kernel launch takes it
  if (runtime().async()) {  // the kernel, on the current stream; it holds the pointer only
    runtime().launch(device, current_stream(device), "random",
                     [view, device, seed, offset, f] {
                       fill_in_order(view, device, seed, offset, f);
                     });
  } else {
    fill_in_order(view, device, seed, offset, f);
  }
  return self;
}

// Elementwise transform of a uniform draw u in [0, 1): 1 word for float/half/bfloat16 (24
// random bits), 2 words for double (53 bits).
template <typename Op>
void fill_uniform(at::Tensor& out, uint64_t seed, uint64_t offset, const Op& op) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "uniform", [&] {
    scalar_t* p = out.data_ptr<scalar_t>();
    if constexpr (std::is_same_v<scalar_t, double>) {
      draw<2>(seed, offset, out.numel(), [&](int64_t i, const uint32_t* w) {
        p[i] = op(philox::to_unit_double(w));
      });
    } else {
      draw<1>(seed, offset, out.numel(), [&](int64_t i, const uint32_t* w) {
        p[i] = static_cast<scalar_t>(op(philox::to_unit_float(w[0])));
      });
    }
  });
}

void check_floating(const at::Tensor& self, const char* op) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), op,
              " is only implemented for floating point types, got ", self.scalar_type());
}

at::Tensor& uniform_(at::Tensor& self, double from, double to,
                            std::optional<at::Generator> gen) {
  if (self.is_complex()) {  // as the CPU kernel: real and imaginary parts each uniform
    at::Tensor real = at::view_as_real(self);
    uniform_(real, from, to, gen);
    return self;
  }
  check_floating(self, "uniform_");
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from,
              " > to=", to);
  TORCH_CHECK(std::isfinite(to - from), "uniform_ expects to-from <= std::numeric_limits<",
              self.scalar_type(), ">::max(), but found to=", to, " and from=", from,
              " which result in to-from to exceed the limit");
  return fill(self, gen, [=](at::Tensor& out, uint64_t seed, uint64_t offset) {
    if (out.scalar_type() == at::kDouble) {
      fill_uniform(out, seed, offset, [=](double u) { return from + (to - from) * u; });
    } else {
      const float f = static_cast<float>(from), r = static_cast<float>(to - from);
      fill_uniform(out, seed, offset, [=](float u) { return f + r * u; });
    }
  });
}

// Box-Muller on two uniforms of the element's own words: 2 words (float types) or 4 (double).
at::Tensor& normal_(at::Tensor& self, double mean, double std,
                           std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  if (self.is_complex()) {  // as the CPU kernel: each part normal with std / sqrt(2)
    at::Tensor real = at::view_as_real(self);
    normal_(real, mean, std / std::sqrt(2.0), gen);
    return self;
  }
  check_floating(self, "normal_");
  return fill(self, gen, [=](at::Tensor& out, uint64_t seed, uint64_t offset) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "normal_", [&] {
      scalar_t* p = out.data_ptr<scalar_t>();
      if constexpr (std::is_same_v<scalar_t, double>) {
        draw<4>(seed, offset, out.numel(), [&](int64_t i, const uint32_t* w) {
          const double u1 = 1.0 - philox::to_unit_double(w);  // (0, 1]
          const double u2 = philox::to_unit_double(w + 2);
          p[i] = mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        });
      } else {
        const float m = static_cast<float>(mean), s = static_cast<float>(std);
        draw<2>(seed, offset, out.numel(), [&](int64_t i, const uint32_t* w) {
          const float u1 = 1.0f - philox::to_unit_float(w[0]);
          const float u2 = philox::to_unit_float(w[1]);
          p[i] = static_cast<scalar_t>(
              m + s * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2));
        });
      }
    });
  });
}

at::Tensor& exponential_(at::Tensor& self, double lambd,
                                std::optional<at::Generator> gen) {
  check_floating(self, "exponential_");
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  return fill(self, gen, [=](at::Tensor& out, uint64_t seed, uint64_t offset) {
    fill_uniform(out, seed, offset, [=](auto u) {
      using T = decltype(u);
      return static_cast<T>(-std::log1p(-u) / static_cast<T>(lambd));
    });
  });
}

at::Tensor& log_normal_(at::Tensor& self, double mean, double std,
                               std::optional<at::Generator> gen) {
  check_floating(self, "log_normal_");
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  normal_(self, mean, std, gen);
  return self.exp_();
}

at::Tensor& cauchy_(at::Tensor& self, double median, double sigma,
                           std::optional<at::Generator> gen) {
  check_floating(self, "cauchy_");
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  return fill(self, gen, [=](at::Tensor& out, uint64_t seed, uint64_t offset) {
    fill_uniform(out, seed, offset, [=](auto u) {
      using T = decltype(u);
      return static_cast<T>(median + sigma * std::tan(M_PI * (static_cast<double>(u) - 0.5)));
    });
  });
}

at::Tensor& geometric_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  at::Tensor u = at::empty(self.sizes(), self.options().dtype(at::kDouble));
  fill(u, gen, [=](at::Tensor& out, uint64_t seed, uint64_t offset) {
    fill_uniform(out, seed, offset, [=](double v) {
      return std::ceil(std::log1p(-v) / std::log1p(-p));
    });
  });
  self.copy_(u);
  return self;
}

// Elementwise u < p, written as 0/1 of any dtype; p a scalar or a tensor (broadcast to self).
at::Tensor& bernoulli_scalar(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 <= p && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  return fill(self, gen, [=](at::Tensor& out, uint64_t seed, uint64_t offset) {
    const float pf = static_cast<float>(p);
    AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, out.scalar_type(),
                               "bernoulli_", [&] {
      scalar_t* o = out.data_ptr<scalar_t>();
      draw<1>(seed, offset, out.numel(), [&](int64_t i, const uint32_t* w) {
        o[i] = static_cast<scalar_t>(philox::to_unit_float(w[0]) < pf);
      });
    });
  });
}

at::Tensor& bernoulli_tensor(at::Tensor& self, const at::Tensor& p,
                                    std::optional<at::Generator> gen) {
  TORCH_CHECK(at::isFloatingType(p.scalar_type()),
              "bernoulli_ expects p to be a floating point tensor, got ", p.scalar_type());
  TORCH_CHECK(!is_device(p) || p.device() == self.device(),
              "Expected all tensors to be on the same device, but found at least two devices, ",
              self.device(), " and ", p.device(), "!");
  const at::Tensor probs =
      p.to(c10::DeviceType::CPU, at::kFloat).expand(self.sizes()).contiguous();
  return fill(self, gen, [=](at::Tensor& out, uint64_t seed, uint64_t offset) {
    const float* pp = probs.data_ptr<float>();
    AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, out.scalar_type(),
                               "bernoulli_", [&] {
      scalar_t* o = out.data_ptr<scalar_t>();
      draw<1>(seed, offset, out.numel(), [&](int64_t i, const uint32_t* w) {
        o[i] = static_cast<scalar_t>(philox::to_unit_float(w[0]) < pp[i]);
      });
    });
  });
}

// random_: from + (r mod range), r of 32 bits when the range fits, else 64 bits; range 0
// means the full 2^64 range.
at::Tensor& random_range(at::Tensor& self, int64_t from, uint64_t range,
                                std::optional<at::Generator> gen) {
  return fill(self, gen, [=](at::Tensor& out, uint64_t seed, uint64_t offset) {
    AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, out.scalar_type(),
                               "random_", [&] {
      scalar_t* o = out.data_ptr<scalar_t>();
      if (range != 0 && range <= (uint64_t{1} << 32)) {
        draw<1>(seed, offset, out.numel(), [&](int64_t i, const uint32_t* w) {
          o[i] = static_cast<scalar_t>(from + static_cast<int64_t>(w[0] % range));
        });
      } else {
        draw<2>(seed, offset, out.numel(), [&](int64_t i, const uint32_t* w) {
          const uint64_t r = philox::to_u64(w);
          o[i] = static_cast<scalar_t>(
              static_cast<int64_t>(static_cast<uint64_t>(from) + (range ? r % range : r)));
        });
      }
    });
  });
}

// The largest value random_() may produce for the dtype: 2^digits for floating types (every
// integer up to it is exact), the maximum for integral types, 1 for bool.
int64_t default_to_inclusive(at::ScalarType t) {
  switch (t) {
    case at::kBool: return 1;
    case at::kHalf: return int64_t{1} << 11;
    case at::kBFloat16: return int64_t{1} << 8;
    case at::kFloat: return int64_t{1} << 24;
    case at::kDouble: return int64_t{1} << 53;
    default: break;
  }
  int64_t max = 0;
  AT_DISPATCH_INTEGRAL_TYPES(t, "random_", [&] {
    max = static_cast<int64_t>(std::numeric_limits<scalar_t>::max());
  });
  return max;
}

at::Tensor& random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to,
                               std::optional<at::Generator> gen) {
  if (to.has_value()) {
    TORCH_CHECK(from < *to, "random_ expects 'from' to be less than 'to', but got from=", from,
                " >= to=", *to);
    return random_range(self, from, static_cast<uint64_t>(*to) - static_cast<uint64_t>(from),
                        gen);
  }
  const int64_t to_inc = default_to_inclusive(self.scalar_type());
  TORCH_CHECK(from <= to_inc, "random_ expects 'from' casted to dtype to be less than or equal "
              "to 'to' casted to dtype, but got from=", from, " > to=", to_inc);
  return random_range(self, from,
                      static_cast<uint64_t>(to_inc) - static_cast<uint64_t>(from) + 1, gen);
}

at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_from(self, 0, to, gen);
}

at::Tensor& random_default(at::Tensor& self, std::optional<at::Generator> gen) {
  return random_from(self, 0, std::nullopt, gen);
}

// normal with tensor mean and/or std: a standard normal draw (offset-exact) scaled.
at::Tensor normal_tensor_float(const at::Tensor& mean, double std,
                                      std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  at::Tensor out = at::empty_like(mean, at::MemoryFormat::Contiguous);
  normal_(out, 0.0, 1.0, gen);
  return out.mul_(std).add_(mean);
}

at::Tensor normal_float_tensor(double mean, const at::Tensor& std,
                                      std::optional<at::Generator> gen) {
  at::Tensor out = at::empty_like(std, at::MemoryFormat::Contiguous);
  normal_(out, 0.0, 1.0, gen);
  return out.mul_(std).add_(mean);
}

at::Tensor normal_tensor_tensor(const at::Tensor& mean, const at::Tensor& std,
                                       std::optional<at::Generator> gen) {
  const auto shape = at::infer_size(mean.sizes(), std.sizes());
  at::Tensor out = at::empty(shape, mean.options());
  normal_(out, 0.0, 1.0, gen);
  return out.mul_(std).add_(mean);
}

// Dropout mask from bernoulli(1 - p) on the device generator (torch's CPU
// fallback's native_dropout would draw from the CPU generator).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                         std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  if (p == 1) {
    mask.zero_();
    return {at::zeros_like(input), mask};
  }
  bernoulli_scalar(mask, 1 - p, std::nullopt);
  return {input.mul(mask).mul_(1.0 / (1.0 - p)), mask};
}

}  // namespace

void detail::register_random(KernelTable& m) {
  m.impl("uniform_", TORCH_FN(uniform_));
  m.impl("normal_", TORCH_FN(normal_));
  m.impl("normal.Tensor_float", TORCH_FN(normal_tensor_float));
  m.impl("normal.float_Tensor", TORCH_FN(normal_float_tensor));
  m.impl("normal.Tensor_Tensor", TORCH_FN(normal_tensor_tensor));
  m.impl("exponential_", TORCH_FN(exponential_));
  m.impl("log_normal_", TORCH_FN(log_normal_));
  m.impl("cauchy_", TORCH_FN(cauchy_));
  m.impl("geometric_", TORCH_FN(geometric_));
  m.impl("bernoulli_.float", TORCH_FN(bernoulli_scalar));
  m.impl("bernoulli_.Tensor", TORCH_FN(bernoulli_tensor));
  m.impl("random_", TORCH_FN(random_default));
  m.impl("random_.from", TORCH_FN(random_from));
  m.impl("random_.to", TORCH_FN(random_to));
  m.impl("native_dropout", TORCH_FN(native_dropout));
}

}  // namespace accelkit
