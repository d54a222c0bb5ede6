// mockccl's network (mockccl_net.h): admitting a group's ranks over TCP, moving collective bytes
// both ways at once, framed point-to-point messages, and failing promptly.
#include "mockccl_net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>

#include <c10/util/Exception.h>

namespace mockccl {

using accelkit::c10d::CallInfo;

// -- The store, from the failure paths ----------------------------------------------------------

// Reads and writes of the group's store that the failure paths make. The store's host may be
// the one that failed (frozen, cut off), so they run on a thread of their own (started on first
// use) and every caller waits for them at most the time it chose. A thread still blocked in
// the store when the Net goes is left to finish on its own; it holds what it uses.
class Reports {
 public:
  explicit Reports(const c10::intrusive_ptr<::c10d::Store>& store, int rank)
      : state_(std::make_shared<State>(store)), rank_(rank) {}

  ~Reports() {
    bool blocked = false;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
      blocked = state_->busy;
    }
    state_->cv.notify_all();
    if (thread_.joinable()) blocked ? thread_.detach() : thread_.join();
  }

  // Writes `reason` as the group's first failure, unless one is there; waits at most `wait`.
  void publish(const std::string& reason, std::chrono::milliseconds wait) {
    const std::string text = std::to_string(rank_) + "\n" + reason;
    auto done = std::make_shared<bool>(false);
    std::unique_lock<std::mutex> lock(state_->mutex);
    enqueue(lock, [state = state_, text, done] {
      try {
        state->store->compareSet(kKey, {}, std::vector<uint8_t>(text.begin(), text.end()));
      } catch (const std::exception&) {
      }
      std::lock_guard<std::mutex> l(state->mutex);
      *done = true;
    });
    state_->cv.wait_for(lock, wait, [&] { return *done; });
  }

  // The group's first failure as the store holds it: (rank, reason), rank -1 when there is none
  // or the store did not answer within `wait`. One read is in flight at a time: callers that
  // come while it runs wait for its answer.
  std::pair<int, std::string> first_failure(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->reading) {
      state_->reading = true;
      enqueue(lock, [state = state_] {
        std::string text;
        try {
          if (state->store->check({kKey})) {
            const auto value = state->store->get(kKey);
            text.assign(value.begin(), value.end());
          }
        } catch (const std::exception&) {  // the store is gone too (its process exited)
        }
        std::lock_guard<std::mutex> l(state->mutex);
        state->last = text;
        state->reading = false;
        ++state->reads;
      });
    }
    const uint64_t target = state_->reads + 1;
    if (!state_->cv.wait_for(lock, wait, [&] { return state_->reads >= target; })) return {-1, ""};
    const std::string& text = state_->last;
    const auto newline = text.find('\n');
    if (newline == std::string::npos) return {-1, ""};
    try {
      return {std::stoi(text.substr(0, newline)), text.substr(newline + 1)};
    } catch (const std::exception&) {
      return {-1, ""};
    }
  }

 private:
  static constexpr const char* kKey = "mockccl/failed";

  struct State {
    explicit State(c10::intrusive_ptr<::c10d::Store> s) : store(std::move(s)) {}
    const c10::intrusive_ptr<::c10d::Store> store;
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::function<void()>> tasks;
    bool stop = false;
    bool busy = false;
    bool reading = false;
    uint64_t reads = 0;
    std::string last;
  };

  // Queues `task` (the state's mutex held through `lock`), starting the thread if needed.
  void enqueue(std::unique_lock<std::mutex>& lock, std::function<void()> task) {
    (void)lock;
    state_->tasks.push_back(std::move(task));
    if (!thread_.joinable()) {
      thread_ = std::thread([state = state_] {
        std::unique_lock<std::mutex> l(state->mutex);
        for (;;) {
          state->cv.wait(l, [&] { return state->stop || !state->tasks.empty(); });
          if (state->stop) return;
          auto next = std::move(state->tasks.front());
          state->tasks.pop_front();
          state->busy = true;
          l.unlock();
          next();
          l.lock();
          state->busy = false;
          state->cv.notify_all();
        }
      });
    }
    state_->cv.notify_all();
  }

  std::shared_ptr<State> state_;
  const int rank_;
  std::thread thread_;
};

