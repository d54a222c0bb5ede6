// mockccl across hosts (mockccl_hosts.h): each host's ranks through shared memory, the hosts'
// leaders over TCP.
#include "mockccl_hosts.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <sstream>

#include "mockccl_reduce.h"
#include "mockccl_staging.h"

namespace mockccl {

namespace {

// What a leader tells its host after the agree step: "" (go on) or the mismatch to raise.
struct Verdict {
  char mismatch[4096];
};

std::string message(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

}  // namespace

HostsTransport::HostsTransport(int rank, std::vector<std::string> hosts,
                               std::unique_ptr<ShmTransport> local, std::unique_ptr<Net> net,
                               accelkit::Runtime* runtime)
    : rank_(rank),
      size_(static_cast<int>(hosts.size())),
      hosts_(std::move(hosts)),
      host_of_(size_),
      local_of_(size_),
      local_(std::move(local)),
      net_(std::move(net)),
      runtime_(runtime != nullptr && !runtime->host_accessible() ? runtime : nullptr) {
  for (int r = 0; r < size_; ++r) {
    int h = 0;
    while (h < host_count() && hosts_[leader_of(h)] != hosts_[r]) ++h;
    if (h == host_count()) ranks_of_.emplace_back();
    host_of_[r] = h;
    local_of_[r] = static_cast<int>(ranks_of_[h].size());
    ranks_of_[h].push_back(r);
  }
  host_ = host_of_[rank_];
  local_rank_ = local_of_[rank_];
}

std::string HostsTransport::host_name(int host) const {
  std::ostringstream s;
  s << "host '" << hosts_[leader_of(host)] << "' (rank" << (ranks_of_[host].size() > 1 ? "s " : " ");
  for (size_t i = 0; i < ranks_of_[host].size(); ++i) s << (i ? ", " : "") << ranks_of_[host][i];
  s << ")";
  return s.str();
}

void HostsTransport::shutdown() {
  net_->shutdown();
  local_->shutdown();
}

void HostsTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    if (broken_.empty()) broken_ = "mockccl: " + reason;
  }
  net_->abort(reason);
  local_->abort(reason);
}

void HostsTransport::fail(const std::string& msg) {
  {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    if (broken_.empty()) broken_ = msg;
  }
  net_->abort(msg);
  local_->abort(msg);
}

void HostsTransport::check_usable(const CallInfo& call) {
  std::string broken;
  {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    broken = broken_;
  }
  if (broken.empty()) return;
  std::ostringstream s;
  s << "mockccl: " << call.name;
  if (call.seq != 0) s << " (seq " << call.seq << ")";
  s << " on a group that failed earlier: " << broken;
  C10_THROW_ERROR(DistBackendError, s.str());
}

CallInfo HostsTransport::local_call(const CallInfo& call, Kind kind, int64_t count,
                                    int root) const {
  CallInfo c = call;
  c.kind = kind;
  c.count = count;
  c.root = root;
  if (kind != Kind::kReduce && kind != call.kind) c.op = RedOp::kNone;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
  c.timeout = std::max(left, std::chrono::milliseconds(1));
  return c;
}

template <typename Move>
void HostsTransport::collective(const CallInfo& call, Move move) {
  check_usable(call);
  deadline_ = Clock::now() + call.timeout;
  std::string mismatch;
  try {
    mismatch = agree(call);
    if (mismatch.empty()) move();
  } catch (const std::exception& e) {
    fail(message(e));
    throw;
  }
  if (!mismatch.empty()) C10_THROW_ERROR(DistBackendError, mismatch);
}

