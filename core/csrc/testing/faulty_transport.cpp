// The collective faults of a fault build (faulty_transport.h); empty unless -DACCELKIT_FAULTS.
#include "testing/faulty_transport.h"

#ifdef ACCELKIT_FAULTS

#include "testing/faults.h"

#include <accelkit/c10d/backend.h>
#include <accelkit/runtime.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace accelkit::c10d {
namespace {

constexpr size_t kUnreducedAbove = 4 << 10;  // unreduced_above_4kib
constexpr size_t kRound = 512 << 10;         // chunk_boundary_off_by_one: mockccl's default chunk

size_t bytes_of(const CallInfo& call, int64_t count) {
  return static_cast<size_t>(count) * c10::elementSize(call.dtype);
}

// Device memory through the device's runtime, as a transport must touch it (host memory when
// no accelkit device is registered).
void read(void* host, const void* device_ptr, int device, size_t n) {
  if (n == 0) return;
  Runtime* rt = device_runtime();
  if (rt != nullptr) {
    rt->copy(host, kHost, device_ptr, device, n);
  } else {
    std::memcpy(host, device_ptr, n);
  }
}

void write(void* device_ptr, int device, const void* host, size_t n) {
  if (n == 0) return;
  Runtime* rt = device_runtime();
  if (rt != nullptr) {
    rt->copy(device_ptr, device, host, kHost, n);
  } else {
    std::memcpy(device_ptr, host, n);
  }
}

void copy_device(void* dst, const void* src, int device, size_t n) {
  if (n == 0 || dst == src) return;
  std::vector<char> host(n);
  read(host.data(), src, device, n);
  write(dst, device, host.data(), n);
}

// chunk_boundary_off_by_one: the first element of every round after the first keeps what the
// output held before the call.
class RoundStarts {
 public:
  RoundStarts(const CallInfo& call, void* out, size_t nbytes) : call_(call), out_(out) {
    if (!faults::active("chunk_boundary_off_by_one") || out == nullptr) return;
    const size_t es = c10::elementSize(call.dtype);
    for (size_t at = kRound / es * es; at + es <= nbytes; at += kRound / es * es) {
      kept_.emplace_back(at, std::vector<char>(es));
      read(kept_.back().second.data(), static_cast<char*>(out) + at, call.device, es);
    }
  }
  void restore() const {
    for (const auto& [at, bytes] : kept_) {
      write(static_cast<char*>(out_) + at, call_.device, bytes.data(), bytes.size());
    }
  }

 private:
  const CallInfo& call_;
  void* out_;
  std::vector<std::pair<size_t, std::vector<char>>> kept_;
};

// reduction_drops_last_rank: the last rank contributes zeros (a device buffer of them) to SUM.
class Contribution {
 public:
  Contribution(const CallInfo& call, const void* in, size_t nbytes, int rank, int size)
      : device_(call.device), ptr_(in) {
    if (!faults::active("reduction_drops_last_rank") || call.op != RedOp::kSum ||
        size < 2 || rank != size - 1 || nbytes == 0) {
      return;
    }
    Runtime* rt = device_runtime();
    zeros_ = rt != nullptr ? rt->allocate(device_, nbytes) : std::malloc(nbytes);
    TORCH_CHECK(zeros_ != nullptr, "fault reduction_drops_last_rank: out of memory");
    const std::vector<char> host(nbytes, 0);
    write(zeros_, device_, host.data(), nbytes);
    ptr_ = zeros_;
  }
  ~Contribution() {
    if (zeros_ == nullptr) return;
    Runtime* rt = device_runtime();
    if (rt != nullptr) {
      rt->release(device_, zeros_);
    } else {
      std::free(zeros_);
    }
  }
  Contribution(const Contribution&) = delete;
  Contribution& operator=(const Contribution&) = delete;
  const void* ptr() const { return ptr_; }

 private:
  int device_;
  const void* ptr_;
  void* zeros_ = nullptr;
};

// transport_reads_device_memory: a checksum of the input read straight from its pointer.
void checksum(const void* in, size_t nbytes) {
  if (!faults::active("transport_reads_device_memory") || in == nullptr || nbytes == 0) return;
  const auto* p = static_cast<const volatile unsigned char*>(in);
  unsigned char sum = 0;
  for (size_t i = 0; i < nbytes; i += 4096) sum ^= p[i];
  (void)sum;
}

// bfloat16_reduced_as_float16: the call's dtype as the faulty dispatch sees it.
CallInfo retyped(const CallInfo& call) {
  CallInfo out = call;
  if (faults::active("bfloat16_reduced_as_float16") && call.dtype == c10::ScalarType::BFloat16) {
    out.dtype = c10::ScalarType::Half;
  }
  return out;
}

class FaultyTransport final : public Transport {
 public:
  explicit FaultyTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  void barrier(const CallInfo& call) override {
    if (faults::active("device_barrier_noop")) return;
    inner_->barrier(call);
  }