namespace {

constexpr size_t kMaxWaitingHellos = 64;  // connections admitted at once before their Hello
constexpr size_t kKeptPiece = 1 << 20;    // a kept message grows by this much as bytes arrive
constexpr auto kRetry = std::chrono::milliseconds(50);  // between dials of an unreachable peer
// A creation that takes longer than kLookAfter looks in the store every kLookEvery for another
// rank's failure to create the group.
constexpr auto kLookAfter = std::chrono::milliseconds(1000);
constexpr auto kLookEvery = std::chrono::milliseconds(500);

[[noreturn]] void sys_error(const std::string& what, int err) {
  C10_THROW_ERROR(DistBackendError, "mockccl: " + what + ": " + std::strerror(err));
}

std::string ntop(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return buf;
}

bool loopback(const std::string& address) { return address.rfind("127.", 0) == 0; }

// The IPv4 address of interface `name` (`name` null: the first that is up and not loopback),
// or ""; the interfaces there are, in `seen`.
std::string interface_address(const char* name, std::string* seen) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) sys_error("cannot list the network interfaces", errno);
  std::string found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const bool up = (i->ifa_flags & IFF_UP) != 0;
    const bool is_loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    const std::string addr = ntop(*reinterpret_cast<sockaddr_in*>(i->ifa_addr));
    *seen += (seen->empty() ? "" : ", ") + std::string(i->ifa_name) + " " + addr +
             (up ? "" : " (down)");
    if (found.empty() && ((name != nullptr && std::strcmp(i->ifa_name, name) == 0) ||
                          (name == nullptr && up && !is_loopback && !loopback(addr)))) {
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
  Fd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (fd.open() && connect(fd.get(), res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) == 0) found = ntop(local);
  }
  freeaddrinfo(res);
  return found;
}

sockaddr_in ipv4(const std::string& address, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  return addr;
}

void no_delay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, Net::kSliceMs));
}

std::string describe(const CallInfo& call) {
  if (call.seq == 0) return call.name;
  return call.name + " (seq " + std::to_string(call.seq) + ")";
}

const char* channel_name(wire::Channel c) {
  return c == wire::Channel::kP2P ? "point-to-point" : "collective";
}

wire::Secret random_secret() {
  wire::Secret s{};
  size_t got = 0;
  while (got < s.size()) {
    const ssize_t n = getrandom(s.data() + got, s.size() - got, 0);
    if (n < 0 && errno != EINTR) sys_error("cannot draw the group's secret (getrandom)", errno);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return s;
}

}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string address_for_group() {
  std::string seen;
  const char* ifname = std::getenv("ACCELKIT_MOCKCCL_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    const std::string found = interface_address(ifname, &seen);
    TORCH_CHECK(!found.empty(), "mockccl: ACCELKIT_MOCKCCL_SOCKET_IFNAME=", ifname,
                " names no interface with an IPv4 address on this host (there are: ", seen,
                "); set it to the interface the hosts reach each other on");
    return found;
  }
  std::string tried;
  const char* master = std::getenv("MASTER_ADDR");
  if (master != nullptr && *master != '\0') {
    const std::string found = address_towards(master);
    if (!found.empty() && !loopback(found)) return found;
    tried = found.empty() ? std::string("MASTER_ADDR=") + master + " is not reachable from here"
                          : std::string("MASTER_ADDR=") + master + " is reached through "
                            "loopback (" + found + ") here: its name or address is this host's "
                            "own, which /etc/hosts may map to 127.0.1.1";
  } else {
    tried = "MASTER_ADDR is not set";
  }
  const std::string found = interface_address(nullptr, &seen);
  TORCH_CHECK(!found.empty(), "mockccl: this host has no network address for a group that "
              "spans hosts: ", tried, ", and no interface but loopback is up (there are: ", seen,
              "); a loopback address would name each host itself. Set "
              "ACCELKIT_MOCKCCL_SOCKET_IFNAME to the interface the hosts reach each other on (lo "
              "only where every rank runs on this machine)");
  return found;
}

// -- Connecting -----------------------------------------------------------------------------------

