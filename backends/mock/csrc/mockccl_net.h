// mockccl's network: TCP connections between the ranks of a group that spans hosts
// (mockccl_hosts.h). A vendor's library has its own (RDMA, its device's links); what it must keep
// is the behaviour: only the group's own ranks get in, nothing read from the wire is trusted
// before it is checked, every wait ends at the call's deadline naming the ranks it waited for,
// a peer that exits or aborts makes the calls that need it fail at once, and abort() wakes every
// call in flight.
//
// Connecting (the constructor). Rank 0 makes a random secret for this creation of the group and
// puts it in the group's store; every rank listens on one address (address_for_group), puts it
// in the store and reads everybody's; then each rank dials every lower rank while accepting
// the higher ranks' connections, all at once in one poll loop. The dialer binds its socket to
// the address it published and sends a Hello (mockccl_wire.h: its rank, the group's size and
// secret); the listener admits the connection only if the secret matches (compared in constant
// time), the rank is one it expects on that channel and the connection comes from the address
// that rank published, then answers with its own Hello, which the dialer checks the same way.
// A connection that fails any check is closed unanswered and noted (a group creation that then
// times out lists what it refused); one that sends no Hello within kHelloWait is closed too,
// so no connection can hold up the others. Two admitted connections for one rank's channel is
// a fatal error naming both addresses. A rank whose creation fails writes why to the store;
// the others, dialing again or waiting past a second, find it there and fail too, naming it.
// Each connection's deadline is the group's; every file descriptor is owned, so a failed
// creation leaves none open.
//
// A pair of ranks has up to two connections:
//   collective  ranks on different hosts: the group's collectives, driven by its one collective
//               thread; each message goes behind a Piece header (its number on the connection
//               and its size, which both sides know: the collective's header was agreed first);
//   p2p         every pair: send / recv, each message behind a Frame header (tag and size); a
//               receive takes the peer's messages in order and keeps those with other tags for
//               the receives that ask for them (matching by (peer, tag), as the shared-memory
//               mailboxes do, mockccl_p2p.cpp).
// Bounded input: a frame larger than the largest receive this rank can post (its device's
// memory, Limits::max_message, mockccl_wire.h), or one that would take the messages kept from
// a peer beyond Limits::kept_bytes (ACCELKIT_MOCKCCL_KEPT_BYTES), fails the group naming the
// limit before any memory is taken for it; a kept message's memory grows as its bytes arrive.
//
// Failing promptly (the bounds tests/mockccl/test_mockccl_hostile.py checks with the store's process
// frozen): abort() sets the flag and shuts every connection before it touches the store, then
// writes the failure to the store for the other hosts, waiting at most kPublishWait; so abort()
// returns within kPublishWait (250 ms) even when the store's host is the one that failed. Calls
// waiting in this process raise within kSliceMs (50 ms) of it; a peer's call waiting on this
// rank raises within kSliceMs of its connection closing, plus at most kClosedGrace (250 ms)
// looking for the cause in the store and kPublishWait writing its own: 550 ms in all. No waiter
// blocks on the store longer than that (store calls run on a thread of their own, Reports).
//
// Leaving in order: shutdown() says goodbye on every connection. A receive from any source
// then goes on with the peers that are left; a receive from that peer, or a collective that
// needs it, raises naming it. A connection that closes without a goodbye is a rank that
// crashed: the group fails.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <accelkit/c10d/transport.h>

#include "mockccl_wire.h"

namespace mockccl {

using Clock = std::chrono::steady_clock;

// A file descriptor, closed when its owner goes.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// The address a rank of a group that spans hosts listens on and dials from, as NCCL picks its
// socket interface: ACCELKIT_MOCKCCL_SOCKET_IFNAME's IPv4 address where set (loopback included:
// naming it is how ranks of one machine that act as several hosts connect); else the one this
// host uses to reach MASTER_ADDR; else its first non-loopback interface that is up. A loopback
// address is never chosen unless named: published to another host, it would name that host
// (torchrun's MASTER_ADDR is rank 0's hostname, which many installs map to 127.0.1.1). Raises
// naming what it tried when nothing usable is left.
std::string address_for_group();

class Reports;

class Net {
 public:
  // Connects rank `rank` of a group of `size` to its peers through `store`; hosts[r] names rank
  // r's host (collective connections join ranks whose hosts differ). Raises DistBackendError
  // naming the ranks that did not connect by `timeout`, and the connections it refused.
  Net(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
      const std::vector<std::string>& hosts, std::chrono::milliseconds timeout, Limits limits);
  ~Net();
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;

