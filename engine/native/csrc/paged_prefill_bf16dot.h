// Paged prefill attention for bfloat16 where the CPU has AVX512-BF16 (compiled with -march=native: on
// other CPUs this file compiles to nothing and paged_prefill.cpp keeps its float32 path).
//
// The same tasks as paged_prefill.cpp (one per sequence, tile of 16 query tokens and KV head), but both
// products run on bfloat16 pairs with VDPBF16PS, which multiplies two bfloat16 pairs and adds both
// into one float lane: twice the multiply-adds of a float32 FMA per instruction, and no conversion of
// K and V to float. Scores, the online softmax and the P·V accumulator stay float32; P is rounded to
// bfloat16 for the P·V product (as flash attention does in bfloat16).
//
// K and V are first packed once per call (a task then reads a tile with plain vector loads), in the
// layouts the two products want, 64 keys to a tile (the online softmax's per-tile work, a max, a
// rescale of the accumulator, is spread over 64 keys):
//   K tile  [4][dim / 2][16]  uint32: key 16 u + j's elements (2p, 2p+1)  -> 16 scores per instruction
//   V tile  [32][dim]         uint32: keys (2p, 2p+1)'s element d          -> 16 outputs per instruction
// Keys past a sequence's context are zeros (their probability is 0 too).
//
// Measured on an AVX512-BF16 EPYC, 2 threads, SmolLM2-135M's 9 heads over 3 KV heads of 64, one layer,
// against the float32 path of paged_prefill.cpp: 16 prompts of 128 tokens 1.46 ms (1.85), one of 512
// 0.86 ms (1.67), one of 2,048 12.6 ms (25.8). With 16-key tiles (the float32 path's) and the P·V
// accumulator in memory it was 1.62 / 1.32 / 20.6 ms: the accumulator of a row is now held in registers
// across a whole 64-key tile, and rescaled on the way in.
#pragma once

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define TANDEM_PREFILL_BF16DOT 1

#include <immintrin.h>
#include "tensor_api.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "float_types.h"
#include "online_softmax.h"
#include "prefill_tasks.h"

namespace tandem::bf16dot {

constexpr int64_t kLanes = 16;     // floats per vector
constexpr int64_t kKeys = 64;      // keys per tile: 4 vectors of float scores
constexpr int64_t kTileRows = 16;  // query tokens per task
constexpr int64_t kRowBlock = 4;   // query rows scored together: 4 x 4 accumulators share each K load

using Shape = PrefillShape;

struct Task {
  int64_t seq, first_row, rows, first_pos, kv, first_tile;  // first_tile: its sequence's in the packed buffers
};

// Per-thread scratch, sized once: each row's float P·V accumulator and online softmax state.
struct Scratch {
  std::vector<float> acc, row_max, row_sum;
  Scratch(int64_t rows, int64_t dim) : acc(rows * dim), row_max(rows), row_sum(rows) {}
};

// Packs keys [64 t, 64 t + 64) of one sequence and KV head (zeros past `len`).
inline void pack_tile(const uint16_t* kc, const uint16_t* vc, const int64_t* table, int64_t t, int64_t len,
                      int64_t kv, const Shape& s, uint32_t* kp, uint32_t* vp) {
  const int64_t pairs = s.dim / 2;
  const uint16_t* k[kKeys];
  const uint16_t* v[kKeys];
  for (int64_t j = 0; j < kKeys; ++j) {
    const int64_t pos = t * kKeys + j;
    k[j] = pos < len ? context_row(kc, table, pos, s, kv) : nullptr;
    v[j] = pos < len ? context_row(vc, table, pos, s, kv) : nullptr;
  }
  for (int64_t j = 0; j < kKeys; ++j) {
    uint32_t pair_row[128];  // dim <= 256
    if (k[j] != nullptr) {
      std::memcpy(pair_row, k[j], s.dim * sizeof(uint16_t));
    } else {
      std::memset(pair_row, 0, s.dim * sizeof(uint16_t));
    }
    uint32_t* sub = kp + (j / kLanes) * pairs * kLanes;
    for (int64_t p = 0; p < pairs; ++p) sub[p * kLanes + j % kLanes] = pair_row[p];
  }
  for (int64_t p = 0; p < kKeys / 2; ++p) {  // V: pairs of keys
    const uint16_t* a = v[2 * p];
    const uint16_t* b = v[2 * p + 1];
    uint32_t* out = vp + p * s.dim;
    for (int64_t d = 0; d < s.dim; ++d) {
      const uint32_t lo = a != nullptr ? a[d] : 0, hi = b != nullptr ? b[d] : 0;
      out[d] = lo | (hi << 16);
    }
  }
}

// a[0, dim) = a * alpha + P·V over the tile's first `pairs` key pairs; kDim > 0: dim fixed at compile
// time, the accumulator held in registers across every pair.
template <int64_t kDim>
inline void accumulate_pv(float* a, float alpha, const uint32_t* probs, int64_t pairs, const uint32_t* vp,
                          int64_t dim_arg) {
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  constexpr int64_t kBlocks = kDim > 0 ? kDim / kLanes : 1;
  const __m512 alpha_v = _mm512_set1_ps(alpha);
  if constexpr (kDim > 0) {
    __m512 out[kBlocks];
    for (int64_t b = 0; b < kBlocks; ++b) out[b] = _mm512_mul_ps(_mm512_loadu_ps(a + b * kLanes), alpha_v);
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512bh pp = (__m512bh)_mm512_set1_epi32(static_cast<int>(probs[p]));
      for (int64_t b = 0; b < kBlocks; ++b) {
        out[b] = _mm512_dpbf16_ps(out[b], pp, (__m512bh)_mm512_loadu_si512(vp + p * kDim + b * kLanes));
      }
    }
    for (int64_t b = 0; b < kBlocks; ++b) _mm512_storeu_ps(a + b * kLanes, out[b]);
  } else {
    for (int64_t d = 0; d < dim; d += kLanes) {
      __m512 out = _mm512_mul_ps(_mm512_loadu_ps(a + d), alpha_v);
      for (int64_t p = 0; p < pairs; ++p) {
        const __m512bh v = (__m512bh)_mm512_loadu_si512(vp + p * dim + d);
        out = _mm512_dpbf16_ps(out, (__m512bh)_mm512_set1_epi32(static_cast<int>(probs[p])), v);
      }
      _mm512_storeu_ps(a + d, out);
    }
  }
}