Net::Net(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
         const std::vector<std::string>& hosts, std::chrono::milliseconds timeout, Limits limits)
    : rank_(rank),
      size_(size),
      hosts_(hosts),
      limits_(limits),
      addresses_(size),
      peers_(new Peer[size]),
      reports_(new Reports(store, rank)) {
  const auto deadline = Clock::now() + timeout;
  const auto left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::max(deadline - Clock::now(), Clock::duration(std::chrono::milliseconds(1))));
  };
  const auto timed_out = [&](const std::string& what) {
    C10_THROW_ERROR(DistBackendError,
                    "mockccl: connecting a group of " + std::to_string(size) + " ranks timed out "
                    "after " + std::to_string(timeout.count()) + " ms on rank " +
                    std::to_string(rank) + ": " + what);
  };
  const std::string address = address_for_group();  // first: a bad setting fails every rank alike
  // This creation's secret: rank 0 draws it; the others read it (the store is trusted).
  const std::string secret_key = "mockccl/net/secret";
  if (rank == 0) {
    secret_ = random_secret();
    store->set(secret_key, std::vector<uint8_t>(secret_.begin(), secret_.end()));
  } else {
    try {
      store->wait({secret_key}, left());
    } catch (const c10::Error&) {
      timed_out(who(0) + " did not publish the group's secret");
    }
    const auto value = store->get(secret_key);
    TORCH_CHECK(value.size() == secret_.size(), "mockccl: the group's secret in the store has ",
                value.size(), " bytes, not ", secret_.size());
    std::copy(value.begin(), value.end(), secret_.begin());
  }
  Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener.open()) sys_error("cannot create a socket", errno);
  sockaddr_in addr = ipv4(address, 0);
  socklen_t len = sizeof(addr);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener.get(), SOMAXCONN) != 0 ||
      getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    sys_error("cannot listen on " + address + " (rank " + std::to_string(rank) + ")", errno);
  }
  const std::string mine = address + " " + std::to_string(ntohs(addr.sin_port));
  store->set("mockccl/net/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys, where(size);
  for (int p = 0; p < size; ++p) keys.push_back("mockccl/net/" + std::to_string(p));
  try {
    store->wait(keys, left());
  } catch (const c10::Error&) {
    std::ostringstream missing;
    for (int p = 0; p < size; ++p) {
      if (!store->check({keys[p]})) missing << (missing.tellp() > 0 ? ", " : "") << who(p);
    }
    timed_out(missing.str() + " did not publish its address");
  }
  for (int p = 0; p < size; ++p) {
    const auto value = store->get(keys[p]);
    where[p].assign(value.begin(), value.end());
    std::istringstream in(where[p]);
    int port = 0;
    in >> addresses_[p] >> port;
    in_addr parsed{};
    TORCH_CHECK(inet_pton(AF_INET, addresses_[p].c_str(), &parsed) == 1 && port > 0 &&
                    port < 65536,
                "mockccl: ", who(p), " published an address that is not an IPv4 address and a "
                "port: '", where[p], "'");
  }
  connect_all(listener.get(), where, deadline, timeout);
}

Net::~Net() = default;

std::string Net::who(int r) const {
  return "rank " + std::to_string(r) + " (host '" + hosts_[r] + "')";
}

std::string Net::call_on_rank(const CallInfo& call) const {
  return "mockccl: " + describe(call) + " failed on rank " + std::to_string(rank_) + ": ";
}

wire::Hello Net::hello(int self, wire::Channel channel) const {
  wire::Hello h;
  h.channel = channel;
  h.rank = static_cast<uint32_t>(self);
  h.size = static_cast<uint32_t>(size_);
  h.secret = secret_;
  return h;
}

namespace {

// A connection this rank makes to a lower rank.
struct Dial {
  int peer;
  wire::Channel channel;
  Fd fd;
  enum { kIdle, kConnecting, kAnswer, kDone } state = kIdle;
  Clock::time_point retry_at{};
  uint8_t answer[wire::kHelloBytes];
  size_t got = 0;
  std::string last_error;
};

// A connection a higher rank (or anybody) made to this one, before its Hello.
struct Arrival {
  Fd fd;
  std::string from;
  Clock::time_point until;
  uint8_t hello[wire::kHelloBytes];
  size_t got = 0;
};

}  // namespace

