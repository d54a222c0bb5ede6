// mockccl's network (mockccl_net.h): connecting a group's ranks over TCP, moving collective bytes
// both ways at once, and framed point-to-point messages.
#include "mockccl_net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include <c10/util/Exception.h>

namespace mockccl {

using accelkit::c10d::CallInfo;

namespace {

constexpr uint32_t kHello = 0x4d43434e;  // a mockccl connection's first word
constexpr int kCollective = 0;
constexpr int kP2P = 1;
constexpr int kSliceMs = 50;  // waits wake at least this often to check abort and the deadline
// A wait that timed out waits this long more for a peer's report of the failure that held it
// up (a rank of another host missing a collective is known only to that host).
constexpr auto kReportGrace = std::chrono::milliseconds(1000);
constexpr const char* kFailedKey = "mockccl/failed";

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t channel;
};

struct Frame {  // a point-to-point message's header
  int32_t tag;
  int32_t reserved;
  uint64_t bytes;
};

[[noreturn]] void sys_error(const std::string& what, int err) {
  C10_THROW_ERROR(DistBackendError, "mockccl: " + what + ": " + std::strerror(err));
}

std::string ntop(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return buf;
}

// The IPv4 address of interface `name`, or "" (with the interfaces there are in `seen`).
std::string interface_address(const char* name, std::string* seen) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) sys_error("cannot list the network interfaces", errno);
  std::string found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const bool up = (i->ifa_flags & IFF_UP) != 0;
    const bool loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    const std::string addr = ntop(*reinterpret_cast<sockaddr_in*>(i->ifa_addr));
    if (seen != nullptr) *seen += (seen->empty() ? "" : ", ") + std::string(i->ifa_name) + " " + addr;
    if (found.empty() && ((name != nullptr && std::strcmp(i->ifa_name, name) == 0) ||
                          (name == nullptr && up && !loopback))) {
      found = addr;
    }
  }
  freeifaddrs(list);
  return found;
}

// The address this host uses to reach `host` (no packet is sent), or "".
std::string address_towards(const char* host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host, "9", &hints, &res) != 0 || res == nullptr) return "";
  std::string found;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) found = ntop(local);
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return found;
}

std::string local_address() {
  const char* ifname = std::getenv("ACCELKIT_MOCKCCL_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    std::string seen;
    const std::string found = interface_address(ifname, &seen);
    TORCH_CHECK(!found.empty(), "mockccl: ACCELKIT_MOCKCCL_SOCKET_IFNAME=", ifname,
                " names no interface with an IPv4 address on this host (there are: ", seen,
                "); set it to the interface the hosts reach each other on");
    return found;
  }
  const char* master = std::getenv("MASTER_ADDR");
  if (master != nullptr && *master != '\0') {
    const std::string found = address_towards(master);
    if (!found.empty()) return found;
  }
  const std::string found = interface_address(nullptr, nullptr);
  TORCH_CHECK(!found.empty(), "mockccl: this host has no network address for a group that spans "
              "hosts (MASTER_ADDR is not set or not reachable, and no interface but loopback "
              "is up); set ACCELKIT_MOCKCCL_SOCKET_IFNAME to the interface the hosts reach each "
              "other on");
  return found;
}

void set_nonblocking(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, kSliceMs));
}

std::string describe(const CallInfo& call) {
  if (call.seq == 0) return call.name;
  return call.name + " (seq " + std::to_string(call.seq) + ")";
}

}  // namespace

