// Paged prefill attention for CPU: each sequence's chunk of query rows against
// its whole context (a cached prefix plus the chunk itself, causally), K/V read
// in place through the block table (no gather copy, no mask tensor). A chunk
// with a cached prefix (a prefix-cache hit, the later chunks of a long prompt)
// costs the same per key as one without.
//
// One task per (sequence, tile of query rows, KV head): the tile's rows of every
// query head sharing that KV head are the rows of one small matrix, so each K/V
// row, widened to float once, serves them all. Keys go 16 at a time: the K tile
// is transposed to [head_dim][16] so a query row's 16 scores are one vector
// accumulation (no horizontal sums), then an online softmax per row (running max
// and sum) and P·V accumulated along head_dim. Accumulates in float32.
//
// Shapes:
//   query        [num_tokens, num_heads, head_dim]   every sequence's rows, in order
//   key_cache    [num_blocks, block_size, num_kv_heads, head_dim]  (value_cache alike)
//   block_tables [num_seqs, max_blocks] int64
//   seq_lens     [num_seqs] int32     context after this step (cached + this chunk)
//   query_start  [num_seqs + 1] int32 each sequence's first row in `query`
//   seqs         [n] int64          the sequences to attend (the prefill chunks this kernel runs)
//   out          [num_tokens, num_heads, head_dim]  the rows of those sequences are written
#include "tensor_api.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "float_types.h"
#include "online_softmax.h"
#include "prefill_tasks.h"
#include "paged_prefill_bf16dot.h"

namespace {

constexpr int64_t kKeys = 16;     // keys per tile: one vector of float scores
constexpr int64_t kTileRows = 16;  // query rows (tokens) per task
constexpr int64_t kMaxHeadDim = 256;
// Query rows scored together: independent FMA chains that share each K column load. With AVX-512 a row's
// 16 scores are one of 32 registers: 16 rows measured fastest on an AVX512-BF16 EPYC (float32, one
// 2048-token chunk, per layer: 24.2-26.2 ms, against 27.4 with 6 rows). With 256-bit vectors (AVX2) they take
// two of 16 registers: 6 rows (12 accumulators) measured fastest there (the same EPYC built for AVX2 by
// TANDEM_CPU_MAX_ISA=avx2: 36.9 ms, against 39.9 / 41.2 / 47.7 with 8 / 4 / 2 rows, 48.8 with 16).
#ifdef __AVX512F__
constexpr int64_t kRowBlock = 16;
#else
constexpr int64_t kRowBlock = 6;
#endif
// Floats of a row's P·V accumulator held in registers while a tile's keys are added into it.
constexpr int64_t kLanes = 16;

using Shape = tandem::PrefillShape;

// One task's part of the batch: `rows` query tokens of one sequence, the first at
// context position `first_pos`, against KV head `kv`.
struct Task {
  int64_t seq, first_row, rows, first_pos, kv;
};

// Per-thread scratch, sized once: float copies of the tile's queries and outputs.
struct Scratch {
  std::vector<float> q, acc, row_max, row_sum;
  explicit Scratch(int64_t rows, int64_t dim) : q(rows * dim), acc(rows * dim), row_max(rows), row_sum(rows) {}
};

// a[0:dim] = a * alpha + p · vt (p: [kKeys], vt: [kKeys][dim]), kLanes of a at a time held in registers
// across the tile's keys: one load and one store of the accumulator per tile, not one per key.
inline void accumulate_pv(const float* __restrict p, const float* __restrict vt, int64_t dim, float alpha,
                          float* __restrict a) {
  for (int64_t d0 = 0; d0 < dim; d0 += kLanes) {
    float lanes[kLanes];
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = a[d0 + l] * alpha;
    for (int64_t j = 0; j < kKeys; ++j) {
      const float pj = p[j];
      const float* v = vt + j * dim + d0;
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += pj * v[l];
    }
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) a[d0 + l] = lanes[l];
  }
}