  // Bytes to write to, or read from, one peer's collective connection.
  struct Io {
    int peer;
    char* data;
    size_t bytes;
  };
  // Writes every `sends` and reads every `recvs` at once (each connection both ways, so two
  // ranks sending each other large messages do not wait on each other), by `deadline`.
  // `call` names the collective in errors.
  void exchange(const accelkit::c10d::CallInfo& call, const std::vector<Io>& sends,
                const std::vector<Io>& recvs, Clock::time_point deadline);

  // Point to point (p2p connections); the receiver checks the tag and the size.
  void send(const accelkit::c10d::CallInfo& call, const void* buf, size_t bytes, int peer,
            int tag);
  void recv(const accelkit::c10d::CallInfo& call, void* buf, size_t bytes, int peer, int tag);
  int recv_any(const accelkit::c10d::CallInfo& call, void* buf, size_t bytes, int tag);

  // Every call in flight here, and every later one, raises naming `reason`; the peers' calls
  // that wait on this rank fail at once (their connections close), naming this rank and
  // `reason` (the group's first failure is kept in its store for them).
  void abort(const std::string& reason);

  // Goodbye to every peer (after the last call returned; once): they go on without this rank.
  void shutdown();

  // abort() was called, or a call failed: every later call raises.
  bool failed() const { return aborted_.load(std::memory_order_acquire); }

  // How long a connection may take to send its Hello; how long abort() waits for the store;
  // how long a call that saw a connection close, or timed out, looks for the cause in it.
  static constexpr std::chrono::milliseconds kHelloWait{2000};
  static constexpr std::chrono::milliseconds kPublishWait{250};
  static constexpr std::chrono::milliseconds kClosedGrace{250};
  static constexpr std::chrono::milliseconds kReportGrace{1000};
  static constexpr int kSliceMs = 50;  // waits wake at least this often for abort and deadlines

 private:
  struct Kept {
    int tag;
    std::vector<char> bytes;
  };
  struct Peer {
    Fd collective;  // (not open: none)
    Fd p2p;
    std::mutex send_mutex;    // one p2p send at a time to this peer
    std::mutex claim;         // held while a receive reads this peer's p2p messages
    std::deque<Kept> kept;    // messages read before a receive asked for their tag
    uint64_t kept_bytes = 0;  // their bytes
    uint64_t sent = 0;        // collective messages sent / received (the collective thread's)
    uint64_t received = 0;
    std::atomic<bool> left{false};  // it said goodbye on its p2p connection
  };

  void connect_all(int listener, const std::vector<std::string>& where,
                   Clock::time_point deadline, std::chrono::milliseconds timeout);
  wire::Hello hello(int peer_or_self, wire::Channel channel) const;

  // Reads one framed message from `peer` (its claim held): into `buf` when its tag is `tag`
  // (true), else into peer's kept messages, or the peer's goodbye (false).
  bool take(const accelkit::c10d::CallInfo& call, int peer, int tag, void* buf, size_t bytes,
            Clock::time_point deadline);
  bool take_kept(const accelkit::c10d::CallInfo& call, int peer, int tag, void* buf,
                 size_t bytes);
  void check_size(const accelkit::c10d::CallInfo& call, int peer, int tag, size_t expected,
                  size_t sent) const;
  [[noreturn]] void left(const accelkit::c10d::CallInfo& call, const std::vector<int>& peers,
                         int tag) const;
  // Reads / writes exactly `bytes` on `fd` by `deadline`.
  void read_all(const accelkit::c10d::CallInfo& call, int peer, int fd, char* p, size_t bytes,
                Clock::time_point deadline, const char* action);
  void write_all(const accelkit::c10d::CallInfo& call, int peer, int fd, const char* p,
                 size_t bytes, Clock::time_point deadline, const char* action);
  void check_aborted(const accelkit::c10d::CallInfo& call) const;
  // A connection closed, a peer broke the protocol, or a wait passed its deadline: the network
  // is unusable from now on (every connection is shut, so the peers' calls fail too); raises.
  [[noreturn]] void fail(const std::string& msg);
  [[noreturn]] void closed(const accelkit::c10d::CallInfo& call, int peer, int err);
  [[noreturn]] void broken(const accelkit::c10d::CallInfo& call, int peer, const char* channel,
                           const std::string& why);
  [[noreturn]] void timed_out(const accelkit::c10d::CallInfo& call,
                              const std::vector<int>& peers, const char* action);
  std::string who(int r) const;
  std::string call_on_rank(const accelkit::c10d::CallInfo& call) const;

  const int rank_;
  const int size_;
  const std::vector<std::string> hosts_;
  const Limits limits_;
  wire::Secret secret_{};
  std::vector<std::string> addresses_;  // rank -> the IPv4 address it published
  std::unique_ptr<Peer[]> peers_;
  std::unique_ptr<Reports> reports_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> said_goodbye_{false};
  mutable std::mutex reason_mutex_;
  std::string reason_;
};

}  // namespace mockccl
