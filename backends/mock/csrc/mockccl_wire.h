// mockccl's wire format: every byte that crosses a TCP connection between two ranks
// (mockccl_net.h). Fixed sizes, big-endian (network byte order) whatever the hosts' order, a
// version in every handshake; decoding is total: any bytes either decode or give the reason
// they do not, and no size read from the wire is trusted before it is checked against a limit
// the receiver chose. A vendor's library has its own format; what it should keep is this:
// the peer proves it belongs to the group before anything else is read from it, and every
// length is bounded before memory is taken for it.
//
//   Hello    the first bytes each way on a new connection, dialer first (32 bytes):
//              magic u32 | version u16 | channel u16 | rank u32 | size u32 | secret[16]
//            The dialer names itself; the listener answers with its own Hello. The secret is
//            the group's (mockccl_net.h: made by rank 0 for this group's creation, handed out
//            through the group's store).
//   Frame    precedes every point-to-point message (24 bytes):
//              magic u32 | kind u16 | reserved u16 | from u32 | tag i32 | bytes u64
//            kind: a message of `bytes` bytes with `tag`, or goodbye (the peer shut its group
//            down in order: no message follows).
//   Piece    precedes every collective message (32 bytes):
//              magic u32 | kind u16 | reserved u16 | from u32 | reserved u32 | counter u64 |
//              bytes u64
//            counter: the messages sent on this connection before it (each side counts), so a
//            message that was lost, repeated or injected shows; bytes: what the receiver
//            expects (both sides know each message's size: the collective was agreed first).
// `from`, the sender's rank, is checked against the peer the connection was admitted for, so
// a message that comes back to its sender (a reflecting peer or proxy) is refused.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mockccl {

// What a rank lets a peer make it take in, over the wire or through shared memory: a message no
// larger than the largest receive it can post (its device's memory), and at most `kept_bytes`
// of a peer's messages kept for receives not posted yet (ACCELKIT_MOCKCCL_KEPT_BYTES).
struct Limits {
  uint64_t max_message;
  uint64_t kept_bytes;
};

}  // namespace mockccl

namespace mockccl::wire {

constexpr uint32_t kHelloMagic = 0x4d43434e;  // "MCCN"
constexpr uint32_t kFrameMagic = 0x4d434346;  // "MCCF"
constexpr uint32_t kPieceMagic = 0x4d434350;  // "MCCP"
constexpr uint16_t kVersion = 1;
constexpr size_t kSecretBytes = 16;

enum class Channel : uint16_t { kCollective = 0, kP2P = 1 };
enum class Kind : uint16_t { kMessage = 0, kGoodbye = 1 };

using Secret = std::array<uint8_t, kSecretBytes>;

struct Hello {
  Channel channel = Channel::kP2P;
  uint32_t rank = 0;
  uint32_t size = 0;
  Secret secret{};
};
constexpr size_t kHelloBytes = 32;

struct Frame {
  Kind kind = Kind::kMessage;
  uint32_t from = 0;
  int32_t tag = 0;
  uint64_t bytes = 0;
};
constexpr size_t kFrameBytes = 24;

struct Piece {
  Kind kind = Kind::kMessage;
  uint32_t from = 0;
  uint64_t counter = 0;
  uint64_t bytes = 0;
};
constexpr size_t kPieceBytes = 32;

inline void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
inline void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
}
inline uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
inline uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = v << 8 | p[i];
  return v;
}
inline uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | p[i];
  return v;
}