Net::Net(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
         const std::vector<std::string>& hosts, std::chrono::milliseconds timeout)
    : store_(store), rank_(rank), size_(size), hosts_(hosts), peers_(new Peer[size]) {
  const auto deadline = Clock::now() + timeout;
  address_ = local_address();
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) sys_error("cannot create a socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, address_.c_str(), &addr.sin_addr);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, SOMAXCONN) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(listener);
    sys_error("cannot listen on " + address_ + " (rank " + std::to_string(rank) + ")", err);
  }
  const std::string where = address_ + " " + std::to_string(ntohs(addr.sin_port));
  store->set("mockccl/net/" + std::to_string(rank), std::vector<uint8_t>(where.begin(), where.end()));
  try {
    // Dial every lower rank (the kernel queues the connection until that rank accepts it), then
    // accept the higher ranks' connections.
    int expected = 0;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const int channels = hosts[p] != hosts[rank] ? 2 : 1;
      if (p > rank) {
        expected += channels;
        continue;
      }
      const std::string key = "mockccl/net/" + std::to_string(p);
      try {
        store->wait({key}, std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::max(deadline - Clock::now(), Clock::duration(1000000))));
      } catch (const c10::Error&) {
        C10_THROW_ERROR(DistBackendError,
                        "mockccl: connecting a group of " + std::to_string(size) + " ranks timed "
                        "out after " + std::to_string(timeout.count()) + " ms on rank " +
                        std::to_string(rank) + ": " + who(p) + " did not publish its address");
      }
      const auto value = store->get(key);
      const std::string peer_where(value.begin(), value.end());
      peers_[p].p2p = dial(p, peer_where, kP2P, deadline, timeout);
      if (channels == 2) peers_[p].collective = dial(p, peer_where, kCollective, deadline, timeout);
    }
    accept_all(listener, expected, deadline, timeout);
  } catch (...) {
    close(listener);
    throw;
  }
  close(listener);
}

Net::~Net() {
  for (int p = 0; p < size_; ++p) {
    if (peers_[p].collective >= 0) close(peers_[p].collective);
    if (peers_[p].p2p >= 0) close(peers_[p].p2p);
  }
}

std::string Net::who(int r) const {
  return "rank " + std::to_string(r) + " (host '" + hosts_[r] + "')";
}

int Net::dial(int peer, const std::string& where, int channel, Clock::time_point deadline,
              std::chrono::milliseconds timeout) {
  std::istringstream in(where);
  std::string host;
  int port = 0;
  in >> host >> port;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  TORCH_CHECK(inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1, "mockccl: ", who(peer),
              " published an address that is not IPv4: '", where, "'");
  for (;;) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) sys_error("cannot create a socket", errno);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const Hello hello{kHello, rank_, channel};
      if (::send(fd, &hello, sizeof(hello), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(hello))) {
        set_nonblocking(fd);
        return fd;
      }
    }
    const int err = errno;
    close(fd);
    if (Clock::now() >= deadline) {
      C10_THROW_ERROR(DistBackendError,
                      "mockccl: rank " + std::to_string(rank_) + " (host '" + hosts_[rank_] +
                          "') cannot connect to " + who(peer) + " at " + host + ":" +
                          std::to_string(port) + " within " + std::to_string(timeout.count()) +
                          " ms: " + std::strerror(err) +
                          " (a firewall between the hosts, or the wrong interface: set "
                          "ACCELKIT_MOCKCCL_SOCKET_IFNAME)");
    }
    usleep(10000);
  }
}

