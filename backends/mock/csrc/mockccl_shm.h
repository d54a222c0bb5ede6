// mockccl's transport: the ranks of one host exchange data through one shared-memory segment per
// process group. These files are what a vendor replaces with calls into their collective
// library; <accelkit/c10d/backend.h> stays. This header holds the segment's layout and the
// transport class; its parts live in
//   mockccl_sync.cpp         barriers, waiting, failures (deadline, dead peer, abort);
//   mockccl_collectives.cpp  the collectives, in rounds through the data slots;
//   mockccl_p2p.cpp          send / recv / recv from any source, matched by (peer, tag);
//   mockccl_reduce.h         the reduction kernels;
//   mockccl_staging.h        host copies of a discrete device's buffers;
//   mockccl.cpp              connecting a group (the segment) and the Python module.
// A group whose ranks span hosts adds mockccl_hosts.h/.cpp (each host's ranks through one such
// segment, the hosts' leaders over TCP), mockccl_net.h/.cpp (the connections) and
// mockccl_wire.h (the wire format).
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
// Point to point: each ordered pair of ranks has a mailbox of one p2p chunk (the inbox size over
// the group size, mockccl.cpp pair_chunk); a message goes through
// it chunk by chunk, in the order the sender posts. A receive takes the peer's messages in that
// order: the first with its tag is delivered, those with other tags are kept (in this process)
// for the receives that ask for them, so messages match by (peer, tag) and stay in order within
// a tag, as gloo's do. A message's size, as the peer wrote it in the mailbox, is checked
// against the receiver's Limits before anything is taken for it.
// Barriers: each rank publishes an epoch; waiters spin briefly, yield the core, then sleep on
// a futex in the segment (a shared "bell" every arrival rings), waking at least every 50 ms to
// check the deadline, a peer process that died (/proc/<pid>/stat), and a group aborted by
// another rank.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <accelkit/c10d/transport.h>
#include <accelkit/runtime.h>