void Net::connect_all(int listener, const std::vector<std::string>& where,
                      Clock::time_point deadline, std::chrono::milliseconds timeout) {
  std::vector<Dial> dials;
  for (int p = 0; p < rank_; ++p) {
    dials.push_back({p, wire::Channel::kP2P});
    if (hosts_[p] != hosts_[rank_]) dials.push_back({p, wire::Channel::kCollective});
  }
  std::vector<Arrival> arrivals;
  std::vector<std::string> refused;  // what the listener turned away, for the timeout's message
  const auto refuse = [&](const std::string& from, const std::string& why) {
    if (refused.size() < 8) refused.push_back("a connection from " + from + " (" + why + ")");
  };
  const auto wanted = [&](int p, wire::Channel c) {
    return p > rank_ && p < size_ &&
           (c == wire::Channel::kP2P || hosts_[p] != hosts_[rank_]);
  };
  const auto slot = [&](int p, wire::Channel c) -> Fd& {
    return c == wire::Channel::kP2P ? peers_[p].p2p : peers_[p].collective;
  };
  const auto accepted_all = [&] {
    for (int p = rank_ + 1; p < size_; ++p) {
      if (!peers_[p].p2p.open() || (wanted(p, wire::Channel::kCollective) &&
                                    !peers_[p].collective.open())) {
        return false;
      }
    }
    return true;
  };
  const auto failed_here = [&](const std::string& msg) {
    return "mockccl: connecting a group of " + std::to_string(size_) + " ranks failed on rank " +
           std::to_string(rank_) + ": " + msg;
  };
  // A failure ends this rank's creation and, through the store, the others' (their dials and
  // accepts would otherwise wait for this rank until the deadline).
  const auto fatal = [&](const std::string& msg) {
    const std::string text = failed_here(msg);
    reports_->publish(text, kPublishWait);
    C10_THROW_ERROR(DistBackendError, text);
  };
  auto next_look = Clock::now() + kLookAfter;
  const auto look_for_failures = [&] {
    const auto [by, reason] = reports_->first_failure(std::chrono::milliseconds(20));
    if (by >= 0 && by < size_ && by != rank_) {
      C10_THROW_ERROR(DistBackendError, failed_here(who(by) + " failed: " + reason));
    }
    next_look = Clock::now() + kLookEvery;
  };
  const std::string& self = addresses_[rank_];

  // Starts (or restarts) dial `d`: a non-blocking connect from this rank's own address.
  const auto start = [&](Dial& d) {
    d.fd = Fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!d.fd.open()) sys_error("cannot create a socket", errno);
    no_delay(d.fd.get());
    sockaddr_in from = ipv4(self, 0);
    if (bind(d.fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
      sys_error("cannot bind a socket to " + self + " (rank " + std::to_string(rank_) + ")", errno);
    }
    std::istringstream in(where[d.peer]);
    std::string host;
    int port = 0;
    in >> host >> port;
    const sockaddr_in to = ipv4(host, port);
    if (connect(d.fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0 ||
        errno == EINPROGRESS) {
      d.state = Dial::kConnecting;
      return;
    }
    d.last_error = std::strerror(errno);
    d.fd.reset();
    d.state = Dial::kIdle;
    d.retry_at = Clock::now() + kRetry;
  };
  const auto retry = [&](Dial& d, const std::string& why) {
    look_for_failures();  // a peer that refused it may have failed
    d.last_error = why;
    d.fd.reset();
    d.got = 0;
    d.state = Dial::kIdle;
    d.retry_at = Clock::now() + kRetry;
  };

  std::vector<pollfd> fds;
  for (;;) {
    const auto now = Clock::now();
    const bool dialed = std::all_of(dials.begin(), dials.end(),
                                    [](const Dial& d) { return d.state == Dial::kDone; });
    if (dialed && accepted_all()) return;
    if (now >= deadline) {
      std::ostringstream msg;
      for (const Dial& d : dials) {
        if (d.state == Dial::kDone) continue;
        msg << (msg.tellp() > 0 ? "; " : "") << "its " << channel_name(d.channel)
            << " connection to " << who(d.peer) << " at " << where[d.peer] << " did not complete"
            << (d.last_error.empty() ? "" : " (" + d.last_error + ")");
      }
      for (int p = rank_ + 1; p < size_; ++p) {
        for (auto c : {wire::Channel::kP2P, wire::Channel::kCollective}) {
          if (wanted(p, c) && !slot(p, c).open()) {
            msg << (msg.tellp() > 0 ? "; " : "") << who(p) << " did not connect its "
                << channel_name(c) << " connection";
          }
        }
      }
      msg << " (a firewall between the hosts, or the wrong interface: set "
             "ACCELKIT_MOCKCCL_SOCKET_IFNAME)";
      if (!refused.empty()) {
        msg << "; refused meanwhile:";
        for (const auto& r : refused) msg << " " << r << ";";
      }
      C10_THROW_ERROR(DistBackendError,
                      "mockccl: connecting a group of " + std::to_string(size_) + " ranks timed "
                      "out after " + std::to_string(timeout.count()) + " ms on rank " +
                      std::to_string(rank_) + ": " + msg.str());
    }
    if (now >= next_look) look_for_failures();
    for (Dial& d : dials) {
      if (d.state == Dial::kIdle && now >= d.retry_at) start(d);
    }
    for (auto it = arrivals.begin(); it != arrivals.end();) {
      if (now >= it->until) {
        refuse(it->from, "it sent no handshake within " +
                             std::to_string(kHelloWait.count()) + " ms");
        it = arrivals.erase(it);
      } else {
        ++it;
      }
    }
    // One poll over the listener, every dial and every arrival.
    fds.clear();
    fds.push_back({listener, POLLIN, 0});
    for (const Dial& d : dials) {
      const short events = d.state == Dial::kConnecting ? POLLOUT
                           : d.state == Dial::kAnswer   ? POLLIN
                                                        : 0;
      fds.push_back({events != 0 ? d.fd.get() : -1, events, 0});
    }
    for (const Arrival& a : arrivals) fds.push_back({a.fd.get(), POLLIN, 0});
    if (poll(fds.data(), fds.size(), remaining_ms(deadline)) < 0 && errno != EINTR) {
      sys_error("poll failed", errno);
    }
    // Dials.
    for (size_t i = 0; i < dials.size(); ++i) {
      Dial& d = dials[i];
      const short revents = fds[1 + i].revents;
      if (revents == 0) continue;
      if (d.state == Dial::kConnecting) {
        int err = 0;
        socklen_t elen = sizeof(err);
        getsockopt(d.fd.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
        if (err != 0) {
          retry(d, std::strerror(err));
          continue;
        }
        uint8_t out[wire::kHelloBytes];
        wire::encode(hello(rank_, d.channel), out);
        if (::send(d.fd.get(), out, sizeof(out), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(out))) {
          retry(d, errno != 0 ? std::strerror(errno) : "short write");
          continue;
        }
        d.state = Dial::kAnswer;
      } else if (d.state == Dial::kAnswer) {
        const ssize_t n = ::recv(d.fd.get(), d.answer + d.got, sizeof(d.answer) - d.got, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          // Turned away: the listener refused this connection (it says why in its own error)
          // or went away. Dialled again until the deadline.
          retry(d, who(d.peer) + " closed the connection without answering its handshake");
          continue;
        }
        if (n > 0) d.got += static_cast<size_t>(n);
        if (d.got < sizeof(d.answer)) continue;
        wire::Hello h;
        const std::string why = wire::decode(d.answer, &h);
        if (!why.empty() || h.channel != d.channel || h.rank != static_cast<uint32_t>(d.peer) ||
            h.size != static_cast<uint32_t>(size_) || !wire::same_secret(h.secret, secret_)) {
          fatal("the process at " + where[d.peer] + ", the address " + who(d.peer) +
                " published, answered its handshake " +
                (why.empty() ? "as rank " + std::to_string(h.rank) + " of a group of " +
                                   std::to_string(h.size) + " on the " +
                                   channel_name(h.channel) + " channel" +
                                   (wire::same_secret(h.secret, secret_) ? ""
                                                                         : ", without the group's secret")
                             : "with " + why) +
                ": another process holds that address");
        }
        slot(d.peer, d.channel) = std::move(d.fd);
        d.state = Dial::kDone;
      }
    }
    // Arrivals.
    const size_t first_arrival = 1 + dials.size();
    for (size_t i = 0, k = first_arrival; i < arrivals.size(); ++k) {
      Arrival& a = arrivals[i];
      if (fds[k].revents == 0) {
        ++i;
        continue;
      }
      const ssize_t n = ::recv(a.fd.get(), a.hello + a.got, sizeof(a.hello) - a.got, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        refuse(a.from, "it closed before its handshake");
        arrivals.erase(arrivals.begin() + static_cast<long>(i));
        continue;
      }
      if (n > 0) a.got += static_cast<size_t>(n);
      if (a.got < sizeof(a.hello)) {
        ++i;
        continue;
      }
      wire::Hello h;
      std::string why = wire::decode(a.hello, &h);
      if (why.empty() && !wire::same_secret(h.secret, secret_)) {
        why = "wrong secret: not a rank of this creation of the group";
      } else if (why.empty() && (h.size != static_cast<uint32_t>(size_) ||
                                 !wanted(static_cast<int>(h.rank), h.channel))) {
        why = "it claims to be rank " + std::to_string(h.rank) + " of " + std::to_string(h.size) +
              " on the " + channel_name(h.channel) + " channel, which this rank does not accept";
      } else if (why.empty() && a.from != addresses_[h.rank]) {
        why = "it claims to be rank " + std::to_string(h.rank) + ", which published " +
              addresses_[h.rank];
      }
      if (!why.empty()) {
        refuse(a.from, why);
        arrivals.erase(arrivals.begin() + static_cast<long>(i));
        continue;
      }
      const int p = static_cast<int>(h.rank);
      if (slot(p, h.channel).open()) {
        fatal("a second connection claims to be " + who(p) + "'s " + channel_name(h.channel) +
              " connection (from " + a.from + "; the first is connected): two processes hold "
              "this group's secret and claim one rank (a rank started twice, or a process "
              "that read the group's store is posing as it)");
      }
      uint8_t out[wire::kHelloBytes];
      wire::encode(hello(rank_, h.channel), out);
      if (::send(a.fd.get(), out, sizeof(out), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(out))) {
        refuse(a.from, "its handshake could not be answered");
        arrivals.erase(arrivals.begin() + static_cast<long>(i));
        continue;
      }
      slot(p, h.channel) = std::move(a.fd);
      arrivals.erase(arrivals.begin() + static_cast<long>(i));
    }
    // New connections: each gets kHelloWait to say who it is; none holds up the others.
    if (fds[0].revents != 0) {
      for (;;) {
        sockaddr_in from{};
        socklen_t flen = sizeof(from);
        Fd fd(accept4(listener, reinterpret_cast<sockaddr*>(&from), &flen,
                      SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd.open()) break;
        no_delay(fd.get());
        if (arrivals.size() == kMaxWaitingHellos) {
          refuse(arrivals.front().from, "more than " + std::to_string(kMaxWaitingHellos) +
                                            " connections were waiting for their handshake");
          arrivals.erase(arrivals.begin());
        }
        arrivals.push_back({std::move(fd), ntop(from),
                            std::min(Clock::now() + kHelloWait, deadline)});
      }
    }
  }
}

// -- Failing ------------------------------------------------------------------------------------

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

namespace {

// The cause another rank reported, looked for until `grace` passes: "" if none came.
std::string cause(Reports& reports, int rank, int size, std::chrono::milliseconds grace,
                  const std::function<std::string(int)>& who) {
  const auto until = Clock::now() + grace;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    const auto [by, reason] = reports.first_failure(std::max(left, std::chrono::milliseconds(1)));
    if (by >= 0 && by < size && by != rank) return who(by) + " aborted the group: " + reason;
    if (Clock::now() >= until) return "";
    std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(20)));
  }
}

}  // namespace