void Net::accept_all(int listener, int expected, Clock::time_point deadline,
                     std::chrono::milliseconds timeout) {
  while (expected > 0) {
    pollfd pfd{listener, POLLIN, 0};
    const int ready = poll(&pfd, 1, remaining_ms(deadline));
    if (ready == 0 && Clock::now() >= deadline) {
      std::ostringstream missing;
      for (int p = rank_ + 1; p < size_; ++p) {
        const bool done = peers_[p].p2p >= 0 && (hosts_[p] == hosts_[rank_] || peers_[p].collective >= 0);
        if (!done) missing << (missing.tellp() > 0 ? ", " : "") << who(p);
      }
      C10_THROW_ERROR(DistBackendError,
                      "mockccl: connecting a group of " + std::to_string(size_) + " ranks timed "
                      "out after " + std::to_string(timeout.count()) + " ms on rank " +
                      std::to_string(rank_) + ": " + missing.str() + " did not connect");
    }
    if (ready <= 0) continue;
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Hello hello{};  // sent right after connecting: wait for it until the deadline
    const auto left = std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    timeval tv{static_cast<time_t>(left / 1000), static_cast<suseconds_t>(left % 1000 * 1000)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const bool ok = ::recv(fd, &hello, sizeof(hello), MSG_WAITALL) == sizeof(hello) &&
                    hello.magic == kHello && hello.rank > rank_ && hello.rank < size_ &&
                    (hello.channel == kP2P || hello.channel == kCollective);
    int* slot = !ok ? nullptr
                    : hello.channel == kP2P ? &peers_[hello.rank].p2p : &peers_[hello.rank].collective;
    if (slot == nullptr || *slot >= 0) {  // not one of this group's ranks: ignore it
      close(fd);
      continue;
    }
    tv = timeval{0, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    set_nonblocking(fd);
    *slot = fd;
    --expected;
  }
}

void Net::check_aborted(const CallInfo& call) const {
  if (!aborted_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(reason_mutex_);
  C10_THROW_ERROR(DistBackendError, "mockccl: " + describe(call) + " on rank " +
                                        std::to_string(rank_) + " aborted: " + reason_);
}

void Net::fail(const std::string& msg) {
  abort(msg);
  C10_THROW_ERROR(DistBackendError, msg);
}

void Net::closed(const CallInfo& call, int peer, int err) {
  check_aborted(call);
  const std::string report = reported();
  if (!report.empty()) {
    fail("mockccl: " + describe(call) + " failed on rank " + std::to_string(rank_) + ": " + report);
  }
  fail("mockccl: " + describe(call) + " failed on rank " + std::to_string(rank_) +
       ": the connection to " + who(peer) + " closed" +
       (err != 0 ? std::string(" (") + std::strerror(err) + ")" : std::string()) +
       " (that rank exited, aborted the group, or failed a collective); the group is unusable");
}

void Net::timed_out(const CallInfo& call, const std::vector<int>& peers,
                    const char* action) {
  for (const auto until = Clock::now() + kReportGrace; Clock::now() < until;) {
    const std::string report = reported();
    if (!report.empty()) {
      fail("mockccl: " + describe(call) + " failed on rank " + std::to_string(rank_) + ": " +
           report);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kSliceMs));
  }
  std::ostringstream msg;
  msg << "mockccl: " << describe(call) << " timed out after " << call.timeout.count()
      << " ms on rank " << rank_ << ": ";
  for (size_t i = 0; i < peers.size(); ++i) msg << (i ? ", " : "") << who(peers[i]);
  msg << " did not " << action << " (a rank skipped the call, or is stuck or slow); the group is "
      "unusable";
  fail(msg.str());
}

void Net::exchange(const CallInfo& call, const std::vector<Io>& sends,
                   const std::vector<Io>& recvs, Clock::time_point deadline) {
  struct Pending {
    int peer;
    int fd;
    const char* out = nullptr;  // bytes still to write
    size_t out_left = 0;
    char* in = nullptr;  // bytes still to read
    size_t in_left = 0;
  };
  std::vector<Pending> pending;
  auto entry = [&](int peer) -> Pending& {
    for (auto& p : pending)
      if (p.peer == peer) return p;
    TORCH_INTERNAL_ASSERT(peers_[peer].collective >= 0, "mockccl: no collective connection to ",
                          who(peer));
    pending.push_back({peer, peers_[peer].collective});
    return pending.back();
  };
  for (const auto& s : sends) {
    Pending& p = entry(s.peer);
    TORCH_INTERNAL_ASSERT(p.out_left == 0, "mockccl: two sends to one peer in one exchange");
    p.out = s.data, p.out_left = s.bytes;
  }
  for (const auto& r : recvs) {
    Pending& p = entry(r.peer);
    TORCH_INTERNAL_ASSERT(p.in_left == 0, "mockccl: two receives from one peer in one exchange");
    p.in = r.data, p.in_left = r.bytes;
  }
  std::vector<pollfd> fds;
  for (;;) {
    check_aborted(call);
    fds.clear();
    for (const auto& p : pending) {
      const short events = (p.out_left > 0 ? POLLOUT : 0) | (p.in_left > 0 ? POLLIN : 0);
      if (events != 0) fds.push_back({p.fd, events, 0});
    }
    if (fds.empty()) return;
    const int ready = poll(fds.data(), fds.size(), remaining_ms(deadline));
    if (ready < 0 && errno != EINTR) sys_error("poll failed", errno);
    if (ready <= 0) {
      if (Clock::now() >= deadline) {
        std::vector<int> late;
        for (const auto& p : pending)
          if (p.out_left > 0 || p.in_left > 0) late.push_back(p.peer);
        timed_out(call, late, "send or receive its part");
      }
      continue;
    }
    size_t k = 0;
    for (auto& p : pending) {
      if (p.out_left == 0 && p.in_left == 0) continue;
      const pollfd& f = fds[k++];
      if (f.revents == 0) continue;
      if (p.in_left > 0 && (f.revents & (POLLIN | POLLHUP | POLLERR))) {
        const ssize_t n = ::recv(p.fd, p.in, p.in_left, 0);
        if (n == 0) closed(call, p.peer, 0);
        if (n < 0 && errno != EAGAIN && errno != EINTR) closed(call, p.peer, errno);
        if (n > 0) p.in += n, p.in_left -= static_cast<size_t>(n);
      }
      if (p.out_left > 0 && (f.revents & (POLLOUT | POLLHUP | POLLERR))) {
        const ssize_t n = ::send(p.fd, p.out, p.out_left, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) closed(call, p.peer, errno);
        if (n > 0) p.out += n, p.out_left -= static_cast<size_t>(n);
      }
    }
  }
}

void Net::read_all(const CallInfo& call, int peer, int fd, char* p, size_t bytes,
                   Clock::time_point deadline, const char* action) {
  while (bytes > 0) {
    check_aborted(call);
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n > 0) {
      p += n, bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) closed(call, peer, 0);
    if (errno != EAGAIN && errno != EINTR) closed(call, peer, errno);
    pollfd f{fd, POLLIN, 0};
    if (poll(&f, 1, remaining_ms(deadline)) == 0 && Clock::now() >= deadline) {
      timed_out(call, {peer}, action);
    }
  }
}

void Net::write_all(const CallInfo& call, int peer, int fd, const char* p, size_t bytes,
                    Clock::time_point deadline, const char* action) {
  while (bytes > 0) {
    check_aborted(call);
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n, bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) closed(call, peer, errno);
    pollfd f{fd, POLLOUT, 0};
    if (poll(&f, 1, remaining_ms(deadline)) == 0 && Clock::now() >= deadline) {
      timed_out(call, {peer}, action);
    }
  }
}

