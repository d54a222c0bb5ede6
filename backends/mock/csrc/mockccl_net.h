// mockccl's network: TCP connections between the ranks of a group that spans hosts
// (mockccl_hosts.h). A vendor's library has its own (RDMA, its device's links); what it must keep
// is the behaviour: every wait ends at the call's deadline naming the ranks it waited for, a
// peer that exits or aborts makes the calls that need it fail at once, and abort() wakes every
// call in flight.
//
// Each rank listens on one address (ACCELKIT_MOCKCCL_SOCKET_IFNAME's IPv4 address; else the one
// its host uses to reach MASTER_ADDR; else its first non-loopback IPv4 interface), publishes it
// through the group's store and connects to every lower rank; the higher rank of a pair dials.
// A pair of ranks has up to two connections:
//   collective  ranks on different hosts: the group's collectives, driven by its one collective
//               thread; messages are raw bytes whose sizes both sides know (the collective's
//               header was agreed first);
//   p2p         every pair: send / recv, each message framed with its tag and size; a receive
//               takes the peer's messages in order and keeps those with other tags for the
//               receives that ask for them (matching by (peer, tag), as the shared-memory
//               mailboxes do, mockccl_p2p.cpp).
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

namespace mockccl {

using Clock = std::chrono::steady_clock;

class Net {
 public:
  // Connects rank `rank` of a group of `size` to its peers through `store`; hosts[r] names rank
  // r's host (collective connections join ranks whose hosts differ). Raises DistBackendError
  // naming the ranks that did not connect by `timeout`.
  Net(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
      const std::vector<std::string>& hosts, std::chrono::milliseconds timeout);
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

  // abort() was called, or a call failed: every later call raises.
  bool failed() const { return aborted_.load(std::memory_order_acquire); }

 private:
  struct Kept {
    int tag;
    std::vector<char> bytes;
  };
  struct Peer {
    int collective = -1;  // connection fds (-1: none)
    int p2p = -1;
    std::mutex send_mutex;   // one p2p send at a time to this peer
    std::mutex claim;        // held while a receive reads this peer's p2p messages
    std::deque<Kept> kept;   // messages read before a receive asked for their tag
  };

  void accept_all(int listener, int expected, Clock::time_point deadline,
                  std::chrono::milliseconds timeout);
  int dial(int peer, const std::string& where, int channel, Clock::time_point deadline,
           std::chrono::milliseconds timeout);

  // Reads one framed message from `peer` (its claim held): into `buf` when its tag is `tag`
  // (true), else into peer's kept messages (false).
  bool take(const accelkit::c10d::CallInfo& call, int peer, int tag, void* buf, size_t bytes,
            Clock::time_point deadline);
  bool take_kept(const accelkit::c10d::CallInfo& call, int peer, int tag, void* buf,
                 size_t bytes);
  void check_size(const accelkit::c10d::CallInfo& call, int peer, int tag, size_t expected,
                  size_t sent) const;
  // Reads / writes exactly `bytes` on `fd` by `deadline`.
  void read_all(const accelkit::c10d::CallInfo& call, int peer, int fd, char* p, size_t bytes,
                Clock::time_point deadline, const char* action);
  void write_all(const accelkit::c10d::CallInfo& call, int peer, int fd, const char* p,
                 size_t bytes, Clock::time_point deadline, const char* action);
  void check_aborted(const accelkit::c10d::CallInfo& call) const;
  // A connection closed, or a wait passed its deadline: the network is unusable from now on
  // (every connection is shut, so the peers' calls fail too); raises `msg`.
  [[noreturn]] void fail(const std::string& msg);
  [[noreturn]] void closed(const accelkit::c10d::CallInfo& call, int peer, int err);
  [[noreturn]] void timed_out(const accelkit::c10d::CallInfo& call,
                              const std::vector<int>& peers, const char* action);
  std::string who(int r) const;
  // The group's first failure as the store holds it ("rank R (host 'h') aborted the group:
  // ..."), or "".
  std::string reported() const;

  const c10::intrusive_ptr<::c10d::Store> store_;
  const int rank_;
  const int size_;
  const std::vector<std::string> hosts_;
  std::string address_;
  std::unique_ptr<Peer[]> peers_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex reason_mutex_;
  std::string reason_;
};

}  // namespace mockccl