// kRows query rows from row `r0` against one tile of keys: their scores (kRows independent accumulations,
// sharing each K column: one FMA chain per row keeps the vector units busy), then the online softmax and
// P·V for each. Keys a row may not see (after its own position, or past the tile) get probability 0.
template <int64_t kDim, int64_t kRows>
inline void score_rows(const float* qf, const float* kt, int64_t r0, const Task& task, int64_t group,
                       int64_t first_key, int64_t n, int64_t dim_arg, float* acc, const float* vt, float* row_max,
                       float* row_sum) {
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  alignas(64) float scores[kRows][kKeys] = {};
  for (int64_t d = 0; d < dim; ++d) {
    for (int64_t i = 0; i < kRows; ++i) {
      const float qd = qf[(r0 + i) * dim + d];
#pragma omp simd
      for (int64_t j = 0; j < kKeys; ++j) scores[i][j] += qd * kt[d * kKeys + j];
    }
  }
  for (int64_t i = 0; i < kRows; ++i) {
    const int64_t r = r0 + i;
    // Keys this row may see in the tile: up to and including its own position.
    const int64_t visible = std::min(n, task.first_pos + r / group + 1 - first_key);
    if (visible <= 0) continue;
    float* s = scores[i];
    float* a = acc + r * dim;
    if (dim % kLanes == 0) {
      accumulate_pv(s, vt, dim, tandem::softmax_step(s, kKeys, visible, row_max[r], row_sum[r]), a);
      continue;
    }
    tandem::online_softmax_tile(s, kKeys, visible, row_max[r], row_sum[r], a, dim);
    for (int64_t j = 0; j < kKeys; ++j) {
      const float p = s[j];
      const float* v = vt + j * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) a[d] += p * v[d];
    }
  }
}

// kDim > 0 fixes head_dim at compile time (unrolled, vectorised rows); 0 reads it at run time.
template <typename T, int64_t kDim>
void attend_tile(const T* query, const T* kc, const T* vc, const int64_t* table, const Task& task,
                 const Shape& shape, float scale, T* out, Scratch& scratch) {
  const int64_t dim = kDim > 0 ? kDim : shape.dim;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t rows = task.rows * group;  // row r: token r / group, head kv * group + r % group
  const int64_t token_stride = shape.num_heads * dim;
  float* qf = scratch.q.data();
  float* acc = scratch.acc.data();
  float* row_max = scratch.row_max.data();
  float* row_sum = scratch.row_sum.data();
  for (int64_t r = 0; r < rows; ++r) {
    const T* q = query + (task.first_row + r / group) * token_stride + (task.kv * group + r % group) * dim;
    for (int64_t d = 0; d < dim; ++d) qf[r * dim + d] = tandem::to_float(q[d]) * scale;
    std::fill(acc + r * dim, acc + (r + 1) * dim, 0.f);
    row_max[r] = -std::numeric_limits<float>::infinity();
    row_sum[r] = 0.f;
  }
  alignas(64) float kt[kMaxHeadDim * kKeys];  // [dim][kKeys]: the K tile, transposed
  alignas(64) float vt[kKeys * kMaxHeadDim];  // [kKeys][dim]
  const int64_t last_pos = task.first_pos + task.rows - 1;
  for (int64_t first_key = 0; first_key <= last_pos; first_key += kKeys) {
    const int64_t n = std::min(kKeys, last_pos + 1 - first_key);
    for (int64_t j = 0; j < kKeys; ++j) {
      if (j < n) {
        const T* k = tandem::context_row(kc, table, first_key + j, shape, task.kv);
        const T* v = tandem::context_row(vc, table, first_key + j, shape, task.kv);
        for (int64_t d = 0; d < dim; ++d) {
          kt[d * kKeys + j] = tandem::to_float(k[d]);
          vt[j * dim + d] = tandem::to_float(v[d]);
        }
      } else {  // past the tile's last position: zeros, masked below
        for (int64_t d = 0; d < dim; ++d) kt[d * kKeys + j] = vt[j * dim + d] = 0.f;
      }
    }
    int64_t r = 0;
    for (; r + kRowBlock <= rows; r += kRowBlock) {
      score_rows<kDim, kRowBlock>(qf, kt, r, task, group, first_key, n, dim, acc, vt, row_max, row_sum);
    }
    for (; r + 4 <= rows; r += 4) score_rows<kDim, 4>(qf, kt, r, task, group, first_key, n, dim, acc, vt, row_max, row_sum);
    for (; r < rows; ++r) score_rows<kDim, 1>(qf, kt, r, task, group, first_key, n, dim, acc, vt, row_max, row_sum);
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out + (task.first_row + r / group) * token_stride + (task.kv * group + r % group) * dim;
    const float inv = 1.f / row_sum[r];
    for (int64_t d = 0; d < dim; ++d) o[d] = tandem::from_float<T>(acc[r * dim + d] * inv);
  }
}

template <typename T>
using TileFn = void (*)(const T*, const T*, const T*, const int64_t*, const Task&, const Shape&, float, T*,
                        Scratch&);