void Net::send(const CallInfo& call, const void* buf, size_t bytes, int peer, int tag) {
  check_aborted(call);
  const auto deadline = Clock::now() + call.timeout;
  std::lock_guard<std::mutex> lock(peers_[peer].send_mutex);
  const Frame frame{tag, 0, bytes};
  const int fd = peers_[peer].p2p;
  write_all(call, peer, fd, reinterpret_cast<const char*>(&frame), sizeof(frame), deadline,
            "receive (recv) what it sends");
  write_all(call, peer, fd, static_cast<const char*>(buf), bytes, deadline,
            "receive (recv) what it sends");
}

void Net::recv(const CallInfo& call, void* buf, size_t bytes, int peer, int tag) {
  const auto deadline = Clock::now() + call.timeout;
  const int fd = peers_[peer].p2p;
  for (;;) {
    check_aborted(call);
    {
      std::unique_lock<std::mutex> claim(peers_[peer].claim, std::try_to_lock);
      if (claim.owns_lock()) {
        if (take_kept(call, peer, tag, buf, bytes)) return;
        pollfd f{fd, POLLIN, 0};
        if (poll(&f, 1, 0) > 0 && take(call, peer, tag, buf, bytes, deadline)) return;
      }
    }
    pollfd f{fd, POLLIN, 0};
    // Short waits: a receive on another thread may take this peer's next message and keep it
    // for this tag, which no poll would announce.
    if (poll(&f, 1, std::min(remaining_ms(deadline), 5)) == 0 && Clock::now() >= deadline) {
      timed_out(call, {peer}, "send");
    }
  }
}