void Net::closed(const CallInfo& call, int peer, int err) {
  check_aborted(call);
  const std::string report =
      cause(*reports_, rank_, size_, kClosedGrace, [this](int r) { return who(r); });
  if (!report.empty()) fail(call_on_rank(call) + report);
  fail(call_on_rank(call) + "the connection to " + who(peer) + " closed" +
       (err != 0 ? std::string(" (") + std::strerror(err) + ")" : std::string()) +
       " (that rank exited, aborted the group, or failed a collective); the group is unusable");
}

void Net::broken(const CallInfo& call, int peer, const char* channel, const std::string& why) {
  check_aborted(call);
  fail(call_on_rank(call) + who(peer) + " sent " + why + " on its " + channel +
       " connection; the group is unusable");
}

void Net::left(const CallInfo& call, const std::vector<int>& peers, int tag) const {
  std::ostringstream msg;
  msg << "mockccl: " << describe(call) << " on rank " << rank_ << ": ";
  for (size_t i = 0; i < peers.size(); ++i) msg << (i ? ", " : "") << who(peers[i]);
  msg << (peers.size() == 1 ? " has" : " have") << " left the group (shut it down) with no "
      << "message with tag " << tag << " for this receive";
  C10_THROW_ERROR(DistBackendError, msg.str());
}