#include "mockccl_wire.h"

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
  std::atomic<int32_t> left;  // 1 once the rank shut the group down in order (shutdown())
  uint64_t start_time;        // /proc/<pid>/stat field 22: tells a recycled pid apart
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
uint64_t process_start_time(int pid);

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t ns);
void futex_wake_all(std::atomic<uint32_t>* word);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class ShmTransport : public accelkit::c10d::Transport {
 public:
  // `base` maps the group's segment of Layout(size, chunk, p2p_chunk).total bytes (already
  // unlinked from /dev/shm); the transport unmaps it when destroyed. `limits`: what a peer's
  // messages may make this rank take in. `runtime` is the device's (for discrete memory;
  // nullptr: buffers are host memory). `names`: the rank each of this group's ranks is in
  // messages (the ranks of the whole group when this one is the part of a group on one host,
  // mockccl_hosts.h); empty: their own.
  ShmTransport(int rank, int size, char* base, size_t chunk, size_t p2p_chunk, Limits limits,
               accelkit::Runtime* runtime, std::vector<int> names = {});
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Leaves the group in order: a receive from any source goes on without this rank; a receive
  // from it, or a collective, raises naming it at once (not at its timeout).
  void shutdown() override;
  void abort(const std::string& reason) override;
  // This rank or another aborted the group, or a call failed (deadline, dead peer): every later
  // call raises. A mismatch (a collective or its sizes differ between ranks) is not a failure:
  // it raises on every rank before any data moves, and the group stays usable.
  bool failed() const {
    return aborted_ || ctl_->aborted_by.load(std::memory_order_acquire) != 0;
  }
  // Every rank's header of the current collective (valid once its first barrier passed).
  std::vector<Header> headers() const {
    std::vector<Header> all;
    for (int r = 0; r < size_; ++r) all.push_back(header(static_cast<int>(calls_ & 1), r));
    return all;
  }
  static std::string describe(const Header& h);

  void barrier(const CallInfo& call) override;
  void broadcast(const CallInfo& call, void* device_buf) override;
  void allreduce(const CallInfo& call, const void* in, void* out) override;
  void reduce(const CallInfo& call, const void* in, void* out) override;
  void allgather(const CallInfo& call, const void* in, void* out) override;
  void gather(const CallInfo& call, const void* in, void* out) override;
  void reduce_scatter(const CallInfo& call, const void* in, void* out) override;
  void scatter(const CallInfo& call, const void* in, void* out) override;
  void alltoall(const CallInfo& call, const void* in, const std::vector<int64_t>& send_counts,
                const std::vector<int64_t>& send_offsets, void* out,
                const std::vector<int64_t>& recv_counts,
                const std::vector<int64_t>& recv_offsets) override;

  void send(const CallInfo& call, const void* buf, int peer, int tag) override;
  void recv(const CallInfo& call, void* buf, int peer, int tag) override;
  int recv_any(const CallInfo& call, void* buf, int tag) override;

 private:
  struct Deadline {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    std::chrono::milliseconds timeout;
    explicit Deadline(std::chrono::milliseconds t) : timeout(t) {}
    bool passed() const { return std::chrono::steady_clock::now() - start > timeout; }
  };

  // A message taken from a peer's mailbox before a receive asked for its tag.
  struct Kept {
    int tag;
    std::vector<char> bytes;
  };

  // Segment addresses.
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
  std::vector<int> peers() const;

  // Collectives (mockccl_collectives.cpp), on host buffers.
  void broadcast_host(const CallInfo& call, void* buf);
  void reduce_scatter_host(const CallInfo& call, const void* in, void* out);
  void scatter_host(const CallInfo& call, const void* in, void* out);
  void alltoall_host(const CallInfo& call, const void* in, const std::vector<int64_t>& send_counts,
                     const std::vector<int64_t>& send_offsets, void* out,
                     const std::vector<int64_t>& recv_counts,
                     const std::vector<int64_t>& recv_offsets);
  template <typename Fill, typename Drain>
  void rounds(const CallInfo& call, int64_t per, Fill fill, Drain drain);
  void reduce_rounds(const CallInfo& call, const void* in, void* out, bool writes);
  void gather_rounds(const CallInfo& call, const void* in, void* out);
  int64_t check_alltoall_counts(const CallInfo& call, int par, int64_t per);

  // Point to point (mockccl_p2p.cpp), on host buffers.
  void send_host(const CallInfo& call, const void* buf, int peer, int tag);
  void recv_host(const CallInfo& call, void* buf, int peer, int tag);
  int recv_any_host(const CallInfo& call, void* buf, int tag);
  bool message_waiting(int peer) const;
  bool take_kept(const CallInfo& call, int peer, int tag, void* buf);
  bool take_message(const CallInfo& call, const Deadline& deadline, int peer, int tag, void* buf);
  void check_size(const CallInfo& call, int peer, int tag, int64_t sent) const;
  bool has_left(int peer) const { return state(peer).left.load(std::memory_order_acquire) != 0; }
  [[noreturn]] void left(const CallInfo& call, const std::vector<int>& peers, int tag) const;

  // Group state (mockccl_sync.cpp).
  void begin(const CallInfo& call);
  void sync(const CallInfo& call);
  void ring();
  void check_alive(const CallInfo& call, const std::vector<int>& ranks);
  void check_aborted(const CallInfo& call);
  [[noreturn]] void fail(const std::string& msg);
  void set_broken(const std::string& msg);
  void check_usable(const CallInfo& call);
  void check_headers(const CallInfo& call);
  [[noreturn]] void timed_out(const CallInfo& call, const std::vector<int>& late,
                              const char* action);

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
      if (deadline.passed()) timed_out(call, missing(), action);
    }
  }

  static std::string describe(const CallInfo& call);
  static std::string join(const std::vector<int>& v);
  int name(int r) const { return names_[r]; }
  std::vector<int> names(const std::vector<int>& ranks) const;

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
  const Limits limits_;
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
  std::vector<int> names_;             // rank -> the rank it is in messages
  // Per sending peer: the claim on its mailbox and its kept messages, held while a receive
  // looks at them or takes a message, so a message is taken by exactly one receive.
  std::unique_ptr<std::mutex[]> recv_claims_{new std::mutex[size_]};
  std::unique_ptr<std::deque<Kept>[]> kept_{new std::deque<Kept>[size_]};
  std::unique_ptr<uint64_t[]> kept_bytes_{new uint64_t[size_]()};  // their bytes, per peer
};

}  // namespace mockccl
