// mockccl: the mock device's collective library, as a Python module (accelkit_mock_mockccl).
//
// `Backend(store, rank, size, timeout_ms, device)` (accelkit::c10d::bind_collectives) connects
// the ranks of one process group through the c10d Store and returns a c10d::Backend
// (<accelkit/c10d/backend.h>) running on mockccl's transport: shared memory within a host
// (mockccl_shm.h and the mockccl_*.cpp files it lists), TCP between hosts (mockccl_hosts.h).
// Connecting:
//   1. every rank publishes its host (hostname, or ACCELKIT_MOCKCCL_HOSTID);
//   2. the lowest rank of each host creates /dev/shm/accelkit_mockccl_<pid>_<n>_<random> for the
//      group's ranks on that host, reserves its memory (so a full /dev/shm fails here, not later
//      with SIGBUS) and publishes the name; the host's other ranks map it and report back; the
//      creator then unlinks the name. From then on nothing is left in /dev/shm, whatever happens
//      to the processes: the memory goes away with the last mapping;
//   3. a group that spans hosts also connects its ranks over TCP (mockccl_net.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <accelkit/c10d/backend.h>

#include "mockccl_hosts.h"
#include "mockccl_shm.h"

namespace mockccl {

constexpr const char* kName = "mockccl";
constexpr const char* kSegmentPrefix = "/accelkit_mockccl_";

// A size setting: `fallback` when unset, else a number of bytes in [low, high], or an error
// naming the setting and the range (a larger value would overflow the segment's arithmetic or
// ask for more memory than any host has).
size_t env_size(const char* name, size_t fallback, size_t low, size_t high) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long parsed = std::strtoull(value, &end, 10);
  TORCH_CHECK(end != value && *end == '\0' && errno == 0 && value[0] != '-' && parsed >= low &&
                  parsed <= high,
              name, "=", value, " must be a number of bytes from ", low, " to ", high);
  return static_cast<size_t>(parsed);
}

constexpr size_t kGiB = size_t{1} << 30;

// Point to point: every rank has an inbox of `inbox` bytes (ACCELKIT_MOCKCCL_P2P_BYTES), split
// evenly among the group's senders, each pair's mailbox a whole number of cache lines. A group's
// mailboxes then take size * inbox bytes: linear in the group size (a fixed mailbox per pair
// would be quadratic: 1 GiB for 64 ranks at 256 KiB a pair). A smaller mailbox only means a
// message crosses it in more chunks.
size_t pair_chunk(int size) {
  const size_t inbox = env_size("ACCELKIT_MOCKCCL_P2P_BYTES", 2 << 20, 4096, kGiB);
  return std::max<size_t>(64, inbox / static_cast<size_t>(size) / 64 * 64);
}

size_t collective_chunk() {
  return env_size("ACCELKIT_MOCKCCL_CHUNK_BYTES", 512 << 10, 4096, kGiB);
}

// What a peer across hosts may make this rank take in (mockccl_net.h): messages no larger than
// the largest receive it can post (a device's memory), and ACCELKIT_MOCKCCL_KEPT_BYTES of
// messages per peer kept for receives not posted yet.
Limits limits() {
  uint64_t largest = 0;
  if (accelkit::Runtime* runtime = accelkit::c10d::device_runtime()) {
    for (int d = 0; d < runtime->device_count(); ++d) {
      largest = std::max<uint64_t>(largest, runtime->capacity(d));
    }
  }
  return {largest, env_size("ACCELKIT_MOCKCCL_KEPT_BYTES", kGiB, 4096, 64 * kGiB)};
}

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string to_string(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string rank_key(const char* what, int rank) {
  return std::string("mockccl/") + what + "/" + std::to_string(rank);
}

// Waits for the keys `what`/r, r in ranks; on timeout names the ranks that never set theirs.
void wait_ranks(const c10::intrusive_ptr<::c10d::Store>& store, const char* what,
                const std::vector<int>& ranks, int rank, int size,
                std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(rank_key(what, r));
  try {
    store->wait(keys, timeout);
  } catch (const c10::Error&) {
    std::ostringstream missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!store->check({keys[i]})) missing << (missing.tellp() > 0 ? ", " : "") << ranks[i];
    }
    C10_THROW_ERROR(DistBackendError,
                    "mockccl: connecting a group of " + std::to_string(size) + " ranks timed out "
                    "after " + std::to_string(timeout.count()) + " ms on rank " +
                    std::to_string(rank) + ": rank(s) " + missing.str() +
                    " did not connect (a rank did not create the group or crashed)");
  }
}

