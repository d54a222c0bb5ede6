// Counter-based Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11) and the word stream the native random kernels draw from (issue #4).
//
// Stream layout ("offset-exact"): a random op that starts at generator offset `o` gives
// element i the `m` 32-bit words (m = 1, 2 or 4, fixed per kernel and dtype) at word index
// (o + i) * m of the stream of key (seed, variant), where word w is lane (w & 3) of the
// Philox block with counter w >> 2. Element i therefore depends only on (seed, o + i): a
// Shard(0) slice computed at offset o + start equals the same slice of the full op at
// offset o. Each op advances the offset by ceil4(numel), as torch's OffsetBasedRNGTracker
// assumes (torch/distributed/tensor/_random.py).
#pragma once

#include <cstdint>
#include <cstring>

namespace accelkit::philox {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

// Blocks generated per batch: the round loop runs over this many independent counters,
// which the compiler vectorizes (32x32->64 multiplies).
constexpr int kBatch = 16;

// Fill out[0 .. 4*nblocks) with blocks first_block, first_block+1, ... (lane-interleaved).
inline void blocks(uint64_t key, uint64_t first_block, int64_t nblocks, uint32_t* out) {
  const uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int64_t base = 0; base < nblocks; base += kBatch) {
    uint32_t c0[kBatch], c1[kBatch], c2[kBatch], c3[kBatch];
    for (int j = 0; j < kBatch; ++j) {
      const uint64_t ctr = first_block + static_cast<uint64_t>(base + j);
      c0[j] = static_cast<uint32_t>(ctr);
      c1[j] = static_cast<uint32_t>(ctr >> 32);
      c2[j] = 0;
      c3[j] = 0;
    }
    uint32_t a = k0, b = k1;
    for (int round = 0; round < 10; ++round) {
      for (int j = 0; j < kBatch; ++j) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * c0[j];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * c2[j];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ a;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ b;
        c1[j] = static_cast<uint32_t>(p1);
        c3[j] = static_cast<uint32_t>(p0);
        c0[j] = n0;
        c2[j] = n2;
      }
      a += kW0;
      b += kW1;
    }
    const int64_t n = nblocks - base < kBatch ? nblocks - base : kBatch;
    uint32_t* dst = out + 4 * base;
    for (int j = 0; j < n; ++j) {
      dst[4 * j] = c0[j];
      dst[4 * j + 1] = c1[j];
      dst[4 * j + 2] = c2[j];
      dst[4 * j + 3] = c3[j];
    }
  }
}

// Keys of the separate streams: one per words-per-element count, so kernels that consume
// different numbers of words per element never reuse each other's words.
inline uint64_t stream_key(uint64_t seed, int words_per_element) {
  return words_per_element == 1 ? seed
                                : seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(
                                                                      words_per_element));
}

// Call f(i, words) for i in [0, n) where `words` points at the m words of element i of an op
// starting at `offset` (see the header comment). Chunked so the buffer stays in L1.
template <int M, typename F>
inline void for_each_element(uint64_t seed, uint64_t offset, int64_t n, F&& f) {
  static_assert(M == 1 || M == 2 || M == 4, "1, 2 or 4 words per element");
  constexpr int64_t kChunk = 1024;  // elements per chunk
  alignas(64) uint32_t buf[kChunk * M + 4 + 4 * kBatch];
  const uint64_t key = stream_key(seed, M);
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t count = n - start < kChunk ? n - start : kChunk;
    const uint64_t first_word = (offset + static_cast<uint64_t>(start)) * M;
    const uint64_t first_block = first_word >> 2;
    const int skip = static_cast<int>(first_word & 3);
    const int64_t nblocks = (skip + count * M + 3) >> 2;
    blocks(key, first_block, nblocks, buf);
    const uint32_t* words = buf + skip;
    for (int64_t j = 0; j < count; ++j) f(start + j, words + j * M);
  }
}

// Uniform floats from words: [0, 1) with 24 (float) or 53 (double) random bits.
inline float to_unit_float(uint32_t w) { return static_cast<float>(w >> 8) * 0x1.0p-24f; }
inline double to_unit_double(const uint32_t* w) {
  const uint64_t v = (static_cast<uint64_t>(w[0]) << 32) | w[1];
  return static_cast<double>(v >> 11) * 0x1.0p-53;
}
inline uint64_t to_u64(const uint32_t* w) { return (static_cast<uint64_t>(w[0]) << 32) | w[1]; }

}  // namespace accelkit::philox