void Net::timed_out(const CallInfo& call, const std::vector<int>& peers, const char* action) {
  // A rank of another host that missed the collective is known only to that host: its report
  // may be on its way.
  const std::string report =
      cause(*reports_, rank_, size_, kReportGrace, [this](int r) { return who(r); });
  if (!report.empty()) fail(call_on_rank(call) + report);
  std::ostringstream msg;
  msg << "mockccl: " << describe(call) << " timed out after " << call.timeout.count()
      << " ms on rank " << rank_ << ": ";
  for (size_t i = 0; i < peers.size(); ++i) msg << (i ? ", " : "") << who(peers[i]);
  msg << " did not " << action << " (a rank skipped the call, or is stuck or slow); the group is "
      "unusable";
  fail(msg.str());
}

void Net::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    if (!reason_.empty()) return;
    reason_ = reason;
  }
  // First the flag and the connections, so every waiter here and at the peers wakes now; then
  // the store, which may not answer (its host may be the one that failed).
  aborted_.store(true, std::memory_order_release);
  for (int p = 0; p < size_; ++p) {
    if (peers_[p].collective.open()) ::shutdown(peers_[p].collective.get(), SHUT_RDWR);
    if (peers_[p].p2p.open()) ::shutdown(peers_[p].p2p.get(), SHUT_RDWR);
  }
  reports_->publish(reason, kPublishWait);
}

void Net::shutdown() {
  if (failed() || said_goodbye_.exchange(true)) return;
  const auto deadline = Clock::now() + kPublishWait;
  uint8_t frame[wire::kFrameBytes], piece[wire::kPieceBytes];
  const auto self = static_cast<uint32_t>(rank_);
  wire::encode(wire::Frame{wire::Kind::kGoodbye, self, 0, 0}, frame);
  wire::encode(wire::Piece{wire::Kind::kGoodbye, self, 0, 0}, piece);
  // Best effort: a peer that is gone already needs no goodbye.
  const auto say = [&](int fd, const uint8_t* bytes, size_t n) {
    size_t off = 0;
    while (off < n && Clock::now() < deadline) {
      const ssize_t w = ::send(fd, bytes + off, n - off, MSG_NOSIGNAL);
      if (w > 0) {
        off += static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        return;
      } else {
        pollfd f{fd, POLLOUT, 0};
        poll(&f, 1, remaining_ms(deadline));
      }
    }
  };
  for (int p = 0; p < size_; ++p) {
    if (peers_[p].p2p.open()) {
      std::lock_guard<std::mutex> lock(peers_[p].send_mutex);
      say(peers_[p].p2p.get(), frame, sizeof(frame));
    }
    if (peers_[p].collective.open()) say(peers_[p].collective.get(), piece, sizeof(piece));
  }
}