std::string HostsTransport::agree(const CallInfo& call) {
  bool host_mismatch = false;
  try {
    // The collective's own call (its timeout whole: nothing ran yet), as on one host.
    local_->barrier(call);
  } catch (const c10::DistBackendError&) {
    if (local_->failed()) throw;
    host_mismatch = true;  // among this host's ranks: their headers below show it to every host
  }
  Verdict verdict{};
  if (leader()) {
    // Every rank's header, from every host, in rank order.
    const std::vector<Header> mine = local_->headers();
    std::vector<std::vector<Header>> theirs(host_count());
    std::vector<Net::Io> sends, recvs;
    for (int h = 0; h < host_count(); ++h) {
      if (h == host_) continue;
      theirs[h].resize(ranks_of_[h].size());
      sends.push_back({leader_of(h), reinterpret_cast<char*>(const_cast<Header*>(mine.data())),
                       mine.size() * sizeof(Header)});
      recvs.push_back({leader_of(h), reinterpret_cast<char*>(theirs[h].data()),
                       theirs[h].size() * sizeof(Header)});
    }
    net_->exchange(call, sends, recvs, deadline_);
    theirs[host_] = mine;
    std::vector<Header> all(size_);
    for (int h = 0; h < host_count(); ++h) {
      for (size_t j = 0; j < ranks_of_[h].size(); ++j) all[ranks_of_[h][j]] = theirs[h][j];
    }
    bool same = true;
    for (const Header& h : all) {
      same = same && h.seq == all[0].seq && h.count == all[0].count && h.kind == all[0].kind &&
             h.dtype == all[0].dtype && h.op == all[0].op && h.root == all[0].root;
    }
    if (!same) {
      std::ostringstream msg;
      msg << "mockccl: collective mismatch at seq " << call.seq << " (detected on rank " << rank_
          << "); every rank must issue the same collectives in the same order:";
      for (int r = 0; r < size_; ++r) {
        msg << "\n  rank " << r << ": " << ShmTransport::describe(all[r]) << " (host '"
            << hosts_[r] << "')";
      }
      std::strncpy(verdict.mismatch, msg.str().c_str(), sizeof(verdict.mismatch) - 1);
    }
  }
  // The same header on every rank of the host, whatever they disagreed on (seq included).
  CallInfo tell = local_call(call, Kind::kBroadcast, sizeof(Verdict), 0);
  tell.dtype = c10::ScalarType::Byte;
  tell.op = RedOp::kNone;
  if (host_mismatch) tell.seq = 0;
  local_->broadcast(tell, &verdict);
  return std::string(verdict.mismatch, strnlen(verdict.mismatch, sizeof(verdict.mismatch)));
}

void HostsTransport::combine(const CallInfo& call, void* buf, int64_t count, int to) {
  const size_t es = c10::elementSize(call.dtype);
  const bool receives = to < 0 || to == host_;
  // In pieces of kNetPiece bytes, each reduced while still in cache, through buffers kept
  // from call to call (fresh ones would fault their pages in on every call).
  const int64_t piece = std::max<int64_t>(1, kNetPiece / es);
  if (receives && incoming_.empty()) {
    for (int h = 0; h < host_count(); ++h) incoming_.emplace_back(new char[kNetPiece]);
  }
  std::vector<const void*> parts(host_count());
  int64_t off = 0;
  do {
    const int64_t n = std::min(piece, count - off);
    char* mine = static_cast<char*>(buf) + off * es;
    std::vector<Net::Io> sends, recvs;
    for (int h = 0; h < host_count(); ++h) {
      if (h == host_) continue;
      if (to < 0 || to == h) sends.push_back({leader_of(h), mine, n * es});
      if (receives) recvs.push_back({leader_of(h), incoming_[h].get(), n * es});
    }
    net_->exchange(call, sends, recvs, deadline_);
    if (receives) {
      for (int h = 0; h < host_count(); ++h) parts[h] = h == host_ ? mine : incoming_[h].get();
      mockccl::reduce(call.dtype, call.op, mine, parts.data(), host_count(), n);
    }
    off += n;
  } while (off < count);
}

void HostsTransport::collect(const CallInfo& call, const char* block, size_t part, char* out,
                             int to) {
  std::vector<Net::Io> sends, recvs;
  std::vector<std::vector<char>> blocks(host_count());
  const bool receives = to < 0 || to == host_;
  for (int h = 0; h < host_count(); ++h) {
    if (h == host_) continue;
    if (to < 0 || to == h) {
      sends.push_back({leader_of(h), const_cast<char*>(block), ranks_of_[host_].size() * part});
    }
    if (receives) {
      blocks[h].resize(ranks_of_[h].size() * part);
      recvs.push_back({leader_of(h), blocks[h].data(), blocks[h].size()});
    }
  }
  net_->exchange(call, sends, recvs, deadline_);
  if (!receives) return;
  for (int h = 0; h < host_count(); ++h) {
    const char* from = h == host_ ? block : blocks[h].data();
    for (size_t j = 0; j < ranks_of_[h].size(); ++j) {
      std::memcpy(out + ranks_of_[h][j] * part, from + j * part, part);
    }
  }
}