// kRows query rows from `r0` against one packed tile: scores, online softmax, then P·V into `acc`.
template <int64_t kRows, int64_t kDim>
inline void score_rows(const uint32_t* const* q, const uint32_t* kp, const uint32_t* vp, int64_t r0,
                       const Task& task, int64_t group, int64_t first_key, int64_t n, int64_t dim, float scale,
                       float* acc, float* row_max, float* row_sum) {
  constexpr int64_t kSubs = kKeys / kLanes;
  const int64_t pairs = (kDim > 0 ? kDim : dim) / 2;
  __m512 s[kRows][kSubs];
  for (int64_t i = 0; i < kRows; ++i)
    for (int64_t u = 0; u < kSubs; ++u) s[i][u] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh k[kSubs];
    for (int64_t u = 0; u < kSubs; ++u) k[u] = (__m512bh)_mm512_loadu_si512(kp + (u * pairs + p) * kLanes);
    for (int64_t i = 0; i < kRows; ++i) {
      const __m512bh qp = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[r0 + i][p]));
      for (int64_t u = 0; u < kSubs; ++u) s[i][u] = _mm512_dpbf16_ps(s[i][u], qp, k[u]);
    }
  }
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < kRows; ++i) {
    const int64_t r = r0 + i;
    const int64_t visible = std::min(n, task.first_pos + r / group + 1 - first_key);
    if (visible <= 0) continue;
    alignas(64) float scores[kKeys];
    for (int64_t u = 0; u < kSubs; ++u) _mm512_store_ps(scores + u * kLanes, _mm512_mul_ps(s[i][u], scale_v));
    const float alpha = softmax_step(scores, kKeys, visible, row_max[r], row_sum[r]);
    alignas(64) uint32_t probs[kKeys / 2];  // P as bfloat16 pairs
    for (int64_t u = 0; u < kSubs; ++u) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(probs + u * kLanes / 2),
                         (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(scores + u * kLanes)));
    }
    accumulate_pv<kDim>(acc + r * dim, alpha, probs, (visible + 1) / 2, vp, dim);
  }
}

