// Paged decode attention for CPU: one query token per sequence, K/V read in
// place through the block table (no gather copy). One task per sequence; each
// K/V row serves the whole group of query heads that share its KV head. One
// pass over the context, a block at a time, with an online softmax (running
// max and sum per head). Decode attention reads the whole KV cache every step,
// so it is bound by memory bandwidth: the loops are ordered to stream each
// block front to back. Accumulates in float32.
//
// Shapes:
//   query       [num_seqs, num_heads, head_dim]
//   key_cache   [num_blocks, block_size, num_kv_heads, head_dim]  (value_cache alike)
//   block_table [num_seqs, max_blocks] int64
//   seq_lens    [num_seqs] int32
//   out         [num_seqs, num_heads, head_dim]
#include "tensor_api.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "float_types.h"
#include "online_softmax.h"

namespace {

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kMaxHeads = 256;  // query heads

// A K or V row as float: float rows are used in place, others widened into `buf`.
template <int64_t kDim>
inline const float* as_float(const float* row, int64_t, float*) { return row; }
template <int64_t kDim>
inline const float* as_float(const c10::BFloat16* row, int64_t dim_arg, float* buf) {
  // bfloat16 is the top half of a float32: a shift the compiler vectorises.
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(row);
  uint32_t* out = reinterpret_cast<uint32_t*>(buf);
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) out[d] = static_cast<uint32_t>(raw[d]) << 16;
  return buf;
}

template <typename T>
inline void prefetch_row(const T* k, const T* v, int64_t elements) {
  const char* kb = reinterpret_cast<const char*>(k);
  const char* vb = reinterpret_cast<const char*>(v);
  for (int64_t off = 0; off < elements * int64_t(sizeof(T)); off += 64) {
    __builtin_prefetch(kb + off);
    __builtin_prefetch(vb + off);
  }
}

struct Seq {
  const int64_t* table;  // this sequence's block ids
  int64_t len;           // tokens in context
};

struct Shape {
  int64_t num_heads, num_kv_heads, dim, block_size;
};

// One sequence, every head. Walks each block token by token, every KV head of a
// token row in turn, so the block is read front to back (a stream the hardware
// prefetcher follows) rather than once per KV head at a stride.
// kDim > 0 fixes head_dim at compile time (unrolled, vectorised rows); 0 reads it at run time.
template <typename T, int64_t kDim>
void decode_seq(const T* q, const T* kc, const T* vc, const Seq& seq, const Shape& shape, float scale, T* out,
                float* qf, float* acc, float* scores) {
  // q, out: [num_heads, dim]; qf, acc: [num_heads, dim]; scores: [num_heads, block_size]
  const int64_t dim = kDim > 0 ? kDim : shape.dim;
  const int64_t heads = shape.num_heads, group = heads / shape.num_kv_heads, bs = shape.block_size;
  const int64_t token_stride = shape.num_kv_heads * dim;
  float row_max[kMaxHeads], row_sum[kMaxHeads];
  float buf[kMaxHeadDim];
  for (int64_t i = 0; i < heads * dim; ++i) {
    qf[i] = static_cast<float>(q[i]) * scale;
    acc[i] = 0.f;
  }
  std::fill(row_max, row_max + heads, -std::numeric_limits<float>::infinity());
  std::fill(row_sum, row_sum + heads, 0.f);
  for (int64_t first = 0, b = 0; first < seq.len; first += bs, ++b) {
    const int64_t base = seq.table[b] * bs * token_stride;
    const int64_t n = std::min(bs, seq.len - first);
    // Blocks are scattered, so the prefetcher cannot guess the next one: ask for
    // the next block's K and V rows while this block's dot products run.
    const bool has_next = first + bs < seq.len;
    const int64_t next = has_next ? seq.table[b + 1] * bs * token_stride : 0;
    for (int64_t j = 0; j < n; ++j) {
      if (has_next) prefetch_row(kc + next + j * token_stride, vc + next + j * token_stride, token_stride);
      for (int64_t kv = 0; kv < shape.num_kv_heads; ++kv) {
        const float* k = as_float<kDim>(kc + base + j * token_stride + kv * dim, dim, buf);
        for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
          const float* qh = qf + h * dim;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < dim; ++d) s += qh[d] * k[d];
          scores[h * bs + j] = s;
        }
      }
    }
    // Online softmax: rescale what was accumulated so far to the new running max.
    for (int64_t h = 0; h < heads; ++h) {
      tandem::online_softmax_tile(scores + h * bs, n, n, row_max[h], row_sum[h], acc + h * dim, dim);
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t kv = 0; kv < shape.num_kv_heads; ++kv) {
        const float* v = as_float<kDim>(vc + base + j * token_stride + kv * dim, dim, buf);
        for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
          const float p = scores[h * bs + j];
          float* ah = acc + h * dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) ah[d] += p * v[d];
        }
      }
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    const float inv = 1.f / row_sum[h];
    for (int64_t d = 0; d < dim; ++d) out[h * dim + d] = static_cast<T>(acc[h * dim + d] * inv);
  }
}