void HostsTransport::hand_over(const CallInfo& call, void* buf, int64_t count, int root) {
  if (root == leader_of(host_)) return;
  const CallInfo c = local_call(call, Kind::kSend, count, -1);
  if (leader()) local_->send(c, buf, local_of_[root], 0);
  if (rank_ == root) local_->recv(c, buf, 0, 0);
}

void HostsTransport::barrier(const CallInfo& call) {
  collective(call, [] {});
}

void HostsTransport::broadcast(const CallInfo& call, void* device_buf) {
  Staging stage(runtime_, call.device);
  const size_t bytes = call.count * c10::elementSize(call.dtype);
  stage.in(device_buf, bytes);
  void* buf = stage.out(device_buf, bytes);
  const int root_host = host_of_[call.root];
  collective(call, [&] {
    if (host_ == root_host) {
      local_->broadcast(local_call(call, Kind::kBroadcast, call.count, local_of_[call.root]), buf);
    }
    if (leader()) {
      std::vector<Net::Io> sends, recvs;
      for (int h = 0; h < host_count(); ++h) {
        if (h == host_) continue;
        if (host_ == root_host) sends.push_back({leader_of(h), static_cast<char*>(buf), bytes});
      }
      if (host_ != root_host) recvs.push_back({leader_of(root_host), static_cast<char*>(buf), bytes});
      net_->exchange(call, sends, recvs, deadline_);
    }
    if (host_ != root_host) {
      local_->broadcast(local_call(call, Kind::kBroadcast, call.count, 0), buf);
    }
  });
  stage.finish();
}

void HostsTransport::allreduce(const CallInfo& call, const void* in, void* out) {
  Staging stage(runtime_, call.device);
  const size_t bytes = call.count * c10::elementSize(call.dtype);
  const void* hin = stage.in(in, bytes);
  void* hout = stage.out(out, bytes);
  collective(call, [&] {
    local_->reduce(local_call(call, Kind::kReduce, call.count, 0), hin, hout);
    if (leader()) combine(call, hout, call.count, -1);
    local_->broadcast(local_call(call, Kind::kBroadcast, call.count, 0), hout);
  });
  stage.finish();
}

void HostsTransport::reduce(const CallInfo& call, const void* in, void* out) {
  Staging stage(runtime_, call.device);
  const size_t bytes = call.count * c10::elementSize(call.dtype);
  const void* hin = stage.in(in, bytes);
  const int root_host = host_of_[call.root];
  std::vector<char> scratch;
  void* buf = nullptr;
  if (rank_ == call.root) {
    buf = stage.out(out, bytes);
  } else if (leader()) {
    scratch.resize(bytes);
    buf = scratch.data();
  }
  collective(call, [&] {
    local_->reduce(local_call(call, Kind::kReduce, call.count, 0), hin, buf);
    if (leader()) combine(call, buf, call.count, root_host);
    if (host_ == root_host) hand_over(call, buf, call.count, call.root);
  });
  stage.finish();
}

void HostsTransport::allgather_host(const CallInfo& call, const void* in, void* out,
                                    size_t part) {
  std::vector<char> block(leader() ? ranks_of_[host_].size() * part : 0);
  const int64_t count = static_cast<int64_t>(part / c10::elementSize(call.dtype));
  local_->gather(local_call(call, Kind::kGather, count, 0), in, leader() ? block.data() : nullptr);
  if (leader()) collect(call, block.data(), part, static_cast<char*>(out), -1);
  local_->broadcast(local_call(call, Kind::kBroadcast, count * size_, 0), out);
}

void HostsTransport::allgather(const CallInfo& call, const void* in, void* out) {
  Staging stage(runtime_, call.device);
  const size_t bytes = call.count * c10::elementSize(call.dtype);
  const void* hin = stage.in(in, bytes);
  void* hout = stage.out(out, bytes * size_);
  collective(call, [&] { allgather_host(call, hin, hout, bytes); });
  stage.finish();
}

