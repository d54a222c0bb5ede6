// Fuzz test of mockccl's wire format (backends/mock/csrc/mockccl_wire.h), the only code that
// reads bytes a peer chose: seeded random bytes, bit flips of valid encodings, and every
// encoding cut short and padded with random bytes go through each decoder. No input may crash,
// read past its buffer (built with AddressSanitizer and UndefinedBehaviorSanitizer by
// tests/cpp/test_cpp_layer.py), or decode to a message beyond the receiver's limit or from another
// rank; every valid encoding decodes to what was encoded.
// Usage: wire_fuzz [iterations] [seed]. Prints one line per part and exits 0, or prints the
// first failure and exits 1.
#include "mockccl_wire.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace wire = mockccl::wire;

namespace {

int failures = 0;

void fail(const std::string& what) {
  if (failures++ == 0) std::printf("FAILED: %s\n", what.c_str());
}

// A buffer of exactly n bytes on the heap, so that a read past it is AddressSanitizer's to see.
std::vector<uint8_t> exact(const uint8_t* bytes, size_t n) { return {bytes, bytes + n}; }

constexpr uint64_t kMax = 1 << 20;  // the receiver's largest message, for the frame decoder
constexpr uint32_t kPeer = 3;

// Every decoder on `in` (each reads its fixed size): the invariants of what decodes.
void decode_all(const std::vector<uint8_t>& in) {
  if (in.size() >= wire::kHelloBytes) {
    wire::Hello h;
    const auto buf = exact(in.data(), wire::kHelloBytes);
    if (wire::decode(buf.data(), &h).empty() && h.channel != wire::Channel::kP2P &&
        h.channel != wire::Channel::kCollective) {
      fail("a Hello decoded with an unknown channel");
    }
  }
  if (in.size() >= wire::kFrameBytes) {
    wire::Frame f;
    const auto buf = exact(in.data(), wire::kFrameBytes);
    if (wire::decode(buf.data(), &f, kPeer, kMax).empty()) {
      if (f.bytes > kMax) fail("a frame decoded beyond the limit: " + std::to_string(f.bytes));
      if (f.from != kPeer) fail("a frame decoded from rank " + std::to_string(f.from));
      if (f.kind == wire::Kind::kGoodbye && f.bytes != 0) fail("a goodbye with bytes decoded");
    }
  }
  if (in.size() >= wire::kPieceBytes) {
    wire::Piece p;
    const auto buf = exact(in.data(), wire::kPieceBytes);
    if (wire::decode(buf.data(), &p, kPeer, 7, 4096).empty() && p.kind == wire::Kind::kMessage &&
        (p.from != kPeer || p.counter != 7 || p.bytes != 4096)) {
      fail("a collective header decoded that is not the one expected");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 200000;
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::atol(argv[2])) : 20261203u;
  std::mt19937_64 rng(seed);
  auto byte = [&] { return static_cast<uint8_t>(rng()); };

  // Valid encodings decode to what was encoded.
  for (long i = 0; i < iterations / 10; ++i) {
    wire::Hello h;
    h.channel = rng() & 1 ? wire::Channel::kP2P : wire::Channel::kCollective;
    h.rank = static_cast<uint32_t>(rng());
    h.size = static_cast<uint32_t>(rng());
    for (auto& b : h.secret) b = byte();
    uint8_t hb[wire::kHelloBytes];
    wire::encode(h, hb);
    wire::Hello back;
    if (!wire::decode(hb, &back).empty() || back.channel != h.channel || back.rank != h.rank ||
        back.size != h.size || !wire::same_secret(back.secret, h.secret)) {
      fail("a Hello did not round-trip");
    }
    const wire::Frame f{wire::Kind::kMessage, kPeer, static_cast<int32_t>(rng()), rng() % kMax};
    uint8_t fb[wire::kFrameBytes];
    wire::encode(f, fb);
    wire::Frame fback;
    if (!wire::decode(fb, &fback, kPeer, kMax).empty() || fback.tag != f.tag ||
        fback.bytes != f.bytes) {
      fail("a frame did not round-trip");
    }
    const wire::Piece p{wire::Kind::kMessage, kPeer, 7, 4096};
    uint8_t pb[wire::kPieceBytes];
    wire::encode(p, pb);
    wire::Piece pback;
    if (!wire::decode(pb, &pback, kPeer, 7, 4096).empty()) fail("a piece did not round-trip");
  }
  std::printf("round trips ok\n");

  // Random bytes of random lengths (the decoders read only what their size says).
  for (long i = 0; i < iterations; ++i) {
    std::vector<uint8_t> in(rng() % 64);
    for (auto& b : in) b = byte();
    if (rng() % 4 == 0 && in.size() >= 4) {  // a right magic number now and then
      const uint32_t magic[] = {wire::kHelloMagic, wire::kFrameMagic, wire::kPieceMagic};
      wire::put32(in.data(), magic[rng() % 3]);
    }
    decode_all(in);
  }
  std::printf("random bytes ok\n");

  // Bit flips of valid encodings, and valid encodings cut short then padded with random bytes.
  for (long i = 0; i < iterations; ++i) {
    uint8_t valid[3][32];
    wire::encode(wire::Hello{wire::Channel::kP2P, kPeer, 8, {}}, valid[0]);
    wire::encode(wire::Frame{wire::Kind::kMessage, kPeer, 5, rng() % (2 * kMax)}, valid[1]);
    wire::encode(wire::Piece{wire::Kind::kMessage, kPeer, 7, 4096}, valid[2]);
    const size_t sizes[] = {wire::kHelloBytes, wire::kFrameBytes, wire::kPieceBytes};
    const int which = static_cast<int>(rng() % 3);
    std::vector<uint8_t> in(valid[which], valid[which] + sizes[which]);
    if (rng() & 1) {
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) in[rng() % in.size()] ^= 1 << (rng() % 8);
    } else {
      for (size_t k = rng() % in.size(); k < in.size(); ++k) in[k] = byte();
    }
    decode_all(in);
  }
  std::printf("mutations ok\n");
  return failures == 0 ? 0 : 1;
}
