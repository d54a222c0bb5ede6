// mockccl's group state (mockccl_shm.h): barriers, waiting, and failures — a deadline passed, a
// peer process that died, a group another rank aborted.
#include "mockccl_shm.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

namespace mockccl {

uint64_t process_start_time(int pid) {
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

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t ns) {
  struct timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

ShmTransport::ShmTransport(int rank, int size, char* base, size_t chunk, size_t p2p_chunk,
                           Limits limits, accelkit::Runtime* runtime, std::vector<int> names)
    : rank_(rank),
      size_(size),
      base_(base),
      chunk_(chunk),
      p2p_chunk_(p2p_chunk),
      limits_(limits),
      layout_(size, chunk, p2p_chunk),
      ctl_(reinterpret_cast<Control*>(base)),
      runtime_(runtime),
      names_(std::move(names)) {
  if (names_.empty()) {
    for (int r = 0; r < size; ++r) names_.push_back(r);
  }
}

ShmTransport::~ShmTransport() { munmap(base_, layout_.total); }

// Local calls raise from now on; peers' calls with this group raise too (aborted_by), and
// every sleeper is woken to notice.
void ShmTransport::abort(const std::string& reason) {
  aborted_ = true;
  int32_t expected = 0;
  if (ctl_->aborted_by.compare_exchange_strong(expected, rank_ + 1)) {
    std::strncpy(ctl_->reason, reason.c_str(), sizeof(ctl_->reason) - 1);
  }
  set_broken("mockccl: " + reason);
  ring();
  futex_wake_all(&ctl_->bell);
}

void ShmTransport::shutdown() {
  state(rank_).left.store(1, std::memory_order_release);
  ring();
}

std::vector<int> ShmTransport::peers() const {
  std::vector<int> all;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) all.push_back(r);
  return all;
}

void ShmTransport::begin(const CallInfo& call) {
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

// The barrier: publish my epoch, ring the bell, wait for every rank's epoch.
void ShmTransport::sync(const CallInfo& call) {
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

void ShmTransport::ring() {
  ctl_->bell.fetch_add(1, std::memory_order_seq_cst);
  if (ctl_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&ctl_->bell);
}

void ShmTransport::timed_out(const CallInfo& call, const std::vector<int>& late,
                             const char* action) {
  std::ostringstream msg;
  msg << "mockccl: " << describe(call) << " timed out after " << call.timeout.count()
      << " ms on rank " << name(rank_) << ": rank" << (late.size() == 1 ? " " : "s ")
      << join(names(late))
      << " did not " << action
      << " (a rank skipped the call, or is stuck or slow); the group is unusable";
  fail(msg.str());
}

void ShmTransport::check_alive(const CallInfo& call, const std::vector<int>& ranks) {
  for (int r : ranks) {
    if (has_left(r)) {
      fail("mockccl: " + describe(call) + " failed on rank " + std::to_string(name(rank_)) +
           ": rank " + std::to_string(name(r)) + " has left the group (shut it down) and "
           "cannot take part; the group is unusable");
    }
    const int pid = state(r).pid.load(std::memory_order_acquire);
    if (pid == 0) continue;  // not connected yet
    if (process_start_time(pid) != state(r).start_time) {
      fail("mockccl: " + describe(call) + " failed on rank " + std::to_string(name(rank_)) +
           ": rank " + std::to_string(name(r)) + " (pid " + std::to_string(pid) +
           ") exited; the group is unusable");
    }
  }
}

void ShmTransport::check_aborted(const CallInfo& call) {
  const int by = ctl_->aborted_by.load(std::memory_order_acquire);
  if (by == 0 && !aborted_) return;
  if (by == 0 || by - 1 == rank_) {  // this rank aborted (or failed) the group
    std::string msg;
    {
      std::lock_guard<std::mutex> lock(broken_mutex_);
      msg = broken_;
    }
    C10_THROW_ERROR(DistBackendError, "mockccl: " + describe(call) + " on rank " +
                                          std::to_string(name(rank_)) + " aborted: " + msg);
  }
  std::string why(ctl_->reason, strnlen(ctl_->reason, sizeof(ctl_->reason)));
  std::string msg = "mockccl: " + describe(call) + " aborted on rank " +
                    std::to_string(name(rank_)) + ": rank " + std::to_string(name(by - 1)) +
                    " aborted the group: " + why;
  set_broken(msg);
  C10_THROW_ERROR(DistBackendError, msg);
}

// Marks the group unusable here and for every other rank, then raises.
void ShmTransport::fail(const std::string& msg) {
  int32_t expected = 0;
  if (ctl_->aborted_by.compare_exchange_strong(expected, rank_ + 1)) {
    std::strncpy(ctl_->reason, msg.c_str(), sizeof(ctl_->reason) - 1);
    ring();
  }
  set_broken(msg);
  C10_THROW_ERROR(DistBackendError, msg);
}

void ShmTransport::set_broken(const std::string& msg) {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  if (broken_.empty()) broken_ = msg;
}

void ShmTransport::check_usable(const CallInfo& call) {
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

void ShmTransport::check_headers(const CallInfo& call) {
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
  msg << "mockccl: collective mismatch at seq " << call.seq << " (detected on rank " << name(rank_)
      << "); every rank must issue the same collectives in the same order:";
  for (int r = 0; r < size_; ++r) {
    msg << "\n  rank " << name(r) << ": " << describe(header(par, r));
  }
  C10_THROW_ERROR(DistBackendError, msg.str());
}

std::string ShmTransport::describe(const CallInfo& call) {
  if (call.seq == 0) return call.name;  // point to point: not a numbered collective
  std::ostringstream s;
  s << call.name << " (seq " << call.seq << ")";
  return s.str();
}

std::string ShmTransport::describe(const Header& h) {
  std::ostringstream s;
  s << accelkit::c10d::kind_name(static_cast<Kind>(h.kind)) << " seq " << h.seq << ", "
    << c10::toString(static_cast<c10::ScalarType>(h.dtype)) << ", " << h.count << " elements";
  if (h.op >= 0) s << ", op " << accelkit::c10d::redop_name(static_cast<RedOp>(h.op));
  if (h.root >= 0) s << ", root " << h.root;
  return s.str();
}

std::vector<int> ShmTransport::names(const std::vector<int>& ranks) const {
  std::vector<int> out;
  for (int r : ranks) out.push_back(name(r));
  return out;
}

std::string ShmTransport::join(const std::vector<int>& v) {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  return s.str();
}

}  // namespace mockccl