void HostsTransport::gather(const CallInfo& call, const void* in, void* out) {
  Staging stage(runtime_, call.device);
  const size_t bytes = call.count * c10::elementSize(call.dtype);
  const void* hin = stage.in(in, bytes);
  const int root_host = host_of_[call.root];
  std::vector<char> block(leader() ? ranks_of_[host_].size() * bytes : 0), scratch;
  void* buf = nullptr;
  if (rank_ == call.root) {
    buf = stage.out(out, bytes * size_);
  } else if (leader() && host_ == root_host) {
    scratch.resize(bytes * size_);
    buf = scratch.data();
  }
  collective(call, [&] {
    local_->gather(local_call(call, Kind::kGather, call.count, 0), hin,
                   leader() ? block.data() : nullptr);
    if (leader()) collect(call, block.data(), bytes, static_cast<char*>(buf), root_host);
    if (host_ == root_host) hand_over(call, buf, call.count * size_, call.root);
  });
  stage.finish();
}

void HostsTransport::reduce_scatter(const CallInfo& call, const void* in, void* out) {
  Staging stage(runtime_, call.device);
  const size_t es = c10::elementSize(call.dtype);
  const size_t part = call.count * es;
  const void* hin = stage.in(in, part * size_);
  void* hout = stage.out(out, part);
  collective(call, [&] {
    std::vector<char> partial(leader() ? part * size_ : 0), result;
    local_->reduce(local_call(call, Kind::kReduce, call.count * size_, 0), hin,
                   leader() ? partial.data() : nullptr);
    if (leader()) {
      // Each host's ranks' parts of the host partial, in their order.
      auto parts_of = [&](int h) {
        std::vector<char> block(ranks_of_[h].size() * part);
        for (size_t j = 0; j < ranks_of_[h].size(); ++j) {
          std::memcpy(block.data() + j * part, partial.data() + ranks_of_[h][j] * part, part);
        }
        return block;
      };
      const size_t mine = ranks_of_[host_].size() * part;
      std::vector<std::vector<char>> outgoing(host_count()), incoming(host_count());
      std::vector<Net::Io> sends, recvs;
      for (int h = 0; h < host_count(); ++h) {
        if (h == host_) {
          incoming[h] = parts_of(h);
          continue;
        }
        outgoing[h] = parts_of(h);
        incoming[h].resize(mine);
        sends.push_back({leader_of(h), outgoing[h].data(), outgoing[h].size()});
        recvs.push_back({leader_of(h), incoming[h].data(), mine});
      }
      net_->exchange(call, sends, recvs, deadline_);
      std::vector<const void*> parts(host_count());
      for (int h = 0; h < host_count(); ++h) parts[h] = incoming[h].data();
      result.resize(mine);
      mockccl::reduce(call.dtype, call.op, result.data(), parts.data(), host_count(),
                      call.count * static_cast<int64_t>(ranks_of_[host_].size()));
    }
    local_->scatter(local_call(call, Kind::kScatter, call.count, 0),
                    leader() ? result.data() : nullptr, hout);
  });
  stage.finish();
}

void HostsTransport::scatter(const CallInfo& call, const void* in, void* out) {
  Staging stage(runtime_, call.device);
  const size_t part = call.count * c10::elementSize(call.dtype);
  const bool root = rank_ == call.root;
  const char* hin = static_cast<const char*>(root ? stage.in(in, part * size_) : nullptr);
  void* hout = stage.out(out, part);
  const int root_host = host_of_[call.root];
  collective(call, [&] {
    auto parts_of = [&](int h) {  // host h's ranks' parts of the root's input, in their order
      std::vector<char> block(ranks_of_[h].size() * part);
      for (size_t j = 0; j < ranks_of_[h].size(); ++j) {
        std::memcpy(block.data() + j * part, hin + ranks_of_[h][j] * part, part);
      }
      return block;
    };
    std::vector<char> block;
    if (root) {
      std::vector<std::vector<char>> outgoing(host_count());
      std::vector<Net::Io> sends;
      for (int h = 0; h < host_count(); ++h) {
        if (h == host_) continue;
        outgoing[h] = parts_of(h);
        sends.push_back({leader_of(h), outgoing[h].data(), outgoing[h].size()});
      }
      net_->exchange(call, sends, {}, deadline_);
      block = parts_of(host_);
    } else if (leader() && host_ != root_host) {
      block.resize(ranks_of_[host_].size() * part);
      net_->exchange(call, {}, {{call.root, block.data(), block.size()}}, deadline_);
    }
    const int from = host_ == root_host ? local_of_[call.root] : 0;
    local_->scatter(local_call(call, Kind::kScatter, call.count, from),
                    block.empty() ? nullptr : block.data(), hout);
  });
  stage.finish();
}