template <int64_t kDim>
void attend(const uint16_t* query, const uint32_t* packed_k, const uint32_t* packed_v, const Task& task,
            const Shape& shape, float scale, uint16_t* out, Scratch& scratch) {
  const int64_t dim = kDim > 0 ? kDim : shape.dim, group = shape.num_heads / shape.num_kv_heads;
  const int64_t rows = task.rows * group;  // row r: token r / group, head kv * group + r % group
  const int64_t token_stride = shape.num_heads * dim, tile_words = kKeys * dim / 2;
  const uint32_t* q[kTileRows * 64];  // rows <= 16 tokens x a group of at most 64 heads
  float* acc = scratch.acc.data();
  float* row_max = scratch.row_max.data();
  float* row_sum = scratch.row_sum.data();
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* row = query + (task.first_row + r / group) * token_stride + (task.kv * group + r % group) * dim;
    q[r] = reinterpret_cast<const uint32_t*>(row);  // bfloat16 pairs; rows are 4-byte aligned (dim is even)
    std::fill(acc + r * dim, acc + (r + 1) * dim, 0.f);
    row_max[r] = -std::numeric_limits<float>::infinity();
    row_sum[r] = 0.f;
  }
  const int64_t last_pos = task.first_pos + task.rows - 1;
  for (int64_t t = 0; t * kKeys <= last_pos; ++t) {
    const int64_t first_key = t * kKeys, n = std::min(kKeys, last_pos + 1 - first_key);
    const int64_t at = ((task.first_tile + t) * shape.num_kv_heads + task.kv) * tile_words;
    const uint32_t* kp = packed_k + at;
    const uint32_t* vp = packed_v + at;
    int64_t r = 0;
    for (; r + kRowBlock <= rows; r += kRowBlock) {
      score_rows<kRowBlock, kDim>(q, kp, vp, r, task, group, first_key, n, dim, scale, acc, row_max, row_sum);
    }
    for (; r < rows; ++r) {
      score_rows<1, kDim>(q, kp, vp, r, task, group, first_key, n, dim, scale, acc, row_max, row_sum);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* o = out + (task.first_row + r / group) * token_stride + (task.kv * group + r % group) * dim;
    const float inv = 1.f / row_sum[r];
    for (int64_t d = 0; d < dim; ++d) o[d] = float_to_bf16_bits(acc[r * dim + d] * inv);
  }
}

// Whether this path takes a head_dim (the V tile's vector loads go 16 floats of dim at a time).
inline bool supports(int64_t dim, int64_t group) { return dim % 32 == 0 && dim <= 256 && group <= 64; }

// q/out [tokens, heads, dim], caches [blocks, block_size, kv heads, dim]: bfloat16 bits.
inline void run(const uint16_t* q, const uint16_t* kc, const uint16_t* vc, const int64_t* tables,
                const int32_t* lens, const int32_t* starts, const int64_t* seqs, int64_t num_seqs, const Shape& shape,
                float scale, uint16_t* out) {
  std::vector<int64_t> first_tile;  // per entry of `seqs`: where its packed tiles start
  std::vector<std::pair<int64_t, int64_t>> tile_of;  // packed tile -> (entry of seqs, tile in its sequence)
  for (int64_t i = 0; i < num_seqs; ++i) {
    first_tile.push_back(static_cast<int64_t>(tile_of.size()));
    for (int64_t t = 0; t * kKeys < lens[seqs[i]]; ++t) tile_of.emplace_back(i, t);
  }
  const int64_t tiles = static_cast<int64_t>(tile_of.size());
  const int64_t kv_heads = shape.num_kv_heads, tile_words = kKeys * shape.dim / 2;
  std::vector<uint32_t> packed_k(tiles * kv_heads * tile_words), packed_v(packed_k.size());
  // Pack: one item per (packed tile, KV head).
  at::parallel_for(0, tiles * kv_heads, 16, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const auto [i, t] = tile_of[item / kv_heads];
      const int64_t kv = item % kv_heads, s = seqs[i];
      const int64_t at = item * tile_words;
      pack_tile(kc, vc, tables + s * shape.max_blocks, t, lens[s], kv, shape, packed_k.data() + at,
                packed_v.data() + at);
    }
  });
  std::vector<Task> tasks;
  for_each_prefill_task(lens, starts, seqs, num_seqs, kv_heads, kTileRows,
                        [&](int64_t i, int64_t s, int64_t first_row, int64_t rows, int64_t first_pos, int64_t kv) {
                          tasks.push_back({s, first_row, rows, first_pos, kv, first_tile[i]});
                        });
  const int64_t scratch_rows = kTileRows * (shape.num_heads / shape.num_kv_heads);
  const auto fn = shape.dim == 64 ? attend<64> : shape.dim == 128 ? attend<128> : attend<0>;
  run_round_robin(
      static_cast<int64_t>(tasks.size()), [&] { return Scratch(scratch_rows, shape.dim); },
      [&](int64_t i, Scratch& scratch) { fn(q, packed_k.data(), packed_v.data(), tasks[i], shape, scale, out, scratch); });
}

}  // namespace tandem::bf16dot

#endif