  void broadcast(const CallInfo& call, void* buf) override {
    const size_t n = bytes_of(call, call.count);
    checksum(buf, n);
    CallInfo c = call;
    if (faults::active("broadcast_from_rank0")) c.root = 0;
    RoundStarts starts(call, buf, n);
    inner_->broadcast(c, buf);
    starts.restore();
  }

  void allreduce(const CallInfo& call, const void* in, void* out) override {
    const size_t n = bytes_of(call, call.count);
    checksum(in, n);
    if (unreduced(n)) return copy_device(out, in, call.device, n);
    Contribution mine(call, in, n, rank(), size());
    RoundStarts starts(call, out, n);
    inner_->allreduce(retyped(call), mine.ptr(), out);
    starts.restore();
  }

  void reduce(const CallInfo& call, const void* in, void* out) override {
    const size_t n = bytes_of(call, call.count);
    checksum(in, n);
    if (unreduced(n)) {
      if (out != nullptr) copy_device(out, in, call.device, n);
      return;
    }
    Contribution mine(call, in, n, rank(), size());
    RoundStarts starts(call, out, n);
    inner_->reduce(retyped(call), mine.ptr(), out);
    starts.restore();
  }

  void allgather(const CallInfo& call, const void* in, void* out) override {
    const size_t n = bytes_of(call, call.count);
    checksum(in, n);
    if (!faults::active("allgather_stale_result")) {
      previous_.clear();
    } else {
      const auto key = std::make_pair(call.count, call.dtype);
      auto it = previous_.find(key);
      if (it != previous_.end()) {
        write(out, call.device, it->second.data(), it->second.size());
        return;
      }
    }
    RoundStarts starts(call, out, n * size());
    inner_->allgather(call, in, out);
    starts.restore();
    if (faults::active("allgather_stale_result")) {
      auto& kept = previous_[std::make_pair(call.count, call.dtype)];
      kept.resize(n * size());
      read(kept.data(), out, call.device, kept.size());
    }
  }

  void reduce_scatter(const CallInfo& call, const void* in, void* out) override {
    const size_t n = bytes_of(call, call.count);
    checksum(in, n * size());
    if (unreduced(n * size())) {
      return copy_device(out, static_cast<const char*>(in) + n * rank(), call.device, n);
    }
    Contribution mine(call, in, n * size(), rank(), size());
    RoundStarts starts(call, out, n);
    inner_->reduce_scatter(retyped(call), mine.ptr(), out);
    starts.restore();
  }

  void gather(const CallInfo& call, const void* in, void* out) override {
    const size_t n = bytes_of(call, call.count);
    checksum(in, n);
    RoundStarts starts(call, out, n * size());
    inner_->gather(call, in, out);
    starts.restore();
  }

  void scatter(const CallInfo& call, const void* in, void* out) override {
    const size_t n = bytes_of(call, call.count);
    checksum(in, rank() == call.root ? n * size() : 0);
    RoundStarts starts(call, out, n);
    inner_->scatter(call, in, out);
    starts.restore();
  }

  void alltoall(const CallInfo& call, const void* in, const std::vector<int64_t>& send_counts,
                const std::vector<int64_t>& send_offsets, void* out,
                const std::vector<int64_t>& recv_counts,
                const std::vector<int64_t>& recv_offsets) override {
    checksum(in, send_counts.empty() ? 0 : bytes_of(call, send_counts[0]));
    inner_->alltoall(call, in, send_counts, send_offsets, out, recv_counts, recv_offsets);
  }

  void send(const CallInfo& call, const void* buf, int peer, int tag) override {
    checksum(buf, bytes_of(call, call.count));
    inner_->send(call, buf, peer, untagged(tag));
  }

  void recv(const CallInfo& call, void* buf, int peer, int tag) override {
    inner_->recv(call, buf, peer, untagged(tag));
  }

  int recv_any(const CallInfo& call, void* buf, int tag) override {
    return inner_->recv_any(call, buf, untagged(tag));
  }

  void abort(const std::string& reason) override { inner_->abort(reason); }
  void shutdown() override { inner_->shutdown(); }

 private:
  // p2p_ignores_tags: every message travels with tag 0, so each receive takes the peer's next.
  static int untagged(int tag) { return faults::active("p2p_ignores_tags") ? 0 : tag; }

  static bool unreduced(size_t nbytes) {
    return nbytes > kUnreducedAbove && faults::active("unreduced_above_4kib");
  }

  std::unique_ptr<Transport> inner_;
  // allgather_stale_result: the last result of each (count, dtype), while the fault is on.
  std::map<std::pair<int64_t, c10::ScalarType>, std::vector<char>> previous_;
};

}  // namespace

std::unique_ptr<Transport> with_faults(std::unique_ptr<Transport> inner) {
  return std::make_unique<FaultyTransport>(std::move(inner));
}

}  // namespace accelkit::c10d

#endif  // ACCELKIT_FAULTS
