// The mock's runtime: "device" memory is host memory from c10::alloc_cpu (the CPU
// allocator's own aligned allocation, so mock tensors are as fast as CPU tensors); buffers of
// 2 MiB and more are 2 MiB-aligned and asked to be backed by 2 MiB pages, as GPU memory is.
// Work is synchronous, copies are memcpy. Each function says what a real vendor's driver call is.
// Configuration: ACCELKIT_MOCK_DEVICES (device count, default 8), ACCELKIT_MOCK_MEMORY
// (capacity per device, default 8GiB; suffixes B, KB/MB/GB/TB (powers of 1000),
// K/M/G/T and KiB/MiB/GiB/TiB (powers of 1024)), ACCELKIT_MOCK_HOST_ACCESSIBLE=0 (pretend the
// memory is not host-accessible, which exercises the copying paths a discrete device takes).
#pragma once

#include <accelkit/runtime.h>

#include <c10/core/impl/alloc_cpu.h>
#include <sys/mman.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace accelkit_mock {

// Parse "8GiB", "64MiB", "512M", "1000000" into bytes; returns false on anything else.
inline bool parse_bytes(const std::string& text, size_t& out) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t digits = i;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == digits) return false;
  char* end = nullptr;
  const std::string number = text.substr(digits, i - digits);
  const double value = std::strtod(number.c_str(), &end);
  if (end == nullptr || *end != '\0' || value < 0) return false;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += static_cast<char>(std::toupper(text[i]));
  }
  static const std::map<std::string, double> units = {
      {"", 1.0}, {"B", 1.0},
      {"K", 1024.0}, {"KIB", 1024.0}, {"KB", 1e3},
      {"M", 1048576.0}, {"MIB", 1048576.0}, {"MB", 1e6},
      {"G", 1073741824.0}, {"GIB", 1073741824.0}, {"GB", 1e9},
      {"T", 1099511627776.0}, {"TIB", 1099511627776.0}, {"TB", 1e12}};
  const auto it = units.find(unit);
  if (it == units.end()) return false;
  out = static_cast<size_t>(value * it->second);
  return true;
}

class MockRuntime final : public accelkit::Runtime {
 public:
  MockRuntime() {
    if (const char* env = std::getenv("ACCELKIT_MOCK_DEVICES")) {
      char* end = nullptr;
      const long n = std::strtol(env, &end, 10);
      if (end == env || *end != '\0' || n < 1 || n > 64) {
        error_ = std::string("ACCELKIT_MOCK_DEVICES=") + env +
                 " is not a device count: use an integer from 1 to 64, e.g. ACCELKIT_MOCK_DEVICES=8";
      } else {
        devices_ = static_cast<int>(n);
      }
    }
    if (const char* env = std::getenv("ACCELKIT_MOCK_MEMORY")) {
      if (!parse_bytes(env, capacity_) || capacity_ == 0) {
        error_ = std::string("ACCELKIT_MOCK_MEMORY=") + env +
                 " is not a memory size: use bytes with an optional unit, e.g. 8GiB, 512MiB, "
                 "64MB or 1000000";
      }
    }
    if (const char* env = std::getenv("ACCELKIT_MOCK_HOST_ACCESSIBLE")) {
      host_accessible_ = std::strcmp(env, "0") != 0;
    }
  }

  // The configuration error, if any (the Python package raises it; device_count() is 0).
  const std::string& config_error() const { return error_; }

  // CUDA: cudaGetDeviceCount.
  int device_count() noexcept override { return error_.empty() ? devices_ : 0; }

  // CUDA: cudaSetDevice. Host memory has no per-thread device context: nothing to do.
  void set_device(int /*device*/) override {}

  // CUDA: cudaMemGetInfo (total).
  size_t capacity(int /*device*/) override { return capacity_; }

  // CUDA: cudaMalloc. Host memory from the CPU allocator's aligned allocation; large buffers
  // in 2 MiB pages where the kernel allows (transparent huge pages in "madvise" or "always"
  // mode): fewer page faults and TLB misses on large copies, as a device's large pages give.
  void* allocate(int /*device*/, size_t nbytes) override {
    if (nbytes < kLargePage) {
      try {
        return c10::alloc_cpu(nbytes);
      } catch (...) {
        return nullptr;
      }
    }
    void* ptr = nullptr;
    if (posix_memalign(&ptr, kLargePage, nbytes) != 0) return nullptr;
    madvise(ptr, nbytes, MADV_HUGEPAGE);  // advice only: without THP it stays 4 KiB pages
    return ptr;
  }

  // CUDA: cudaFree. (c10::free_cpu is free() on Linux, for both kinds of allocation.)
  void release(int /*device*/, void* ptr) noexcept override { std::free(ptr); }

  // CUDA: cudaHostAlloc / cudaFreeHost.
  void* allocate_pinned(size_t nbytes) override {
    try {
      return c10::alloc_cpu(nbytes);
    } catch (...) {
      return nullptr;
    }
  }
  void release_pinned(void* ptr) noexcept override { c10::free_cpu(ptr); }

  // CUDA: cudaMemcpy / cudaMemcpyPeer (all host memory here).
  void copy(void* dst, int /*dst_device*/, const void* src, int /*src_device*/,
            size_t nbytes) override {
    std::memcpy(dst, src, nbytes);
  }

  // CUDA: cudaDeviceSynchronize. Every call above completes before returning.
  void synchronize(int /*device*/) override {}

  bool host_accessible() const noexcept override { return host_accessible_; }

  std::string capacity_hint() const override {
    return "Set ACCELKIT_MOCK_MEMORY (e.g. ACCELKIT_MOCK_MEMORY=16GiB) to change the capacity "
           "of each mock device.";
  }
  std::string device_count_hint() const override {
    return "Set ACCELKIT_MOCK_DEVICES to change the number of mock devices.";
  }

 private:
  static constexpr size_t kLargePage = size_t{2} << 20;
  int devices_ = 8;
  size_t capacity_ = size_t{8} << 30;
  bool host_accessible_ = true;
  std::string error_;
};

}  // namespace accelkit_mock
