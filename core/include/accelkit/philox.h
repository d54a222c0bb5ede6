// Counter-based Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11) and the word stream the native random kernels draw from.
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

// One Philox4x32-10 block: 10 rounds on counter `c` with key `k`, in place (the function the
// Random123 known-answer vectors test).
inline void block(uint32_t c[4], const uint32_t key[2]) {
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    c[1] = static_cast<uint32_t>(p1);
    c[3] = static_cast<uint32_t>(p0);
    c[0] = n0;
    c[2] = n2;
    k0 += kW0;
    k1 += kW1;
  }
}

// Fill out[0 .. 4*nblocks) with blocks first_block, first_block+1, ... (lane-interleaved): the
// block with counter (ctr low word, ctr high word, 0, 0) and key (key low word, key high word).
// Scalar reference; blocks() below uses SSE2/AVX2 when the CPU has them (same values).
inline void blocks_scalar(uint64_t key, uint64_t first_block, int64_t nblocks, uint32_t* out) {
  const uint32_t k[2] = {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint64_t ctr = first_block + static_cast<uint64_t>(b);
    uint32_t* c = out + 4 * b;
    c[0] = static_cast<uint32_t>(ctr);
    c[1] = static_cast<uint32_t>(ctr >> 32);
    c[2] = 0;
    c[3] = 0;
    block(c, k);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ACCELKIT_PHILOX_SIMD 1

// W blocks at once in vector registers; V is __m128i (W=4) or __m256i (W=8).
#define ACCELKIT_PHILOX_SIMD_BODY(V, W, SET1, ADD, XOR, AND, OR, SRLI64, SLLI64, MUL, LOADU,   \
                                  STOREU)                                                     \
  const V m0 = SET1(static_cast<int>(kM0)), m1 = SET1(static_cast<int>(kM1));                 \
  const V lo_mask = SRLI64(SET1(-1), 32);                                                     \
  const V hi_mask = SLLI64(SET1(-1), 32);                                                     \
  const int64_t full = nblocks / W * W;                                                       \
  alignas(32) uint32_t lo[W], hi[W], r0[W], r1[W], r2[W], r3[W];                              \
  for (int64_t base = 0; base < full; base += W) {                                            \
    for (int j = 0; j < W; ++j) {                                                             \
      const uint64_t ctr = first_block + static_cast<uint64_t>(base + j);                     \
      lo[j] = static_cast<uint32_t>(ctr);                                                     \
      hi[j] = static_cast<uint32_t>(ctr >> 32);                                               \
    }                                                                                         \
    V c0 = LOADU(reinterpret_cast<const V*>(lo)), c1 = LOADU(reinterpret_cast<const V*>(hi));  \
    V c2 = SET1(0), c3 = SET1(0);                                                             \
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);          \
    for (int round = 0; round < 10; ++round) {                                                \
      const V pe0 = MUL(c0, m0), po0 = MUL(SRLI64(c0, 32), m0);                               \
      const V pe1 = MUL(c2, m1), po1 = MUL(SRLI64(c2, 32), m1);                               \
      const V lo0 = OR(AND(pe0, lo_mask), SLLI64(po0, 32));                                   \
      const V hi0 = OR(SRLI64(pe0, 32), AND(po0, hi_mask));                                   \
      const V lo1 = OR(AND(pe1, lo_mask), SLLI64(po1, 32));                                   \
      const V hi1 = OR(SRLI64(pe1, 32), AND(po1, hi_mask));                                   \
      const V n0 = XOR(XOR(hi1, c1), SET1(static_cast<int>(k0)));                             \
      const V n2 = XOR(XOR(hi0, c3), SET1(static_cast<int>(k1)));                             \
      c1 = lo1;                                                                               \
      c3 = lo0;                                                                               \
      c0 = n0;                                                                                \
      c2 = n2;                                                                                \
      k0 += kW0;                                                                              \
      k1 += kW1;                                                                              \
    }                                                                                         \
    STOREU(reinterpret_cast<V*>(r0), c0);                                                     \
    STOREU(reinterpret_cast<V*>(r1), c1);                                                     \
    STOREU(reinterpret_cast<V*>(r2), c2);                                                     \
    STOREU(reinterpret_cast<V*>(r3), c3);                                                     \
    uint32_t* dst = out + 4 * base;                                                           \
    for (int j = 0; j < W; ++j) {                                                             \
      dst[4 * j] = r0[j];                                                                     \
      dst[4 * j + 1] = r1[j];                                                                 \
      dst[4 * j + 2] = r2[j];                                                                 \
      dst[4 * j + 3] = r3[j];                                                                 \
    }                                                                                         \
  }                                                                                           \
  blocks_scalar(key, first_block + static_cast<uint64_t>(full), nblocks - full, out + 4 * full);

}  // namespace accelkit::philox
#include <immintrin.h>
namespace accelkit::philox {

__attribute__((target("sse2"))) inline void blocks_sse2(uint64_t key, uint64_t first_block,
                                                        int64_t nblocks, uint32_t* out) {
  ACCELKIT_PHILOX_SIMD_BODY(__m128i, 4, _mm_set1_epi32, _mm_add_epi32, _mm_xor_si128,
                            _mm_and_si128, _mm_or_si128, _mm_srli_epi64, _mm_slli_epi64,
                            _mm_mul_epu32, _mm_loadu_si128, _mm_storeu_si128)
}

__attribute__((target("avx2"))) inline void blocks_avx2(uint64_t key, uint64_t first_block,
                                                        int64_t nblocks, uint32_t* out) {
  ACCELKIT_PHILOX_SIMD_BODY(__m256i, 8, _mm256_set1_epi32, _mm256_add_epi32, _mm256_xor_si256,
                            _mm256_and_si256, _mm256_or_si256, _mm256_srli_epi64,
                            _mm256_slli_epi64, _mm256_mul_epu32, _mm256_loadu_si256,
                            _mm256_storeu_si256)
}
#undef ACCELKIT_PHILOX_SIMD_BODY
#endif

inline void blocks(uint64_t key, uint64_t first_block, int64_t nblocks, uint32_t* out) {
#ifdef ACCELKIT_PHILOX_SIMD
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    blocks_avx2(key, first_block, nblocks, out);
  } else {
    blocks_sse2(key, first_block, nblocks, out);
  }
#else
  blocks_scalar(key, first_block, nblocks, out);
#endif
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
  alignas(64) uint32_t buf[kChunk * M + 8];
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