int Net::recv_any(const CallInfo& call, void* buf, size_t bytes, int tag) {
  const auto deadline = Clock::now() + call.timeout;
  std::vector<pollfd> fds;
  std::vector<int> others;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    fds.push_back({peers_[p].p2p, POLLIN, 0});
    others.push_back(p);
  }
  for (;;) {
    check_aborted(call);
    for (int p : others) {
      std::unique_lock<std::mutex> claim(peers_[p].claim, std::try_to_lock);
      if (claim.owns_lock() && take_kept(call, p, tag, buf, bytes)) return p;
    }
    const int ready = poll(fds.data(), fds.size(), std::min(remaining_ms(deadline), 5));
    if (ready > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const int p = others[i];
        std::unique_lock<std::mutex> claim(peers_[p].claim, std::try_to_lock);
        if (!claim.owns_lock()) continue;
        pollfd f{fds[i].fd, POLLIN, 0};
        if (poll(&f, 1, 0) > 0 && take(call, p, tag, buf, bytes, deadline)) return p;
      }
    } else if (Clock::now() >= deadline) {
      timed_out(call, others, "send");
    }
  }
}

bool Net::take_kept(const CallInfo& call, int peer, int tag, void* buf, size_t bytes) {
  auto& kept = peers_[peer].kept;
  auto it = std::find_if(kept.begin(), kept.end(), [&](const Kept& k) { return k.tag == tag; });
  if (it == kept.end()) return false;
  check_size(call, peer, tag, bytes, it->bytes.size());
  std::memcpy(buf, it->bytes.data(), bytes);
  kept.erase(it);
  return true;
}

bool Net::take(const CallInfo& call, int peer, int tag, void* buf, size_t bytes,
               Clock::time_point deadline) {
  const int fd = peers_[peer].p2p;
  Frame frame{};
  read_all(call, peer, fd, reinterpret_cast<char*>(&frame), sizeof(frame), deadline, "send");
  if (frame.tag == tag && frame.bytes == bytes) {
    read_all(call, peer, fd, static_cast<char*>(buf), bytes, deadline, "send");
    return true;
  }
  // Another tag (or the wrong size, which raises below): kept whole, so the connection stays at
  // a message boundary.
  auto& kept = peers_[peer].kept;
  kept.push_back({frame.tag, std::vector<char>(frame.bytes)});
  read_all(call, peer, fd, kept.back().bytes.data(), frame.bytes, deadline, "send");
  if (frame.tag == tag) check_size(call, peer, tag, bytes, frame.bytes);
  return false;
}

void Net::check_size(const CallInfo& call, int peer, int tag, size_t expected,
                     size_t sent) const {
  if (sent == expected) return;
  std::ostringstream msg;
  msg << "mockccl: recv on rank " << rank_ << " expected " << expected << " bytes with tag "
      << tag << " from rank " << peer << ", but rank " << peer << " sent " << sent
      << " bytes with that tag (a send and the recv that takes it must match in size)";
  C10_THROW_ERROR(DistBackendError, msg.str());
}

std::string Net::reported() const {
  try {
    if (!store_->check({kFailedKey})) return "";
    const auto value = store_->get(kFailedKey);
    const std::string text(value.begin(), value.end());
    const auto newline = text.find('\n');
    const int by = std::stoi(text.substr(0, newline));
    if (by == rank_ || by < 0 || by >= size_) return "";
    return who(by) + " aborted the group: " + text.substr(newline + 1);
  } catch (const std::exception&) {
    return "";  // the store is gone too (its process exited)
  }
}

void Net::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    if (!reason_.empty()) return;
    reason_ = reason;
  }
  try {  // the first failure of the group is the one its ranks report
    const std::string text = std::to_string(rank_) + "\n" + reason;
    store_->compareSet(kFailedKey, {}, std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
  }
  aborted_.store(true, std::memory_order_release);
  for (int p = 0; p < size_; ++p) {
    if (peers_[p].collective >= 0) shutdown(peers_[p].collective, SHUT_RDWR);
    if (peers_[p].p2p >= 0) shutdown(peers_[p].p2p, SHUT_RDWR);
  }
}

}  // namespace mockccl