template <typename T>
using SeqFn = void (*)(const T*, const T*, const T*, const Seq&, const Shape&, float, T*, float*, float*, float*);

template <typename T>
SeqFn<T> pick(int64_t dim) {
  if (dim == 64) return decode_seq<T, 64>;
  if (dim == 128) return decode_seq<T, 128>;
  return decode_seq<T, 0>;
}

template <typename T>
void run(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
         const at::Tensor& block_table, const at::Tensor& seq_lens, double scale, at::Tensor& out) {
  const Shape shape{query.size(1), key_cache.size(2), query.size(2), key_cache.size(1)};
  const int64_t num_seqs = query.size(0), max_blocks = block_table.size(1);
  const int64_t per_seq = shape.num_heads * shape.dim;
  const T* q = query.data_ptr<T>();
  const T* kc = key_cache.data_ptr<T>();
  const T* vc = value_cache.data_ptr<T>();
  const int64_t* tables = block_table.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  T* o = out.data_ptr<T>();
  const SeqFn<T> fn = pick<T>(shape.dim);
  // Sequences are dealt out round-robin, not in contiguous ranges: the scheduler
  // sorts decodes by length, so a contiguous split would give one thread all the
  // long contexts.
  const int64_t lanes = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_seqs));
  at::parallel_for(0, lanes, 1, [&](int64_t lane_begin, int64_t lane_end) {
    std::vector<float> qf(per_seq), acc(per_seq), scores(shape.num_heads * shape.block_size);
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      for (int64_t s = lane; s < num_seqs; s += lanes) {
        const Seq seq{tables + s * max_blocks, lens[s]};
        fn(q + s * per_seq, kc, vc, seq, shape, static_cast<float>(scale), o + s * per_seq, qf.data(), acc.data(),
           scores.data());
      }
    }
  });
}

}  // namespace

at::Tensor paged_decode_attention(at::Tensor query, at::Tensor key_cache, at::Tensor value_cache,
                                  at::Tensor block_table, at::Tensor seq_lens, double scale) {
  TORCH_CHECK(query.dim() == 3 && key_cache.dim() == 4, "query [seqs, heads, dim], cache [blocks, bs, kv, dim]");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(query.size(2) <= kMaxHeadDim, "head_dim above 256 is not supported");
  TORCH_CHECK(query.size(1) <= kMaxHeads, "more than 256 query heads is not supported");
  TORCH_CHECK(block_table.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kInt,
              "block_table int64, seq_lens int32");
  query = query.contiguous();
  block_table = block_table.contiguous();
  seq_lens = seq_lens.contiguous();
  auto out = at::empty_like(query);
  tandem::dispatch_float_bf16(query, "paged_decode_attention", [&](auto zero) {
    run<decltype(zero)>(query, key_cache, value_cache, block_table, seq_lens, scale, out);
  });
  return out;
}