template <typename T>
TileFn<T> pick(int64_t dim) {
  if (dim == 64) return attend_tile<T, 64>;
  if (dim == 128) return attend_tile<T, 128>;
  return attend_tile<T, 0>;
}

std::vector<Task> tasks_of(const int32_t* lens, const int32_t* starts, const int64_t* seqs, int64_t num_seqs,
                           int64_t num_kv_heads) {
  std::vector<Task> tasks;
  tandem::for_each_prefill_task(lens, starts, seqs, num_seqs, num_kv_heads, kTileRows,
                                [&](int64_t, int64_t s, int64_t first_row, int64_t rows, int64_t first_pos,
                                    int64_t kv) { tasks.push_back({s, first_row, rows, first_pos, kv}); });
  return tasks;
}

template <typename T>
void run(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
         const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& query_start,
         const at::Tensor& seqs, double scale, at::Tensor& out) {
  const Shape shape{query.size(1), key_cache.size(2), query.size(2), key_cache.size(1), block_tables.size(1)};
  const std::vector<Task> tasks = tasks_of(seq_lens.data_ptr<int32_t>(), query_start.data_ptr<int32_t>(),
                                           seqs.data_ptr<int64_t>(), seqs.size(0), shape.num_kv_heads);
  const T* q = query.data_ptr<T>();
  const T* kc = key_cache.data_ptr<T>();
  const T* vc = value_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  T* o = out.data_ptr<T>();
  const TileFn<T> fn = pick<T>(shape.dim);
  const int64_t scratch_rows = kTileRows * (shape.num_heads / shape.num_kv_heads);
  tandem::run_round_robin(
      static_cast<int64_t>(tasks.size()), [&] { return Scratch(scratch_rows, shape.dim); },
      [&](int64_t i, Scratch& scratch) {
        const Task& task = tasks[i];
        fn(q, kc, vc, tables + task.seq * shape.max_blocks, task, shape, static_cast<float>(scale), o, scratch);
      });
}

}  // namespace

void paged_prefill_attention(at::Tensor query, at::Tensor key_cache, at::Tensor value_cache,
                             at::Tensor block_tables, at::Tensor seq_lens, at::Tensor query_start,
                             at::Tensor seqs, double scale, at::Tensor out) {
  TORCH_CHECK(query.dim() == 3 && key_cache.dim() == 4, "query [tokens, heads, dim], cache [blocks, bs, kv, dim]");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == query.sizes(), "out: contiguous, the shape of query");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(query.size(2) <= kMaxHeadDim, "head_dim above 256 is not supported");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kInt &&
                  query_start.scalar_type() == at::kInt,
              "block_tables int64, seq_lens and query_start int32");
  TORCH_CHECK(seqs.scalar_type() == at::kLong && seqs.dim() == 1, "seqs: int64 [n]");
  TORCH_CHECK(query_start.size(0) == seq_lens.size(0) + 1, "query_start has one entry more than seq_lens");
  query = query.contiguous();
  block_tables = block_tables.contiguous();
  seq_lens = seq_lens.contiguous();
  query_start = query_start.contiguous();
  seqs = seqs.contiguous();
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t* ids = seqs.data_ptr<int64_t>();
  for (int64_t i = 0; i < seqs.size(0); ++i) TORCH_CHECK(ids[i] >= 0 && ids[i] < num_seqs, "seqs out of range");
  tandem::dispatch_float_bf16(query, "paged_prefill_attention", [&](auto zero) {
    using T = decltype(zero);
#ifdef TANDEM_PREFILL_BF16DOT
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      namespace dot = tandem::bf16dot;
      const Shape shape{query.size(1), key_cache.size(2), query.size(2), key_cache.size(1), block_tables.size(1)};
      if (dot::supports(shape.dim, shape.num_heads / shape.num_kv_heads)) {
        const auto bits = [](const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); };
        dot::run(bits(query), bits(key_cache), bits(value_cache), block_tables.data_ptr<int64_t>(),
                 seq_lens.data_ptr<int32_t>(), query_start.data_ptr<int32_t>(), seqs.data_ptr<int64_t>(), seqs.size(0),
                 shape, static_cast<float>(scale), reinterpret_cast<uint16_t*>(out.data_ptr()));
        return;
      }
    }
#endif
    run<T>(query, key_cache, value_cache, block_tables, seq_lens, query_start, seqs, scale, out);
  });
}