// The host each rank is on: its hostname, or ACCELKIT_MOCKCCL_HOSTID where set (as NCCL_HOSTID:
// ranks with different values connect as if on different machines, which is how tests run the
// inter-host path on one). Every rank waits for every other's.
std::vector<std::string> hosts_of(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                  int size, std::chrono::milliseconds timeout) {
  const char* id = std::getenv("ACCELKIT_MOCKCCL_HOSTID");
  store->set(rank_key("host", rank), to_bytes(id != nullptr && *id != '\0' ? id : hostname()));
  std::vector<int> all(size);
  for (int r = 0; r < size; ++r) all[r] = r;
  wait_ranks(store, "host", all, rank, size, timeout);
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) hosts.push_back(to_string(store->get(rank_key("host", r))));
  return hosts;
}

// A created-or-opened segment; unlinks (creator) and unmaps on failure paths.
struct Segment {
  std::string name;
  char* base = nullptr;
  size_t bytes = 0;
  bool linked = false;

  ~Segment() {
    if (linked) shm_unlink(name.c_str());
    if (base != nullptr) munmap(base, bytes);
  }
  void unlink() {
    if (linked) shm_unlink(name.c_str());
    linked = false;
  }
  char* release() {
    char* b = base;
    base = nullptr;
    return b;
  }
};

[[noreturn]] void sys_error(const std::string& what, int err) {
  C10_THROW_ERROR(DistBackendError, "mockccl: " + what + ": " + std::strerror(err));
}

void map(Segment& seg, int fd) {
  void* p = mmap(nullptr, seg.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) sys_error("mmap of /dev/shm" + seg.name + " failed", err);
  seg.base = static_cast<char*>(p);
}

void create(Segment& seg, size_t chunk, size_t p2p_chunk, int size, uint64_t nonce) {
  static std::atomic<int> counter{0};
  std::random_device rd;
  std::ostringstream name;
  name << kSegmentPrefix << getpid() << "_" << counter++ << "_" << std::hex << rd() << rd();
  seg.name = name.str();
  seg.bytes = Layout(size, chunk, p2p_chunk).total;
  const int fd = shm_open(seg.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) sys_error("cannot create /dev/shm" + seg.name, errno);
  seg.linked = true;
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(seg.bytes));
  if (err != 0) {
    close(fd);
    sys_error("cannot reserve " + std::to_string(seg.bytes >> 20) + " MiB in /dev/shm for a " +
                  std::to_string(size) + "-rank group (lower ACCELKIT_MOCKCCL_CHUNK_BYTES or "
                  "ACCELKIT_MOCKCCL_P2P_BYTES, or enlarge /dev/shm)",
              err);
  }
  map(seg, fd);
  auto* ctl = reinterpret_cast<Control*>(seg.base);
  ctl->nonce = nonce;
  ctl->size = size;
  ctl->chunk = chunk;
  ctl->p2p_chunk = p2p_chunk;
  std::atomic_thread_fence(std::memory_order_release);
  ctl->magic = kMagic;
}

void open_existing(Segment& seg, int size, uint64_t nonce) {
  const int fd = shm_open(seg.name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    sys_error("cannot open /dev/shm" + seg.name + " created by rank 0 (ranks must share one "
              "host and one /dev/shm)", errno);
  }
  struct stat st{};
  fstat(fd, &st);
  seg.bytes = static_cast<size_t>(st.st_size);
  map(seg, fd);
  const auto* ctl = reinterpret_cast<const Control*>(seg.base);
  TORCH_CHECK(ctl->magic == kMagic && ctl->nonce == nonce && ctl->size == size &&
                  Layout(size, ctl->chunk, ctl->p2p_chunk).total == seg.bytes,
              "mockccl: /dev/shm", seg.name, " is not the segment rank 0 created for this group");
}

void register_rank(Segment& seg, int rank, int size) {
  const auto* ctl = reinterpret_cast<const Control*>(seg.base);
  Layout layout(size, ctl->chunk, ctl->p2p_chunk);
  auto* state = reinterpret_cast<RankState*>(seg.base + layout.ranks) + rank;
  state->start_time = process_start_time(getpid());
  state->pid.store(getpid(), std::memory_order_release);
}

