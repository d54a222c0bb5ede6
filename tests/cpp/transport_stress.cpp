// Stress test of the mock's shared-memory transport (backends/mock/csrc/mockccl_shm.h and its
// mockccl_*.cpp parts, compiled in; mockccl.cpp, the Python module, and the network between
// hosts are not), with
// threads as ranks in one process so ThreadSanitizer sees every access: each rank maps the
// group's segment on its own (as separate processes do), then
//   rounds   allreduce / reduce_scatter / allgather of counts that straddle a small chunk
//            (many rounds, both slot sets), checked against closed-form sums;
//   claims   rank 1 sends two messages per round to rank 0, which receives them with a
//            recv(1) and a recv_any on two threads at once: each message taken exactly once;
//   tags     rank 1 sends tags 1, 2, 3, 3 per round; rank 0 takes tag 3 twice with recv_any on
//            one thread while another receives tag 2, then tag 1 with recv(1): each buffer
//            gets the message of its tag, tag 3's in sending order;
//   abort    ranks 0-2 wait in an allreduce rank 3 never joins; another thread aborts rank 0's
//            transport: every waiting rank raises within a second.
// Prints one line per part ("rounds ok", ...) and exits 0, or prints the failure and exits 1.
// Built by tests/cpp/test_cpp_layer.py with -fsanitize=thread (TSan reports exit 66).
#include "mockccl_shm.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using accelkit::c10d::CallInfo;
using accelkit::c10d::Kind;
using accelkit::c10d::RedOp;

struct Group {
  int size;
  std::vector<std::unique_ptr<mockccl::ShmTransport>> ranks;

  Group(int n, size_t chunk, size_t p2p_chunk) : size(n) {
    const mockccl::Layout layout(n, chunk, p2p_chunk);
    const int fd = memfd_create("transport_stress", 0);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(layout.total)) != 0) {
      throw std::runtime_error("memfd");
    }
    for (int r = 0; r < n; ++r) {
      void* base = mmap(nullptr, layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) throw std::runtime_error("mmap");
      ranks.push_back(std::make_unique<mockccl::ShmTransport>(
          r, n, static_cast<char*>(base), chunk, p2p_chunk, mockccl::Limits{1 << 30, 1 << 30},
          nullptr));
    }
    close(fd);
  }

  // Run f(rank) on one thread per rank; the first exception text of any rank, or "".
  std::string spmd(const std::function<void(int)>& f) {
    std::vector<std::string> errors(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        try {
          f(r);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < size; ++r) {
      if (!errors[r].empty()) return "rank " + std::to_string(r) + ": " + errors[r];
    }
    return "";
  }
};