// Compares two secrets in time independent of where they differ.
inline bool same_secret(const Secret& a, const Secret& b) {
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < kSecretBytes; ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

inline void encode(const Hello& h, uint8_t* out) {
  put32(out, kHelloMagic);
  put16(out + 4, kVersion);
  put16(out + 6, static_cast<uint16_t>(h.channel));
  put32(out + 8, h.rank);
  put32(out + 12, h.size);
  for (size_t i = 0; i < kSecretBytes; ++i) out[16 + i] = h.secret[i];
}

// Decodes kHelloBytes bytes; returns "" or why they are not a Hello of this version.
inline std::string decode(const uint8_t* in, Hello* h) {
  if (get32(in) != kHelloMagic) return "not a mockccl handshake (wrong magic number)";
  const uint16_t version = get16(in + 4);
  if (version != kVersion) {
    return "mockccl wire version " + std::to_string(version) + ", this rank speaks " +
           std::to_string(kVersion) + " (every rank must run the same mockccl)";
  }
  const uint16_t channel = get16(in + 6);
  if (channel != static_cast<uint16_t>(Channel::kCollective) &&
      channel != static_cast<uint16_t>(Channel::kP2P)) {
    return "unknown channel " + std::to_string(channel);
  }
  h->channel = static_cast<Channel>(channel);
  h->rank = get32(in + 8);
  h->size = get32(in + 12);
  for (size_t i = 0; i < kSecretBytes; ++i) h->secret[i] = in[16 + i];
  return "";
}

inline void encode(const Frame& f, uint8_t* out) {
  put32(out, kFrameMagic);
  put16(out + 4, static_cast<uint16_t>(f.kind));
  put16(out + 6, 0);
  put32(out + 8, f.from);
  put32(out + 12, static_cast<uint32_t>(f.tag));
  put64(out + 16, f.bytes);
}

// Decodes kFrameBytes bytes; returns "" or why they are not a frame from rank `from`. A
// message's size must be at most `max_bytes` (the largest receive this rank can post).
inline std::string decode(const uint8_t* in, Frame* f, uint32_t from, uint64_t max_bytes) {
  if (get32(in) != kFrameMagic) {
    return "bytes that are not a mockccl message header (wrong magic number)";
  }
  const uint16_t kind = get16(in + 4);
  if (kind != static_cast<uint16_t>(Kind::kMessage) &&
      kind != static_cast<uint16_t>(Kind::kGoodbye)) {
    return "unknown message kind " + std::to_string(kind);
  }
  if (get16(in + 6) != 0) return "a message header with its reserved bits set";
  f->kind = static_cast<Kind>(kind);
  f->from = get32(in + 8);
  f->tag = static_cast<int32_t>(get32(in + 12));
  f->bytes = get64(in + 16);
  if (f->from != from) return "a message from rank " + std::to_string(f->from);
  if (f->kind == Kind::kGoodbye && f->bytes != 0) return "a goodbye that carries bytes";
  if (f->bytes > max_bytes) {
    return "a message of " + std::to_string(f->bytes) + " bytes (tag " + std::to_string(f->tag) +
           "), more than the largest receive this rank can post (" + std::to_string(max_bytes) +
           " bytes: its device's memory)";
  }
  return "";
}

inline void encode(const Piece& p, uint8_t* out) {
  put32(out, kPieceMagic);
  put16(out + 4, static_cast<uint16_t>(p.kind));
  put16(out + 6, 0);
  put32(out + 8, p.from);
  put32(out + 12, 0);
  put64(out + 16, p.counter);
  put64(out + 24, p.bytes);
}

// Decodes kPieceBytes bytes; returns "" or why they are not the collective message expected
// from rank `from`: the `counter`-th on this connection, of `bytes` bytes (a goodbye carries
// neither).
inline std::string decode(const uint8_t* in, Piece* p, uint32_t from, uint64_t counter,
                          uint64_t bytes) {
  if (get32(in) != kPieceMagic) {
    return "bytes that are not a mockccl collective message (wrong magic number)";
  }
  if (get16(in + 6) != 0 || get32(in + 12) != 0) {
    return "a collective message header with its reserved bits set";
  }
  p->from = get32(in + 8);
  if (p->from != from) return "a collective message from rank " + std::to_string(p->from);
  const uint16_t kind = get16(in + 4);
  if (kind == static_cast<uint16_t>(Kind::kGoodbye)) {
    p->kind = Kind::kGoodbye;
    return "";
  }
  if (kind != static_cast<uint16_t>(Kind::kMessage)) {
    return "unknown message kind " + std::to_string(kind);
  }
  p->kind = Kind::kMessage;
  p->counter = get64(in + 16);
  p->bytes = get64(in + 24);
  if (p->counter != counter) {
    return "collective message number " + std::to_string(p->counter) + " where number " +
           std::to_string(counter) + " was due (a message was lost, repeated or injected)";
  }
  if (p->bytes != bytes) {
    return "a collective message of " + std::to_string(p->bytes) + " bytes where " +
           std::to_string(bytes) + " were due";
  }
  return "";
}

}  // namespace mockccl::wire