// The shared-memory group of `ranks` (the group's ranks on this host, ascending; `rank` is one
// of them). Its first rank creates the segment.
std::unique_ptr<ShmTransport> connect_host(const c10::intrusive_ptr<::c10d::Store>& store,
                                           const std::vector<int>& ranks, int rank, int size,
                                           std::chrono::milliseconds timeout,
                                           accelkit::Runtime* runtime) {
  const int local_size = static_cast<int>(ranks.size());
  const int local_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
  const std::string key = "mockccl/segment/" + std::to_string(ranks[0]);
  Segment seg;
  if (local_rank == 0) {
    const size_t chunk = collective_chunk();
    const size_t p2p_chunk = pair_chunk(local_size);
    const uint64_t nonce = (static_cast<uint64_t>(std::random_device{}()) << 32) |
                           std::random_device{}();
    create(seg, chunk, p2p_chunk, local_size, nonce);
    register_rank(seg, local_rank, local_size);
    store->set(key, to_bytes(seg.name + " " + std::to_string(nonce)));
    std::vector<int> others(ranks.begin() + 1, ranks.end());
    if (!others.empty()) wait_ranks(store, "mapped", others, rank, size, timeout);
    seg.unlink();
  } else {
    try {
      store->wait({key}, timeout);
    } catch (const c10::Error&) {
      C10_THROW_ERROR(DistBackendError,
                      "mockccl: connecting a group of " + std::to_string(size) + " ranks timed out "
                      "after " + std::to_string(timeout.count()) + " ms on rank " +
                      std::to_string(rank) + ": rank " + std::to_string(ranks[0]) +
                      " did not create its host's segment");
    }
    std::istringstream published(to_string(store->get(key)));
    uint64_t nonce = 0;
    published >> seg.name >> nonce;
    open_existing(seg, local_size, nonce);
    register_rank(seg, local_rank, local_size);
    store->set(rank_key("mapped", rank), to_bytes("1"));
  }
  const auto* ctl = reinterpret_cast<const Control*>(seg.base);
  return std::make_unique<ShmTransport>(local_rank, local_size, seg.release(), ctl->chunk,
                                        ctl->p2p_chunk, limits(), runtime, ranks);
}

// A group on one host is one shared-memory group; a group that spans hosts is a shared-memory
// group per host joined over TCP (mockccl_hosts.h).
std::unique_ptr<accelkit::c10d::Transport> connect(const c10::intrusive_ptr<::c10d::Store>& store,
                                                   int rank, int size,
                                                   std::chrono::milliseconds timeout) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "mockccl: invalid rank ", rank,
              " for a group of ", size);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::vector<std::string> hosts = hosts_of(store, rank, size, timeout);
  std::vector<int> mine;
  for (int r = 0; r < size; ++r)
    if (hosts[r] == hosts[rank]) mine.push_back(r);
  if (static_cast<int>(mine.size()) == size) {
    return connect_host(store, mine, rank, size, timeout, accelkit::c10d::device_runtime());
  }
  auto local = connect_host(store, mine, rank, size, timeout, nullptr);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  auto net = std::make_unique<Net>(store, rank, size, hosts,
                                   std::max(left, std::chrono::milliseconds(1)), limits());
  return std::make_unique<HostsTransport>(rank, hosts, std::move(local), std::move(net),
                                          accelkit::c10d::device_runtime());
}

}  // namespace mockccl

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mockccl: the mock device's collective library (shared memory within a host, TCP "
            "between hosts)";
  m.attr("SEGMENT_PREFIX") = std::string("/dev/shm") + mockccl::kSegmentPrefix;
  m.def("segment_bytes", [](int size) {
    TORCH_CHECK(size >= 1, "mockccl: a group has at least one rank, got ", size);
    mockccl::limits();  // every setting checked, as at connect
    return mockccl::Layout(size, mockccl::collective_chunk(), mockccl::pair_chunk(size)).total;
  }, "The bytes of the shared-memory segment a group of `size` ranks maps (current settings).");
  accelkit::c10d::bind_collectives(m, mockccl::kName, mockccl::connect);
}