// -- Collectives --------------------------------------------------------------------------------

void Net::exchange(const CallInfo& call, const std::vector<Io>& sends,
                   const std::vector<Io>& recvs, Clock::time_point deadline) {
  struct Pending {
    int peer;
    int fd;
    uint8_t head_out[wire::kPieceBytes];
    size_t head_out_left = 0;
    const char* out = nullptr;  // bytes still to write (after the header)
    size_t out_left = 0;
    uint8_t head_in[wire::kPieceBytes];
    size_t head_in_left = 0;
    char* in = nullptr;  // bytes still to read (after the header)
    size_t in_left = 0;
    size_t in_bytes = 0;  // the message's size
    bool writing() const { return head_out_left > 0 || out_left > 0; }
    bool reading() const { return head_in_left > 0 || in_left > 0; }
  };
  std::vector<Pending> pending;
  auto entry = [&](int peer) -> Pending& {
    for (auto& p : pending)
      if (p.peer == peer) return p;
    TORCH_INTERNAL_ASSERT(peers_[peer].collective.open(), "mockccl: no collective connection to ",
                          who(peer));
    pending.push_back({peer, peers_[peer].collective.get()});
    return pending.back();
  };
  for (const auto& s : sends) {
    Pending& p = entry(s.peer);
    TORCH_INTERNAL_ASSERT(!p.writing(), "mockccl: two sends to one peer in one exchange");
    wire::encode(wire::Piece{wire::Kind::kMessage, static_cast<uint32_t>(rank_),
                             peers_[s.peer].sent++, s.bytes},
                 p.head_out);
    p.head_out_left = sizeof(p.head_out);
    p.out = s.data, p.out_left = s.bytes;
  }
  for (const auto& r : recvs) {
    Pending& p = entry(r.peer);
    TORCH_INTERNAL_ASSERT(!p.reading(), "mockccl: two receives from one peer in one exchange");
    p.head_in_left = sizeof(p.head_in);
    p.in = r.data, p.in_left = r.bytes, p.in_bytes = r.bytes;
  }
  std::vector<pollfd> fds;
  for (;;) {
    check_aborted(call);
    fds.clear();
    for (const auto& p : pending) {
      const short events = (p.writing() ? POLLOUT : 0) | (p.reading() ? POLLIN : 0);
      if (events != 0) fds.push_back({p.fd, events, 0});
    }
    if (fds.empty()) return;
    const int ready = poll(fds.data(), fds.size(), remaining_ms(deadline));
    if (ready < 0 && errno != EINTR) sys_error("poll failed", errno);
    if (ready <= 0) {
      if (Clock::now() >= deadline) {
        std::vector<int> late;
        for (const auto& p : pending)
          if (p.writing() || p.reading()) late.push_back(p.peer);
        timed_out(call, late, "send or receive its part");
      }
      continue;
    }
    size_t k = 0;
    for (auto& p : pending) {
      if (!p.writing() && !p.reading()) continue;
      const pollfd& f = fds[k++];
      if (f.revents == 0) continue;
      if (p.reading() && (f.revents & (POLLIN | POLLHUP | POLLERR))) {
        // The header, then the body: both in one read where they are there.
        iovec iov[2];
        int n_iov = 0;
        if (p.head_in_left > 0) {
          iov[n_iov++] = {p.head_in + sizeof(p.head_in) - p.head_in_left, p.head_in_left};
        }
        if (p.in_left > 0) iov[n_iov++] = {p.in, p.in_left};
        const ssize_t n = ::readv(p.fd, iov, n_iov);
        if (n == 0) closed(call, p.peer, 0);
        if (n < 0 && errno != EAGAIN && errno != EINTR) closed(call, p.peer, errno);
        if (n > 0) {
          size_t got = static_cast<size_t>(n);
          const bool had_head = p.head_in_left == 0;
          const size_t head = std::min(got, p.head_in_left);
          p.head_in_left -= head;
          got -= head;
          p.in += got, p.in_left -= got;
          if (!had_head && p.head_in_left == 0) {
            wire::Piece piece;
            const std::string why =
                wire::decode(p.head_in, &piece, static_cast<uint32_t>(p.peer),
                             peers_[p.peer].received, p.in_bytes);
            if (piece.kind == wire::Kind::kGoodbye && why.empty()) {
              check_aborted(call);
              fail(call_on_rank(call) + who(p.peer) + " has left the group (shut it down) and "
                   "cannot take part; the group is unusable");
            }
            if (!why.empty()) broken(call, p.peer, "collective", why);
            ++peers_[p.peer].received;
          }
        }
      }
      if (p.writing() && (f.revents & (POLLOUT | POLLHUP | POLLERR))) {
        iovec iov[2];
        int n_iov = 0;
        if (p.head_out_left > 0) {
          iov[n_iov++] = {p.head_out + sizeof(p.head_out) - p.head_out_left, p.head_out_left};
        }
        if (p.out_left > 0) iov[n_iov++] = {const_cast<char*>(p.out), p.out_left};
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(n_iov);
        const ssize_t n = ::sendmsg(p.fd, &msg, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) closed(call, p.peer, errno);
        if (n > 0) {
          size_t put = static_cast<size_t>(n);
          const size_t head = std::min(put, p.head_out_left);
          p.head_out_left -= head;
          put -= head;
          p.out += put, p.out_left -= put;
        }
      }
    }
  }
}

