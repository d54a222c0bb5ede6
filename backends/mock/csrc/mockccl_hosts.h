// mockccl across hosts: a group whose ranks live on several hosts. The ranks of each host keep
// their shared-memory group (mockccl_shm.h, over those ranks only); the hosts are joined over
// TCP (mockccl_net.h). Each host's lowest rank is its leader. A collective runs in two steps:
//
//   agree   the host's ranks check they issued the same call (a shared-memory barrier that
//           compares kind, dtype, count, op and root), the leaders swap those headers, and each
//           leader tells its host whether every host agreed. A mismatch raises on every rank
//           before any data moves, and the group stays usable, as on one host.
//   move    within a host through shared memory, between hosts only between leaders, so each
//           element crosses the network once per other host:
//             allreduce       host reduce to the leader; leaders swap and reduce (hosts in
//                             order, so every rank gets the same bits); host broadcast
//             reduce          as allreduce, towards the root's host; its leader hands the root
//                             the result
//             broadcast       root's host broadcast; its leader sends to the other leaders;
//                             their hosts broadcast
//             allgather       host gather to the leader; leaders swap host blocks; host
//                             broadcast of the whole result
//             gather          as allgather, towards the root's host
//             reduce_scatter  host reduce of the whole input; each leader sends every other
//                             leader the parts of that host's ranks; host scatter
//             scatter         the root scatters to its host and sends each other leader its
//                             host's parts; that host scatters
//             alltoall        every rank's split sizes gathered as above and checked
//                             everywhere; then ranks of one host through shared memory, ranks
//                             of different hosts over their own connection
//             barrier         agree alone
// Point to point goes over TCP between any two ranks (one host's included), so a receive from
// any source waits on one kind of channel.
//
// Failures: a deadline passed, a peer that exited or aborted, abort() — the rank that sees it
// shuts its connections and aborts its host's shared-memory group, so every rank's call fails
// at once, naming the cause; the group is unusable from then on, as on one host.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <accelkit/c10d/transport.h>
#include <accelkit/runtime.h>

#include "mockccl_net.h"
#include "mockccl_shm.h"

namespace mockccl {

class HostsTransport : public accelkit::c10d::Transport {
 public:
  // `hosts[r]`: rank r's host; `local`: the shared-memory group of this host's ranks (buffers
  // in host memory); `net`: the group's connections; `runtime`: the device's (discrete memory).
  HostsTransport(int rank, std::vector<std::string> hosts, std::unique_ptr<ShmTransport> local,
                 std::unique_ptr<Net> net, accelkit::Runtime* runtime);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Goodbye over TCP and in this host's segment (mockccl_net.h, mockccl_shm.h).
  void shutdown() override;
  void abort(const std::string& reason) override;

  void barrier(const CallInfo& call) override;
  void broadcast(const CallInfo& call, void* buf) override;
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
  // Runs a collective: agree, then `move`; a mismatch raises (the group stays usable), any
  // other failure breaks the group everywhere (fail) and raises.
  template <typename Move>
  void collective(const CallInfo& call, Move move);
  // The agree step; returns the mismatch to raise on every rank, or "".
  std::string agree(const CallInfo& call);
  // A call of this host's shared-memory group, with what is left of the collective's time.
  CallInfo local_call(const CallInfo& call, accelkit::c10d::Kind kind, int64_t count,
                      int root) const;
  // Leaders: the host partials `buf` (count elements) of every host reduced, in host order,
  // into `buf` on host `to`'s leader (every leader when to < 0), in pieces.
  void combine(const CallInfo& call, void* buf, int64_t count, int to);
  // Leaders: `block` (this host's ranks' parts, `part` bytes each, in their order) swapped
  // with the other leaders' (to < 0) or sent to host `to`'s leader; the receiving leaders
  // place every rank's part at its rank in `out`.
  void collect(const CallInfo& call, const char* block, size_t part, char* out, int to);
  // The result `buf` (`count` elements) moves from this host's leader to `root`, one of its ranks.
  void hand_over(const CallInfo& call, void* buf, int64_t count, int root);
  void allgather_host(const CallInfo& call, const void* in, void* out, size_t part);
  void check_usable(const CallInfo& call);
  // Breaks the group (here, on this host and, through the closed connections, elsewhere).
  void fail(const std::string& msg);

  bool leader() const { return local_rank_ == 0; }
  int leader_of(int host) const { return ranks_of_[host][0]; }
  int host_count() const { return static_cast<int>(ranks_of_.size()); }
  std::string host_name(int host) const;

  const int rank_;
  const int size_;
  const std::vector<std::string> hosts_;   // rank -> host name
  std::vector<int> host_of_;               // rank -> host index (hosts ordered by lowest rank)
  std::vector<std::vector<int>> ranks_of_;  // host index -> its ranks, ascending
  std::vector<int> local_of_;              // rank -> its index in its host's group
  int host_ = 0;
  int local_rank_ = 0;
  std::unique_ptr<ShmTransport> local_;
  std::unique_ptr<Net> net_;
  accelkit::Runtime* const runtime_;
  Clock::time_point deadline_;  // of the current collective
  // combine()'s receive buffers, one per host (kept: fresh ones fault their pages in).
  static constexpr size_t kNetPiece = 4 << 20;
  std::vector<std::unique_ptr<char[]>> incoming_;
  std::mutex broken_mutex_;
  std::string broken_;  // the first failure; every later call raises it
};

}  // namespace mockccl
