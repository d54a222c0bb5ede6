// The Philox generator's state and the default generators (<accelkit/generator.h>).
#include <accelkit/generator.h>

#include "testing/faults.h"

#include <ATen/EmptyTensor.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <deque>
#include <mutex>

namespace accelkit {

PhiloxGenerator::PhiloxGenerator(c10::DeviceIndex index, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kDeviceType, index),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void PhiloxGenerator::set_current_seed(uint64_t seed) {
#ifdef ACCELKIT_FAULTS
  if (faults::active("seed_truncated_to_32_bits")) seed &= 0xffffffffULL;
#endif
  seed_ = seed;
  offset_ = 0;
}

uint64_t PhiloxGenerator::seed() {
  const uint64_t s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}

c10::intrusive_ptr<c10::TensorImpl> PhiloxGenerator::get_state() const {
  int64_t bytes = kStateBytes;
#ifdef ACCELKIT_FAULTS
  if (faults::active("rng_state_24_bytes")) bytes = kStateBytes + 8;
#endif
  // empty_cpu, not at::empty: no dispatch, so FakeTensorMode cannot intercept it.
  auto state = at::detail::empty_cpu({bytes}, at::kByte, std::nullopt, std::nullopt,
                                     std::nullopt, std::nullopt);
  auto* p = state.data_ptr<uint8_t>();
  const int64_t offset = static_cast<int64_t>(offset_);
  std::memcpy(p, &seed_, 8);
  std::memcpy(p + 8, &offset, 8);
#ifdef ACCELKIT_FAULTS
  std::memset(p + kStateBytes, 0, bytes - kStateBytes);
#endif
  return state.getIntrusivePtr();
}

void PhiloxGenerator::set_state(const c10::TensorImpl& state) {
  TORCH_CHECK(state.device().is_cpu() && state.dtype() == at::kByte,
              "RNG state must be a torch.ByteTensor on the CPU, got ", state.dtype(), " on ",
              state.device());
  bool accepted = state.numel() == kStateBytes;
#ifdef ACCELKIT_FAULTS
  if (faults::active("rng_state_24_bytes")) accepted = state.numel() == kStateBytes + 8;
#endif
  TORCH_CHECK(accepted, "Expected a ", device_name(), " RNG state of ",
              kStateBytes, " bytes (uint64 seed, int64 offset), got ", state.numel(), " bytes");
  TORCH_CHECK(state.is_contiguous(), "RNG state must be contiguous");
  const auto* p = static_cast<const uint8_t*>(state.data());
  int64_t offset = 0;
  std::memcpy(&seed_, p, 8);
  std::memcpy(&offset, p + 8, 8);
  TORCH_CHECK(offset >= 0, "RNG state offset must be non-negative, got ", offset);
  offset_ = static_cast<uint64_t>(offset);
}

PhiloxGenerator* PhiloxGenerator::clone_impl() const {
  auto* g = new PhiloxGenerator(device().index(), seed_);
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(int64_t index) {
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

PhiloxGenerator* generator_for(const std::optional<at::Generator>& gen, int device) {
  if (gen.has_value() && gen->defined()) {
    TORCH_CHECK(gen->device().type() == kDeviceType, "Expected a '", device_name(),
                "' device type for generator but found '", gen->device().type(), "'");
    return gen->get<PhiloxGenerator>();
  }
  return default_generator(device).get<PhiloxGenerator>();
}

}  // namespace accelkit
