// The device's Philox generator: state (uint64 seed, int64 offset) — 16 bytes, the layout
// torch's OffsetBasedRNGTracker reads and writes (torch/distributed/tensor/_random.py,
// PR 103235) — and one default generator per device (issue #4).
#pragma once

#include <accelkit/context.h>

#include <ATen/core/Generator.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>

#include <cstring>
#include <deque>
#include <mutex>

namespace accelkit {

constexpr int64_t kStateBytes = 16;

class PhiloxGenerator final : public c10::GeneratorImpl {
 public:
  explicit PhiloxGenerator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kDeviceType, index), c10::DispatchKeySet(
                                                                  c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  static c10::DeviceType device_type() { return kDeviceType; }

  // As CUDA: a new seed restarts the stream at offset 0.
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    const uint64_t s = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  // 16 bytes: seed (uint64) then offset (int64), native byte order.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    // empty_cpu, not at::empty: no dispatch, so FakeTensorMode cannot intercept it.
    auto state = at::detail::empty_cpu({kStateBytes}, at::kByte, std::nullopt, std::nullopt,
                                       std::nullopt, std::nullopt);
    auto* p = state.data_ptr<uint8_t>();
    const int64_t offset = static_cast<int64_t>(offset_);
    std::memcpy(p, &seed_, 8);
    std::memcpy(p + 8, &offset, 8);
    return state.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.device().is_cpu() && state.dtype() == at::kByte,
                "RNG state must be a torch.ByteTensor on the CPU, got ", state.dtype(), " on ",
                state.device());
    TORCH_CHECK(state.numel() == kStateBytes, "Expected a ", device_name(),
                " RNG state of ", kStateBytes, " bytes (uint64 seed, int64 offset), got ",
                state.numel(), " bytes");
    TORCH_CHECK(state.is_contiguous(), "RNG state must be contiguous");
    const auto* p = static_cast<const uint8_t*>(state.data());
    int64_t offset = 0;
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset, p + 8, 8);
    TORCH_CHECK(offset >= 0, "RNG state offset must be non-negative, got ", offset);
    offset_ = static_cast<uint64_t>(offset);
  }

  // Reserve the stream for an op drawing `numel` elements: returns the op's starting offset
  // and advances the offset by ceil4(numel). Caller holds mutex_.
  uint64_t reserve(uint64_t numel) {
    const uint64_t start = offset_;
    offset_ += (numel + 3) / 4 * 4;
    return start;
  }

 private:
  PhiloxGenerator* clone_impl() const override {
    auto* g = new PhiloxGenerator(device().index(), seed_);
    g->offset_ = offset_;
    return g;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

// One default generator per device, created on first use and never destroyed.
inline const at::Generator& default_generator(int64_t index) {
  static std::once_flag once;
  static std::deque<at::Generator>* gens = nullptr;
  std::call_once(once, [] {
    gens = new std::deque<at::Generator>();
    for (int i = 0; i < device_count(); ++i) {
      gens->push_back(at::make_generator<PhiloxGenerator>(static_cast<c10::DeviceIndex>(i)));
    }
  });
  return (*gens)[resolve_index(index)];
}

// The generator an op with a `Generator?` argument uses on `device`: the given one (which
// must be one of ours, as CUDA refuses a CPU generator) or the device's default.
inline PhiloxGenerator* generator_for(const std::optional<at::Generator>& gen, int device) {
  if (gen.has_value() && gen->defined()) {
    TORCH_CHECK(gen->device().type() == kDeviceType, "Expected a '", device_name(),
                "' device type for generator but found '", gen->device().type(), "'");
    return gen->get<PhiloxGenerator>();
  }
  return default_generator(device).get<PhiloxGenerator>();
}

}  // namespace accelkit
