// mockccl: host copies of a discrete device's buffers for the transport (mockccl_shm.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <accelkit/runtime.h>

namespace mockccl {

// The elements an all-to-all buffer spans: the end of its furthest per-peer part.
inline int64_t extent(const std::vector<int64_t>& counts, const std::vector<int64_t>& offsets) {
  int64_t end = 0;
  for (size_t p = 0; p < counts.size(); ++p) end = std::max(end, offsets[p] + counts[p]);
  return end;
}

// Device buffers of a discrete device are not host memory: a collective works on host copies,
// read through the runtime before it and written back after it (a real device's transport
// stages through its driver, or has the device read the segment itself). On a host-accessible
// device the pointers are used as they are.
class Staging {
 public:
  Staging(accelkit::Runtime* runtime, int device)
      : runtime_(runtime != nullptr && !runtime->host_accessible() ? runtime : nullptr),
        device_(device) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // A host address holding the `bytes` of device buffer `p` (read now).
  const void* in(const void* p, size_t bytes) {
    if (runtime_ == nullptr || p == nullptr) return p;
    char* host = buffer(p, bytes);
    runtime_->copy(host, accelkit::kHost, p, device_, bytes);
    return host;
  }
  // A host address the collective writes `bytes` of device buffer `p` to (written back by
  // finish()); the same host copy as in() for the same buffer of the same size (in-place
  // all_reduce, broadcast). An input that is a slice of the output (the in-place all_gather
  // FSDP2 issues: rank r's input is the output's r-th slice, so rank 0's starts where the
  // output does) gets a copy of its own.
  void* out(void* p, size_t bytes) {
    if (runtime_ == nullptr || p == nullptr) return p;
    char* host = buffer(p, bytes);
    writes_.push_back({p, host, bytes});
    return host;
  }
  void finish() {
    for (const auto& w : writes_) runtime_->copy(w.device, device_, w.host, accelkit::kHost, w.bytes);
    writes_.clear();
  }

 private:
  struct Write {
    void* device;
    const char* host;
    size_t bytes;
  };
  char* buffer(const void* p, size_t bytes) {
    for (auto& b : buffers_) {
      if (b.device == p && b.bytes == bytes) return b.host.get();
    }
    buffers_.push_back({p, bytes, std::unique_ptr<char[]>(new char[bytes > 0 ? bytes : 1])});
    return buffers_.back().host.get();
  }
  struct Buffer {
    const void* device;
    size_t bytes;
    std::unique_ptr<char[]> host;
  };

  accelkit::Runtime* runtime_;
  int device_;
  std::vector<Buffer> buffers_;
  std::vector<Write> writes_;
};

}  // namespace mockccl