CallInfo call(Kind kind, uint64_t seq, int64_t count, RedOp op = RedOp::kNone) {
  CallInfo c;
  c.kind = kind;
  c.name = accelkit::c10d::kind_name(kind);
  c.seq = seq;
  c.dtype = c10::ScalarType::Int;
  c.count = count;
  c.op = op;
  c.timeout = std::chrono::milliseconds(20000);
  return c;
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void rounds() {
  Group g(4, 4096, 1024);  // 1024 ints per round: every count below crosses rounds
  uint64_t seq = 0;
  for (int64_t count : {0, 1, 1023, 1024, 1025, 4099, 20000}) {
    ++seq;
    const std::string err = g.spmd([&](int r) {
      std::vector<int32_t> in(count), out(count, -1);
      for (int64_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(i % 97 + r);
      g.ranks[r]->allreduce(call(Kind::kAllreduce, seq, count, RedOp::kSum), in.data(),
                            out.data());
      for (int64_t i = 0; i < count; ++i) {
        expect(out[i] == 4 * static_cast<int32_t>(i % 97) + 6,
               "allreduce of " + std::to_string(count) + " wrong at " + std::to_string(i));
      }
      std::vector<int32_t> rs_in(4 * count), rs_out(count, -1);
      for (int64_t i = 0; i < 4 * count; ++i) rs_in[i] = static_cast<int32_t>(i % 89);
      g.ranks[r]->reduce_scatter(call(Kind::kReduceScatter, seq, count, RedOp::kSum),
                                 rs_in.data(), rs_out.data());
      for (int64_t i = 0; i < count; ++i) {
        expect(rs_out[i] == 4 * static_cast<int32_t>((r * count + i) % 89),
               "reduce_scatter of " + std::to_string(count) + " wrong at " + std::to_string(i));
      }
      std::vector<int32_t> ag(4 * count, -1);
      g.ranks[r]->allgather(call(Kind::kAllgather, seq, count), in.data(), ag.data());
      for (int p = 0; p < 4; ++p) {
        for (int64_t i = 0; i < count; ++i) {
          expect(ag[p * count + i] == static_cast<int32_t>(i % 97 + p),
                 "allgather of " + std::to_string(count) + " wrong");
        }
      }
    });
    expect(err.empty(), err);
  }
  std::puts("rounds ok");
}

void claims() {
  Group g(2, 4096, 256);  // 64-int p2p chunks: each 300-int message is several chunks
  constexpr int kRounds = 200, kLen = 300;
  const std::string err = g.spmd([&](int r) {
    for (int round = 0; round < kRounds; ++round) {
      if (r == 1) {
        for (int k = 0; k < 2; ++k) {
          std::vector<int32_t> msg(kLen, 2 * round + k);
          g.ranks[1]->send(call(Kind::kSend, 0, kLen), msg.data(), 0, 0);
        }
      } else {
        std::vector<int32_t> a(kLen, -1), b(kLen, -1);
        int source = -1;
        std::thread any([&] { source = g.ranks[0]->recv_any(call(Kind::kRecv, 0, kLen), b.data(), 0); });
        g.ranks[0]->recv(call(Kind::kRecv, 0, kLen), a.data(), 1, 0);
        any.join();
        expect(source == 1, "recv_any source");
        for (int i = 1; i < kLen; ++i) {
          expect(a[i] == a[0] && b[i] == b[0], "a message was split between two receives");
        }
        expect(a[0] != b[0] && a[0] + b[0] == 4 * round + 1,
               "round " + std::to_string(round) + ": got " + std::to_string(a[0]) + " and " +
                   std::to_string(b[0]));
      }
    }
  });
  expect(err.empty(), err);
  std::puts("claims ok");
}

void tags() {
  Group g(2, 4096, 256);
  constexpr int kRounds = 100, kLen = 300;
  const auto value = [](int round, int k) { return 10 * round + k; };  // message k of a round
  const std::string err = g.spmd([&](int r) {
    for (int round = 0; round < kRounds; ++round) {
      if (r == 1) {
        const int sent_tags[] = {1, 2, 3, 3};
        for (int k = 0; k < 4; ++k) {
          std::vector<int32_t> msg(kLen, value(round, k));
          g.ranks[1]->send(call(Kind::kSend, 0, kLen), msg.data(), 0, sent_tags[k]);
        }
        continue;
      }
      std::vector<int32_t> one(kLen, -1), two(kLen, -1), third(kLen, -1), fourth(kLen, -1);
      std::thread any([&] {
        g.ranks[0]->recv_any(call(Kind::kRecv, 0, kLen), third.data(), 3);
        g.ranks[0]->recv_any(call(Kind::kRecv, 0, kLen), fourth.data(), 3);
      });
      g.ranks[0]->recv(call(Kind::kRecv, 0, kLen), two.data(), 1, 2);
      g.ranks[0]->recv(call(Kind::kRecv, 0, kLen), one.data(), 1, 1);
      any.join();
      const std::string at = "round " + std::to_string(round) + ": ";
      expect(one[0] == value(round, 0) && one[kLen - 1] == value(round, 0), at + "tag 1");
      expect(two[0] == value(round, 1) && two[kLen - 1] == value(round, 1), at + "tag 2");
      expect(third[0] == value(round, 2) && fourth[0] == value(round, 3), at + "tag 3 order");
    }
  });
  expect(err.empty(), err);
  std::puts("tags ok");
}

void abort_latency() {
  Group g(4, 4096, 256);
  std::vector<double> seconds(3, -1);
  std::vector<std::string> messages(3);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    g.ranks[0]->abort("the process group was aborted on rank 0 with 1 operation(s) in flight");
  });
  const std::string err = g.spmd([&](int r) {
    if (r == 3) return;  // never joins
    std::vector<int32_t> buf(16, 1);
    const auto start = std::chrono::steady_clock::now();
    try {
      g.ranks[r]->allreduce(call(Kind::kAllreduce, 1, 16, RedOp::kSum), buf.data(), buf.data());
    } catch (const c10::DistBackendError& e) {
      messages[r] = e.what_without_backtrace();
    }
    seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  aborter.join();
  expect(err.empty(), err);
  for (int r = 0; r < 3; ++r) {
    expect(!messages[r].empty(), "rank " + std::to_string(r) + " did not raise");
    expect(messages[r].find("aborted") != std::string::npos, messages[r]);
    expect(seconds[r] < 1.5, "rank " + std::to_string(r) + " took " + std::to_string(seconds[r]));
  }
  std::printf("abort ok (%.3f s)\n", seconds[0]);
}

}  // namespace

int main() {
  try {
    rounds();
    claims();
    tags();
    abort_latency();
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
