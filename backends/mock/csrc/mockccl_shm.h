// mockccl's transport: the ranks of one host exchange data through one shared-memory segment per
// process group. This is the file a vendor replaces with calls into their
// collective library; <accelkit/c10d/backend.h> stays.
//
// Segment layout (offsets computed from the group size and the chunk size):
//   Control | RankState[size] | Header[2][size] | send/recv counts[2][2][size][size] |
//   Mailbox[size][size] | mailbox data[size][size][p2p_chunk] | data[2][size + 1][chunk]
// Collectives move data in rounds of at most `chunk` bytes per rank: each rank writes its part
// into its own slot, all ranks meet at a barrier, then each reads what it needs. Rounds
// alternate between two slot sets, so a rank may fill set k+2 only after every rank passed
// round k+1's barrier, that is after everybody finished reading set k. The per-call header
// (kind, dtype, count, op, root, seq) is written before the first barrier and checked by
// every rank after it: a mismatch raises on all ranks before any data is used.
// Barriers: each rank publishes an epoch; waiters spin briefly, yield the core, then sleep on
// a futex in the segment (a shared "bell" every arrival rings), waking at least every 50 ms to
// check the deadline, a peer process that died (/proc/<pid>/stat), and a group aborted by
// another rank.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <accelkit/c10d/transport.h>
#include <accelkit/runtime.h>

#include "mockccl_reduce.h"

namespace mockccl {

using accelkit::c10d::CallInfo;
using accelkit::c10d::Kind;
using accelkit::c10d::RedOp;

constexpr uint64_t kMagic = 0x4d43434c53484d31ULL;  // marks a segment of this library

struct alignas(64) Control {
  uint64_t magic;
  uint64_t nonce;
  int32_t size;
  int32_t reserved;
  uint64_t chunk;
  uint64_t p2p_chunk;
  alignas(64) std::atomic<uint32_t> bell;
  std::atomic<uint32_t> sleepers;
  alignas(64) std::atomic<int32_t> aborted_by;  // 0, or 1 + the rank that aborted the group
  char reason[1024];
};

struct alignas(64) RankState {
  std::atomic<uint64_t> epoch;
  std::atomic<int32_t> pid;
  uint64_t start_time;  // /proc/<pid>/stat field 22: tells a recycled pid apart
};

struct alignas(64) Header {
  uint64_t seq;
  int64_t count;
  int32_t kind;
  int32_t dtype;
  int32_t op;
  int32_t root;
};

struct alignas(64) Mailbox {
  std::atomic<uint64_t> posted;  // chunks the sender wrote
  std::atomic<uint64_t> taken;   // chunks the receiver consumed
  int64_t total_bytes;           // of the message the current chunk belongs to
  int64_t bytes;                 // in the current chunk
  int32_t tag;
  int32_t first;  // 1 when the current chunk starts a message
};

inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

struct Layout {
  size_t ranks, headers, counts, mailboxes, mailbox_data, data, total;
  Layout(int size, size_t chunk, size_t p2p_chunk) {
    const size_t s = static_cast<size_t>(size);
    ranks = align_up(sizeof(Control), 64);
    headers = ranks + s * sizeof(RankState);
    counts = headers + 2 * s * sizeof(Header);
    mailboxes = align_up(counts + 2 * 2 * s * s * sizeof(int64_t), 64);
    mailbox_data = align_up(mailboxes + s * s * sizeof(Mailbox), 4096);
    data = align_up(mailbox_data + s * s * p2p_chunk, 4096);
    total = data + 2 * (s + 1) * chunk;
  }
};

// Start time of `pid` (field 22 of /proc/<pid>/stat), 0 if the process is gone or a zombie.
inline uint64_t process_start_time(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!f || !std::getline(f, stat)) return 0;
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  rest >> field;  // field 3: state
  if (field == "Z" || field == "X" || field == "x") return 0;
  for (int i = 4; i <= 22 && rest >> field; ++i) {
  }
  return std::stoull(field);
}

inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t ns) {
  struct timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
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

class ShmTransport : public accelkit::c10d::Transport {
 public:
  // `base` maps the group's segment of Layout(size, chunk, p2p_chunk).total bytes (already
  // unlinked from /dev/shm); the transport unmaps it when destroyed. `runtime` is the device's
  // (for discrete memory; nullptr: buffers are host memory).
  ShmTransport(int rank, int size, char* base, size_t chunk, size_t p2p_chunk,
               accelkit::Runtime* runtime)
      : rank_(rank),
        size_(size),
        base_(base),
        chunk_(chunk),
        p2p_chunk_(p2p_chunk),
        layout_(size, chunk, p2p_chunk),
        ctl_(reinterpret_cast<Control*>(base)),
        runtime_(runtime) {}

  ~ShmTransport() override { munmap(base_, layout_.total); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void shutdown() override {}

  // Local calls raise from now on; peers' calls with this group raise too (aborted_by), and
  // every sleeper is woken to notice.
  void abort(const std::string& reason) override {
    aborted_ = true;
    int32_t expected = 0;
    if (ctl_->aborted_by.compare_exchange_strong(expected, rank_ + 1)) {
      std::strncpy(ctl_->reason, reason.c_str(), sizeof(ctl_->reason) - 1);
    }
    set_broken("mockccl: " + reason);
    ring();
    futex_wake_all(&ctl_->bell);
  }

  void barrier(const CallInfo& call) override {
    begin(call);
    sync(call);
    check_headers(call);
  }

  void broadcast(const CallInfo& call, void* device_buf) override {
    Staging stage(runtime_, call.device);
    const size_t bytes = call.count * c10::elementSize(call.dtype);
    stage.in(device_buf, bytes);
    void* buf = stage.out(device_buf, bytes);
    broadcast_host(call, buf);
    stage.finish();
  }

  void allreduce(const CallInfo& call, const void* in, void* out) override {
    Staging stage(runtime_, call.device);
    const size_t bytes = call.count * c10::elementSize(call.dtype);
    const void* hin = stage.in(in, bytes);
    reduce_rounds(call, hin, stage.out(out, bytes), /*writes=*/true);
    stage.finish();
  }

  void reduce(const CallInfo& call, const void* in, void* out) override {
    Staging stage(runtime_, call.device);
    const size_t bytes = call.count * c10::elementSize(call.dtype);
    const void* hin = stage.in(in, bytes);
    const bool root = rank_ == call.root;
    reduce_rounds(call, hin, root ? stage.out(out, bytes) : out, root);
    stage.finish();
  }

  void allgather(const CallInfo& call, const void* in, void* out) override {
    Staging stage(runtime_, call.device);
    const size_t bytes = call.count * c10::elementSize(call.dtype);
    const void* hin = stage.in(in, bytes);
    gather_rounds(call, hin, stage.out(out, bytes * size_));
    stage.finish();
  }

  void gather(const CallInfo& call, const void* in, void* out) override {
    Staging stage(runtime_, call.device);
    const size_t bytes = call.count * c10::elementSize(call.dtype);
    const void* hin = stage.in(in, bytes);
    gather_rounds(call, hin, rank_ == call.root ? stage.out(out, bytes * size_) : nullptr);
    stage.finish();
  }

  void reduce_scatter(const CallInfo& call, const void* in, void* out) override {
    Staging stage(runtime_, call.device);
    const size_t bytes = call.count * c10::elementSize(call.dtype);
    const void* hin = stage.in(in, bytes * size_);
    reduce_scatter_host(call, hin, stage.out(out, bytes));
    stage.finish();
  }

  void scatter(const CallInfo& call, const void* in, void* out) override {
    Staging stage(runtime_, call.device);
    const size_t bytes = call.count * c10::elementSize(call.dtype);
    const void* hin = rank_ == call.root ? stage.in(in, bytes * size_) : in;
    scatter_host(call, hin, stage.out(out, bytes));
    stage.finish();
  }

  void alltoall(const CallInfo& call, const void* in, const std::vector<int64_t>& send_counts,
                const std::vector<int64_t>& send_offsets, void* out,
                const std::vector<int64_t>& recv_counts,
                const std::vector<int64_t>& recv_offsets) override {
    Staging stage(runtime_, call.device);
    const size_t es = c10::elementSize(call.dtype);
    int64_t sent = 0, received = 0;
    for (int p = 0; p < size_; ++p) {
      sent = std::max(sent, send_offsets[p] + send_counts[p]);
      received = std::max(received, recv_offsets[p] + recv_counts[p]);
    }
    const void* hin = stage.in(in, sent * es);
    alltoall_host(call, hin, send_counts, send_offsets, stage.out(out, received * es),
                  recv_counts, recv_offsets);
    stage.finish();
  }

  void send(const CallInfo& call, const void* buf, int peer, int tag) override {
    Staging stage(runtime_, call.device);
    send_host(call, stage.in(buf, call.count * c10::elementSize(call.dtype)), peer, tag);
  }

  void recv(const CallInfo& call, void* buf, int peer, int tag) override {
    Staging stage(runtime_, call.device);
    recv_host(call, stage.out(buf, call.count * c10::elementSize(call.dtype)), peer, tag);
    stage.finish();
  }

  int recv_any(const CallInfo& call, void* buf, int tag) override {
    Staging stage(runtime_, call.device);
    const int from = recv_any_host(call, stage.out(buf, call.count * c10::elementSize(call.dtype)),
                                   tag);
    stage.finish();
    return from;
  }

 private:
  void broadcast_host(const CallInfo& call, void* buf) {
    begin(call);
    const size_t es = c10::elementSize(call.dtype);
    char* p = static_cast<char*>(buf);
    rounds(call, static_cast<int64_t>(chunk_ / es), [&](int64_t off, int64_t n) {
      if (rank_ == call.root) std::memcpy(slot(call.root), p + off * es, n * es);
    }, [&](int64_t off, int64_t n) {
      if (rank_ != call.root) std::memcpy(p + off * es, slot(call.root), n * es);
    });
  }

  void reduce_scatter_host(const CallInfo& call, const void* in, void* out) {
    begin(call);
    const size_t es = c10::elementSize(call.dtype);
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    std::vector<const void*> parts(size_);
    rounds(call, static_cast<int64_t>(chunk_ / (es * size_)), [&](int64_t off, int64_t n) {
      for (int d = 0; d < size_; ++d) {  // peers read their part of my slot; I read mine from `in`
        if (d == rank_) continue;
        std::memcpy(slot(rank_) + d * n * es, src + (d * call.count + off) * es, n * es);
      }
    }, [&](int64_t off, int64_t n) {
      for (int r = 0; r < size_; ++r) parts[r] = slot(r) + rank_ * n * es;
      parts[rank_] = src + (rank_ * call.count + off) * es;
      mockccl::reduce(call.dtype, call.op, dst + off * es, parts.data(), size_, n);
    });
  }

  void scatter_host(const CallInfo& call, const void* in, void* out) {
    begin(call);
    const size_t es = c10::elementSize(call.dtype);
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    rounds(call, static_cast<int64_t>(chunk_ / (es * size_)), [&](int64_t off, int64_t n) {
      if (rank_ != call.root) return;
      for (int d = 0; d < size_; ++d) {
        std::memcpy(slot(rank_) + d * n * es, src + (d * call.count + off) * es, n * es);
      }
    }, [&](int64_t off, int64_t n) {
      std::memcpy(dst + off * es, slot(call.root) + rank_ * n * es, n * es);
    });
  }

  void alltoall_host(const CallInfo& call, const void* in,
                     const std::vector<int64_t>& send_counts,
                     const std::vector<int64_t>& send_offsets, void* out,
                     const std::vector<int64_t>& recv_counts,
                     const std::vector<int64_t>& recv_offsets) {
    begin(call);
    const int par = static_cast<int>(calls_ & 1);
    for (int p = 0; p < size_; ++p) {
      counts(par, 0, rank_)[p] = send_counts[p];
      counts(par, 1, rank_)[p] = recv_counts[p];
    }
    const size_t es = c10::elementSize(call.dtype);
    const int64_t per = static_cast<int64_t>(chunk_ / (es * size_));
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    int64_t rounds = 1;
    for (int64_t k = 0; k < rounds; ++k) {
      const int64_t lo = k * per;
      for (int d = 0; d < size_; ++d) {
        const int64_t n = std::clamp<int64_t>(send_counts[d] - lo, 0, per);
        std::memcpy(slot(rank_) + d * per * es, src + (send_offsets[d] + lo) * es, n * es);
      }
      sync(call);
      if (k == 0) {
        check_headers(call);
        rounds = check_alltoall_counts(call, par, per);
      }
      for (int r = 0; r < size_; ++r) {
        const int64_t n = std::clamp<int64_t>(recv_counts[r] - lo, 0, per);
        std::memcpy(dst + (recv_offsets[r] + lo) * es, slot(r) + rank_ * per * es, n * es);
      }
      flip();
    }
  }

  void send_host(const CallInfo& call, const void* buf, int peer, int tag) {
    check_usable(call);
    Deadline deadline(call.timeout);
    Mailbox& box = mailbox(rank_, peer);
    char* data = mailbox_data(rank_, peer);
    const int64_t total = call.count * static_cast<int64_t>(c10::elementSize(call.dtype));
    const char* src = static_cast<const char*>(buf);
    int64_t off = 0;
    do {
      const int64_t n = std::min<int64_t>(p2p_chunk_, total - off);
      wait_for(call, deadline, [&] { return box.taken.load(std::memory_order_acquire) ==
                                             box.posted.load(std::memory_order_relaxed); },
               [&] { return std::vector<int>{peer}; }, "receive (recv) what it sends");
      std::memcpy(data, src + off, n);
      box.total_bytes = total;
      box.bytes = n;
      box.tag = tag;
      box.first = off == 0;
      box.posted.fetch_add(1, std::memory_order_release);
      ring();
      off += n;
    } while (off < total);
  }

  // A receive holds its peer's claim for the whole message, so a recv(peer) and a
  // recv_any on other threads never take the same message (or parts of one).
  void recv_host(const CallInfo& call, void* buf, int peer, int tag) {
    check_usable(call);
    Deadline deadline(call.timeout);
    std::lock_guard<std::mutex> claim(recv_claims_[peer]);
    receive_from(call, deadline, buf, peer, tag);
  }

  int recv_any_host(const CallInfo& call, void* buf, int tag) {
    check_usable(call);
    Deadline deadline(call.timeout);
    int from = -1;
    std::unique_lock<std::mutex> claim;
    wait_for(call, deadline, [&] {
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        std::unique_lock<std::mutex> lock(recv_claims_[p], std::try_to_lock);
        if (!lock.owns_lock()) continue;  // a recv(p) is taking p's messages
        Mailbox& box = mailbox(p, rank_);
        if (box.posted.load(std::memory_order_acquire) > box.taken.load(std::memory_order_relaxed) &&
            box.first && box.tag == tag) {
          from = p;
          claim = std::move(lock);
          return true;
        }
      }
      return false;
    }, [&] { return peers(); }, "send");
    receive_from(call, deadline, buf, from, tag);
    return from;
  }

  struct Deadline {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::chrono::milliseconds timeout;
    explicit Deadline(std::chrono::milliseconds t) : timeout(t) {}
    bool passed() const { return std::chrono::steady_clock::now() - start > timeout; }
  };

  char* slot(int r) const {
    return base_ + layout_.data + (static_cast<size_t>(set_) * (size_ + 1) + r) * chunk_;
  }
  char* result() const { return slot(size_); }
  void flip() { set_ ^= 1; }

  Header& header(int par, int r) const {
    return reinterpret_cast<Header*>(base_ + layout_.headers)[par * size_ + r];
  }
  RankState& state(int r) const {
    return reinterpret_cast<RankState*>(base_ + layout_.ranks)[r];
  }
  // which: 0 = what `r` sends to each peer, 1 = what `r` expects from each peer.
  int64_t* counts(int par, int which, int r) const {
    return reinterpret_cast<int64_t*>(base_ + layout_.counts) +
           ((static_cast<size_t>(par) * 2 + which) * size_ + r) * size_;
  }
  Mailbox& mailbox(int from, int to) const {
    return reinterpret_cast<Mailbox*>(base_ + layout_.mailboxes)[from * size_ + to];
  }
  char* mailbox_data(int from, int to) const {
    return base_ + layout_.mailbox_data + static_cast<size_t>(from * size_ + to) * p2p_chunk_;
  }
  std::vector<int> peers() const {
    std::vector<int> all;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) all.push_back(r);
    return all;
  }

  void begin(const CallInfo& call) {
    check_usable(call);
    deadline_ = std::make_unique<Deadline>(call.timeout);
    ++calls_;
    Header& h = header(static_cast<int>(calls_ & 1), rank_);
    h.seq = call.seq;
    h.count = call.count;
    h.kind = static_cast<int32_t>(call.kind);
    h.dtype = static_cast<int32_t>(call.dtype);
    h.op = static_cast<int32_t>(call.op);
    h.root = call.root;
  }

  // Runs a collective of call.count elements (per rank) in rounds of at most `per`: fill(off,
  // n) writes this rank's part of the round into the current slot set, every rank meets at
  // the barrier (the first round's also checks the headers), then drain(off, n) reads what
  // this rank needs; rounds alternate slot sets. A zero-element call still runs one round, so
  // every rank checks the headers.
  template <typename Fill, typename Drain>
  void rounds(const CallInfo& call, int64_t per, Fill fill, Drain drain) {
    int64_t off = 0;
    bool first = true;
    do {
      const int64_t n = std::min(per, call.count - off);
      fill(off, n);
      sync(call);
      if (first) check_headers(call), first = false;
      drain(off, n);
      off += n;
      flip();
    } while (off < call.count);
  }

  // allreduce / reduce, pipelined with one barrier per round. Small rounds: every rank reduces
  // the whole round itself, straight into `out`. Large rounds: rank r reduces the r-th part
  // (its own share read straight from `in`, only the peers' shares staged: 5-20 % faster
  // from 8 MiB up than staging all of it) into the set's result slot; the result is copied
  // out after the NEXT round's barrier (or a final one), which every rank passes only once
  // all parts are reduced.
  void reduce_rounds(const CallInfo& call, const void* in, void* out, bool writes) {
    begin(call);
    const size_t es = c10::elementSize(call.dtype);
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    std::vector<const void*> parts(size_);
    int64_t pending_off = -1, pending_n = 0;
    const char* pending = nullptr;
    auto copy_pending = [&] {
      if (pending_off >= 0 && writes) std::memcpy(dst + pending_off * es, pending, pending_n * es);
      pending_off = -1;
    };
    auto small = [&](int64_t n) { return static_cast<size_t>(n) * es <= kDirectReduceBytes; };
    auto part_of = [&](int64_t n, int r) {  // [lo, hi) of rank r's part of a large round
      const int64_t part = (n + size_ - 1) / size_;
      const int64_t lo = std::min(n, r * part);
      return std::make_pair(lo, std::min(n, lo + part));
    };
    rounds(call, static_cast<int64_t>(chunk_ / es), [&](int64_t off, int64_t n) {
      if (small(n)) {
        std::memcpy(slot(rank_), src + off * es, n * es);
        return;
      }
      // Large rounds: peers read only their own part of this slot; mine is read from `in`.
      const auto [lo, hi] = part_of(n, rank_);
      std::memcpy(slot(rank_), src + off * es, lo * es);
      std::memcpy(slot(rank_) + hi * es, src + (off + hi) * es, (n - hi) * es);
    }, [&](int64_t off, int64_t n) {
      copy_pending();
      if (small(n)) {
        for (int r = 0; r < size_; ++r) parts[r] = slot(r);
        if (writes) mockccl::reduce(call.dtype, call.op, dst + off * es, parts.data(), size_, n);
      } else {
        const auto [lo, hi] = part_of(n, rank_);
        for (int r = 0; r < size_; ++r) parts[r] = slot(r) + lo * es;
        parts[rank_] = src + (off + lo) * es;
        mockccl::reduce(call.dtype, call.op, result() + lo * es, parts.data(), size_, hi - lo);
        pending_off = off;
        pending_n = n;
        pending = result();
      }
    });
    if (pending_off >= 0) {
      sync(call);
      copy_pending();
    }
  }

  void gather_rounds(const CallInfo& call, const void* in, void* out) {
    begin(call);
    const size_t es = c10::elementSize(call.dtype);
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    rounds(call, static_cast<int64_t>(chunk_ / es), [&](int64_t off, int64_t n) {
      std::memcpy(slot(rank_), src + off * es, n * es);
    }, [&](int64_t off, int64_t n) {
      if (dst == nullptr) return;
      for (int r = 0; r < size_; ++r) {
        std::memcpy(dst + (r * call.count + off) * es, slot(r), n * es);
      }
    });
  }

  // The barrier: publish my epoch, ring the bell, wait for every rank's epoch.
  void sync(const CallInfo& call) {
    const uint64_t target = ++epoch_;
    state(rank_).epoch.store(target, std::memory_order_release);
    ring();
    wait_for(call, *deadline_, [&] {
      for (int r = 0; r < size_; ++r)
        if (state(r).epoch.load(std::memory_order_acquire) < target) return false;
      return true;
    }, [&] {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r)
        if (state(r).epoch.load(std::memory_order_acquire) < target) missing.push_back(r);
      return missing;
    }, "join");
  }

  void ring() {
    ctl_->bell.fetch_add(1, std::memory_order_seq_cst);
    if (ctl_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&ctl_->bell);
  }

  // Wait until ready(): spin a little, yield the core a while, then sleep on the bell. Raises
  // on the deadline, on a dead peer among missing(), and when another rank aborted the group.
  template <typename Ready, typename Missing>
  void wait_for(const CallInfo& call, const Deadline& deadline, Ready ready, Missing missing,
                const char* action) {
    for (int i = 0; i < kSpins; ++i) {
      if (ready()) return;
      cpu_relax();
    }
    for (int i = 0; i < kYields; ++i) {
      if (ready()) return;
      if (aborted_) break;
      sched_yield();
    }
    auto next_liveness_check = std::chrono::steady_clock::now();
    for (;;) {
      ctl_->sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t bell = ctl_->bell.load(std::memory_order_seq_cst);
      if (ready()) {
        ctl_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
        return;
      }
      futex_wait(&ctl_->bell, bell, kSleepNs);
      ctl_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      if (ready()) return;
      check_aborted(call);
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_liveness_check) {
        next_liveness_check = now + std::chrono::milliseconds(200);
        check_alive(call, missing());
      }
      if (deadline.passed()) {
        std::vector<int> late = missing();
        std::ostringstream msg;
        msg << "mockccl: " << describe(call) << " timed out after " << call.timeout.count()
            << " ms on rank " << rank_ << ": rank" << (late.size() == 1 ? " " : "s ")
            << join(late) << " did not " << action
            << " (a rank skipped the call, or is stuck or slow); the group is unusable";
        fail(msg.str());
      }
    }
  }

  void check_alive(const CallInfo& call, const std::vector<int>& ranks) {
    for (int r : ranks) {
      const int pid = state(r).pid.load(std::memory_order_acquire);
      if (pid == 0) continue;  // not connected yet
      if (process_start_time(pid) != state(r).start_time) {
        fail("mockccl: " + describe(call) + " failed on rank " + std::to_string(rank_) + ": rank " +
             std::to_string(r) + " (pid " + std::to_string(pid) +
             ") exited; the group is unusable");
      }
    }
  }

  void check_aborted(const CallInfo& call) {
    const int by = ctl_->aborted_by.load(std::memory_order_acquire);
    if (by == 0 && !aborted_) return;
    if (by == 0 || by - 1 == rank_) {  // this rank aborted (or failed) the group
      std::string msg;
      {
        std::lock_guard<std::mutex> lock(broken_mutex_);
        msg = broken_;
      }
      C10_THROW_ERROR(DistBackendError, "mockccl: " + describe(call) + " on rank " +
                                            std::to_string(rank_) + " aborted: " + msg);
    }
    std::string why(ctl_->reason, strnlen(ctl_->reason, sizeof(ctl_->reason)));
    std::string msg = "mockccl: " + describe(call) + " aborted on rank " + std::to_string(rank_) +
                      ": rank " + std::to_string(by - 1) + " aborted the group: " + why;
    set_broken(msg);
    C10_THROW_ERROR(DistBackendError, msg);
  }

  // Marks the group unusable here and for every other rank, then raises.
  [[noreturn]] void fail(const std::string& msg) {
    int32_t expected = 0;
    if (ctl_->aborted_by.compare_exchange_strong(expected, rank_ + 1)) {
      std::strncpy(ctl_->reason, msg.c_str(), sizeof(ctl_->reason) - 1);
      ring();
    }
    set_broken(msg);
    C10_THROW_ERROR(DistBackendError, msg);
  }

  void set_broken(const std::string& msg) {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    if (broken_.empty()) broken_ = msg;
  }

  void check_usable(const CallInfo& call) {
    std::string broken;
    {
      std::lock_guard<std::mutex> lock(broken_mutex_);
      broken = broken_;
    }
    if (!broken.empty()) {
      C10_THROW_ERROR(DistBackendError, "mockccl: " + describe(call) +
                                            " on a group that failed earlier: " + broken);
    }
    check_aborted(call);
  }

  void check_headers(const CallInfo& call) {
    const int par = static_cast<int>(calls_ & 1);
    const Header& mine = header(par, rank_);
    bool same = true;
    for (int r = 0; r < size_ && same; ++r) {
      const Header& h = header(par, r);
      same = h.seq == mine.seq && h.count == mine.count && h.kind == mine.kind &&
             h.dtype == mine.dtype && h.op == mine.op && h.root == mine.root;
    }
    if (same) return;
    std::ostringstream msg;
    msg << "mockccl: collective mismatch at seq " << call.seq << " (detected on rank " << rank_
        << "); every rank must issue the same collectives in the same order:";
    for (int r = 0; r < size_; ++r) msg << "\n  rank " << r << ": " << describe(header(par, r));
    C10_THROW_ERROR(DistBackendError, msg.str());
  }

  // Validates the all-to-all count matrix and returns the number of rounds it needs.
  int64_t check_alltoall_counts(const CallInfo& call, int par, int64_t per) {
    int64_t most = 0;
    for (int i = 0; i < size_; ++i) {
      for (int j = 0; j < size_; ++j) {
        const int64_t sent = counts(par, 0, i)[j];
        const int64_t expected = counts(par, 1, j)[i];
        if (sent != expected) {
          std::ostringstream msg;
          msg << "mockccl: " << describe(call) << " split sizes disagree: rank " << i << " sends "
              << sent << " elements to rank " << j << ", which expects " << expected;
          C10_THROW_ERROR(DistBackendError, msg.str());
        }
        most = std::max(most, sent);
      }
    }
    return std::max<int64_t>(1, (most + per - 1) / std::max<int64_t>(per, 1));
  }

  void receive_from(const CallInfo& call, const Deadline& deadline, void* buf, int peer,
                    int tag) {
    Mailbox& box = mailbox(peer, rank_);
    const char* data = mailbox_data(peer, rank_);
    const int64_t total = call.count * static_cast<int64_t>(c10::elementSize(call.dtype));
    char* dst = static_cast<char*>(buf);
    int64_t off = 0;
    do {
      wait_for(call, deadline, [&] { return box.posted.load(std::memory_order_acquire) >
                                             box.taken.load(std::memory_order_relaxed); },
               [&] { return std::vector<int>{peer}; }, "send");
      if (off == 0 && (!box.first || box.tag != tag || box.total_bytes != total)) {
        std::ostringstream msg;
        msg << "mockccl: recv on rank " << rank_ << " expected " << total << " bytes with tag "
            << tag << " from rank " << peer << ", but rank " << peer << " sent "
            << box.total_bytes << " bytes with tag " << box.tag
            << " (send and recv must match in size and tag)";
        C10_THROW_ERROR(DistBackendError, msg.str());
      }
      std::memcpy(dst + off, data, box.bytes);
      off += box.bytes;
      box.taken.fetch_add(1, std::memory_order_release);
      ring();
    } while (off < total);
  }

  static std::string describe(const CallInfo& call) {
    if (call.seq == 0) return call.name;  // point to point: not a numbered collective
    std::ostringstream s;
    s << call.name << " (seq " << call.seq << ")";
    return s.str();
  }

  static std::string describe(const Header& h) {
    std::ostringstream s;
    s << accelkit::c10d::kind_name(static_cast<Kind>(h.kind)) << " seq " << h.seq << ", "
      << c10::toString(static_cast<c10::ScalarType>(h.dtype)) << ", " << h.count << " elements";
    if (h.op >= 0) s << ", op " << accelkit::c10d::redop_name(static_cast<RedOp>(h.op));
    if (h.root >= 0) s << ", root " << h.root;
    return s.str();
  }

  static std::string join(const std::vector<int>& v) {
    std::ostringstream s;
    for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
    return s.str();
  }

  static constexpr size_t kDirectReduceBytes = 32 * 1024;
  // Waiting: a few pauses, then many yields before sleeping. With more ranks than cores (4
  // ranks on 2 here) the rank a waiter needs is usually runnable on the same core, so giving
  // the core away at once is what makes progress; measured against 200 pauses + 20 yields:
  // 8 B allreduce 48 % faster, 2-32 MiB 16-22 % (bench/README.md).
  static constexpr int kSpins = 10;
  static constexpr int kYields = 300;
  static constexpr int64_t kSleepNs = 50 * 1000 * 1000;

  const int rank_;
  const int size_;
  char* const base_;
  const size_t chunk_;
  const size_t p2p_chunk_;
  const Layout layout_;
  Control* const ctl_;
  uint64_t epoch_ = 0;  // barriers passed by this rank (the same count on every rank)
  uint64_t calls_ = 0;  // collectives begun (header parity)
  int set_ = 0;         // slot set of the current round
  std::unique_ptr<Deadline> deadline_;  // of the current collective
  std::mutex broken_mutex_;
  std::string broken_;  // the first failure; every later call raises it
  std::atomic<bool> aborted_{false};  // abort() was called on this rank
  accelkit::Runtime* const runtime_;   // the device's, for discrete memory (nullptr: none)
  std::unique_ptr<std::mutex[]> recv_claims_{new std::mutex[size_]};  // per sending peer
};

}  // namespace mockccl
