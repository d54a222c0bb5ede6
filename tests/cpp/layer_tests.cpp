// C++ unit tests of accelkit's layer, as a small extension built in the test run (the way
// pybind11 tests itself): each function exercises one piece Python cannot see well and
// returns what it observed; tests/cpp/test_cpp_layer.py asserts on it.
//
//   philox_block         one Philox4x32-10 block (Random123's known-answer vectors)
//   philox_simd_matches  the SSE2/AVX2 block generator against the scalar reference
//   register_device      a second device registration (the test runtime below): must raise
//   allocator_case       the caching allocator's statistics, reuse and out-of-memory error
#include <accelkit/accelkit.h>
#include <accelkit/philox.h>

#include "runtime/allocator.h"  // core/csrc: the layer's private allocator

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

// Two devices of 1 MiB of host memory each.
class TestRuntime final : public accelkit::Runtime {
 public:
  int device_count() noexcept override { return 2; }
  void set_device(int) override {}
  size_t capacity(int) override { return 1 << 20; }
  void* allocate(int, size_t nbytes) override { return std::malloc(nbytes); }
  void release(int, void* ptr) noexcept override { std::free(ptr); }
  void* allocate_pinned(size_t nbytes) override { return std::malloc(nbytes); }
  void release_pinned(void* ptr) noexcept override { std::free(ptr); }
  void copy(void* dst, int, const void* src, int, size_t nbytes) override {
    std::memcpy(dst, src, nbytes);
  }
  void synchronize(int) override {}
  bool host_accessible() const noexcept override { return true; }
  std::string capacity_hint() const override { return "(the test runtime has 1 MiB)"; }
};

pybind11::dict stats_of(int device) {
  const auto s = accelkit::DeviceAllocator::get().getDeviceStats(device);
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  pybind11::dict out;
  out["allocated"] = s.allocated_bytes[agg].current;
  out["peak"] = s.allocated_bytes[agg].peak;
  out["reserved"] = s.reserved_bytes[agg].current;
  out["allocations"] = s.allocation[agg].current;
  out["num_ooms"] = s.num_ooms;
  out["retries"] = s.num_alloc_retries;
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("philox_block", [](std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
    accelkit::philox::block(counter.data(), key.data());
    return counter;
  });
  m.def("philox_simd_matches", [](uint64_t key, uint64_t first_block, int64_t nblocks) {
    std::vector<uint32_t> fast(4 * nblocks), slow(4 * nblocks);
    accelkit::philox::blocks(key, first_block, nblocks, fast.data());
    accelkit::philox::blocks_scalar(key, first_block, nblocks, slow.data());
    return fast == slow;
  });
  m.def("register_device", [](const std::string& origin) {
    static auto* runtime = new TestRuntime();
    accelkit::register_device(*runtime, origin);
  });
  // Allocate 3 blocks on device 1, free one (cached), reuse it, ask for more than the capacity
  // (the cache is released, then the error), free everything: the statistics after each step,
  // whether the freed block came back, and the out-of-memory message.
  m.def("allocator_case", [] {
    py::list steps;
    std::vector<c10::DataPtr> live;
    for (size_t n : {1000, 2000, 3000}) live.push_back(accelkit::allocate_on(1, n));
    steps.append(stats_of(1));
    const void* freed = live[1].get();
    live.erase(live.begin() + 1);
    steps.append(stats_of(1));
    live.push_back(accelkit::allocate_on(1, 1900));  // fits the cached 2048-byte block
    const bool reused = live.back().get() == freed;
    live.pop_back();
    std::string oom;
    try {
      accelkit::allocate_on(1, 2 << 20);
    } catch (const c10::OutOfMemoryError& e) {
      oom = e.what_without_backtrace();
    }
    steps.append(stats_of(1));
    live.clear();
    accelkit::DeviceAllocator::get().resetPeakStats(1);
    steps.append(stats_of(1));
    return py::make_tuple(steps, oom, reused);
  });
}