void HostsTransport::alltoall(const CallInfo& call, const void* in,
                              const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& send_offsets, void* out,
                              const std::vector<int64_t>& recv_counts,
                              const std::vector<int64_t>& recv_offsets) {
  Staging stage(runtime_, call.device);
  const size_t es = c10::elementSize(call.dtype);
  const int64_t sent = extent(send_counts, send_offsets);
  const int64_t received = extent(recv_counts, recv_offsets);
  const char* hin = static_cast<const char*>(stage.in(in, sent * es));
  char* hout = static_cast<char*>(stage.out(out, received * es));
  std::string disagree;
  collective(call, [&] {
    // Every rank's split sizes, everywhere: row r = what r sends to each rank, then what it
    // expects from each.
    std::vector<int64_t> row(send_counts);
    row.insert(row.end(), recv_counts.begin(), recv_counts.end());
    std::vector<int64_t> rows(2 * size_ * size_);
    CallInfo sizes = call;
    sizes.dtype = c10::ScalarType::Long;
    allgather_host(sizes, row.data(), rows.data(), row.size() * sizeof(int64_t));
    for (int i = 0; i < size_ && disagree.empty(); ++i) {
      for (int j = 0; j < size_; ++j) {
        const int64_t sends = rows[i * 2 * size_ + j], expects = rows[j * 2 * size_ + size_ + i];
        if (sends == expects) continue;
        std::ostringstream msg;
        msg << "mockccl: " << call.name << " (seq " << call.seq << ") split sizes disagree: rank "
            << i << " sends " << sends << " elements to rank " << j << ", which expects "
            << expects;
        disagree = msg.str();
        break;
      }
    }
    if (!disagree.empty()) return;  // the same on every rank: nothing moves
    std::vector<Net::Io> sends, recvs;
    const auto& mine = ranks_of_[host_];
    std::vector<int64_t> lsc(mine.size()), lso(mine.size()), lrc(mine.size()), lro(mine.size());
    for (int p = 0; p < size_; ++p) {
      if (host_of_[p] == host_) {
        const int j = local_of_[p];
        lsc[j] = send_counts[p], lso[j] = send_offsets[p];
        lrc[j] = recv_counts[p], lro[j] = recv_offsets[p];
        continue;
      }
      if (send_counts[p] > 0) {
        sends.push_back({p, const_cast<char*>(hin) + send_offsets[p] * es, send_counts[p] * es});
      }
      if (recv_counts[p] > 0) recvs.push_back({p, hout + recv_offsets[p] * es, recv_counts[p] * es});
    }
    net_->exchange(call, sends, recvs, deadline_);
    local_->alltoall(local_call(call, Kind::kAlltoall, 0, -1), hin, lsc, lso, hout, lrc, lro);
  });
  if (!disagree.empty()) C10_THROW_ERROR(DistBackendError, disagree);
  stage.finish();
}

void HostsTransport::send(const CallInfo& call, const void* buf, int peer, int tag) {
  check_usable(call);
  Staging stage(runtime_, call.device);
  const size_t bytes = call.count * c10::elementSize(call.dtype);
  try {
    net_->send(call, stage.in(buf, bytes), bytes, peer, tag);
  } catch (const std::exception& e) {
    if (net_->failed()) fail(message(e));
    throw;
  }
}

void HostsTransport::recv(const CallInfo& call, void* buf, int peer, int tag) {
  check_usable(call);
  Staging stage(runtime_, call.device);
  const size_t bytes = call.count * c10::elementSize(call.dtype);
  try {
    net_->recv(call, stage.out(buf, bytes), bytes, peer, tag);
  } catch (const std::exception& e) {
    if (net_->failed()) fail(message(e));
    throw;
  }
  stage.finish();
}

int HostsTransport::recv_any(const CallInfo& call, void* buf, int tag) {
  check_usable(call);
  Staging stage(runtime_, call.device);
  const size_t bytes = call.count * c10::elementSize(call.dtype);
  int from = -1;
  try {
    from = net_->recv_any(call, stage.out(buf, bytes), bytes, tag);
  } catch (const std::exception& e) {
    if (net_->failed()) fail(message(e));
    throw;
  }
  stage.finish();
  return from;
}

}  // namespace mockccl
