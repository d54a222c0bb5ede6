// The device's Philox generator: state (uint64 seed, int64 offset) — 16 bytes, the layout
// torch's OffsetBasedRNGTracker reads and writes (torch/distributed/tensor/_random.py,
// PR 103235) — and one default generator per device. A vendor's own random kernel draws from
// it as accelkit's do (<accelkit/philox.h> for the stream layout):
//
//   PhiloxGenerator* g = accelkit::generator_for(gen, self.device().index());
//   uint64_t seed, offset;
//   { std::lock_guard<std::mutex> lock(g->mutex_); seed = g->current_seed();
//     offset = g->reserve(self.numel()); }
//   launch_my_philox_kernel(self, seed, offset);
#pragma once

#include <accelkit/context.h>

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <optional>

namespace accelkit {

constexpr int64_t kStateBytes = 16;

class PhiloxGenerator final : public c10::GeneratorImpl {
 public:
  explicit PhiloxGenerator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val);

  static c10::DeviceType device_type() { return kDeviceType; }

  // As CUDA: a new seed (all 64 bits of it: Philox's key) restarts the stream at offset 0.
  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override;
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  // 16 bytes: seed (uint64) then offset (int64), native byte order.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  void set_state(const c10::TensorImpl& state) override;

  // Reserve the stream for an op drawing `numel` elements: returns the op's starting offset
  // and advances the offset by ceil4(numel). Caller holds mutex_.
  uint64_t reserve(uint64_t numel) {
    const uint64_t start = offset_;
    offset_ += (numel + 3) / 4 * 4;
    return start;
  }

 private:
  PhiloxGenerator* clone_impl() const override;

  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The default generator of device `index` (negative: the current device), created on first
// use and never destroyed.
const at::Generator& default_generator(int64_t index);

// The generator an op with a `Generator?` argument uses on `device`: the given one (which
// must be a generator of this device type, as CUDA refuses a CPU generator) or the device's
// default.
PhiloxGenerator* generator_for(const std::optional<at::Generator>& gen, int device);

}  // namespace accelkit