// -- Point to point -----------------------------------------------------------------------------

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
  uint8_t frame[wire::kFrameBytes];
  wire::encode(wire::Frame{wire::Kind::kMessage, static_cast<uint32_t>(rank_), tag, bytes}, frame);
  const int fd = peers_[peer].p2p.get();
  write_all(call, peer, fd, reinterpret_cast<const char*>(frame), sizeof(frame), deadline,
            "receive (recv) what it sends");
  write_all(call, peer, fd, static_cast<const char*>(buf), bytes, deadline,
            "receive (recv) what it sends");
}

void Net::recv(const CallInfo& call, void* buf, size_t bytes, int peer, int tag) {
  const auto deadline = Clock::now() + call.timeout;
  const int fd = peers_[peer].p2p.get();
  for (;;) {
    check_aborted(call);
    {
      std::unique_lock<std::mutex> claim(peers_[peer].claim, std::try_to_lock);
      if (claim.owns_lock()) {
        if (take_kept(call, peer, tag, buf, bytes)) return;
        if (peers_[peer].left.load()) left(call, {peer}, tag);
        pollfd f{fd, POLLIN, 0};
        if (poll(&f, 1, 0) > 0 && take(call, peer, tag, buf, bytes, deadline)) return;
        if (peers_[peer].left.load() && !take_kept(call, peer, tag, buf, bytes)) {
          left(call, {peer}, tag);
        }
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
  std::vector<int> others, gone;
  for (;;) {
    check_aborted(call);
    // The peers that have not left: a peer's goodbye takes it out of the running.
    others.clear();
    gone.clear();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      std::unique_lock<std::mutex> claim(peers_[p].claim, std::try_to_lock);
      if (claim.owns_lock() && take_kept(call, p, tag, buf, bytes)) return p;
      (peers_[p].left.load() ? gone : others).push_back(p);
    }
    if (others.empty()) left(call, gone, tag);
    fds.clear();
    for (int p : others) fds.push_back({peers_[p].p2p.get(), POLLIN, 0});
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
  peers_[peer].kept_bytes -= it->bytes.size();
  kept.erase(it);
  return true;
}

bool Net::take(const CallInfo& call, int peer, int tag, void* buf, size_t bytes,
               Clock::time_point deadline) {
  Peer& from = peers_[peer];
  const int fd = from.p2p.get();
  uint8_t head[wire::kFrameBytes];
  read_all(call, peer, fd, reinterpret_cast<char*>(head), sizeof(head), deadline, "send");
  wire::Frame frame;
  const std::string why =
      wire::decode(head, &frame, static_cast<uint32_t>(peer), limits_.max_message);
  if (!why.empty()) broken(call, peer, "point-to-point", why);
  if (frame.kind == wire::Kind::kGoodbye) {
    from.left.store(true);
    return false;
  }
  if (frame.tag == tag && frame.bytes == bytes) {
    read_all(call, peer, fd, static_cast<char*>(buf), bytes, deadline, "send");
    return true;
  }
  // Another tag (or the wrong size, which raises below): kept whole, so the connection stays at
  // a message boundary; its memory is taken as its bytes arrive.
  if (frame.bytes > limits_.kept_bytes - std::min(limits_.kept_bytes, from.kept_bytes)) {
    broken(call, peer, "point-to-point",
           std::to_string(frame.bytes) + " bytes with tag " + std::to_string(frame.tag) +
               " that no receive has asked for, beyond the " +
               std::to_string(limits_.kept_bytes) + " bytes of such messages a peer may have " +
               "waiting (" + std::to_string(from.kept_bytes) + " are; "
               "ACCELKIT_MOCKCCL_KEPT_BYTES)");
  }
  Kept k{frame.tag, {}};
  for (uint64_t off = 0; off < frame.bytes;) {
    const uint64_t n = std::min<uint64_t>(kKeptPiece, frame.bytes - off);
    k.bytes.resize(off + n);
    read_all(call, peer, fd, k.bytes.data() + off, n, deadline, "send");
    off += n;
  }
  from.kept_bytes += frame.bytes;
  from.kept.push_back(std::move(k));
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

}  // namespace mockccl
