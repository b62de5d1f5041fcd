// Paged decode attention for CPU: one query token per sequence, K/V read in
// place through the block table (no gather copy), GQA by sharing one pass
// over a KV head among its group of query heads. Accumulates in float32.
//
// Shapes:
//   query       [num_seqs, num_heads, head_dim]
//   key_cache   [num_blocks, block_size, num_kv_heads, head_dim]  (value_cache alike)
//   block_table [num_seqs, max_blocks] int64
//   seq_lens    [num_seqs] int32
//   out         [num_seqs, num_heads, head_dim]
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <vector>

static constexpr int64_t kMaxHeadDim = 256;
static constexpr int64_t kMaxGroup = 64;  // query heads per KV head

// A K or V row as float: float rows are used in place, others widened into `buf`.
static inline const float* as_float(const float* row, int64_t, float*) { return row; }
static inline const float* as_float(const c10::BFloat16* row, int64_t dim, float* buf) {
  // bfloat16 is the top half of a float32: a shift the compiler vectorises.
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(row);
  uint32_t* out = reinterpret_cast<uint32_t*>(buf);
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) out[d] = static_cast<uint32_t>(raw[d]) << 16;
  return buf;
}

// Calls fn(row, t) for the KV-head row of each of a sequence's first `len` tokens,
// walking the block table a block at a time (no division per token).
template <typename T, typename Fn>
static inline void for_each_row(const T* cache, const int64_t* table, int64_t len, int64_t block_size,
                                int64_t token_stride, int64_t head_offset, Fn&& fn) {
  for (int64_t first = 0, b = 0; first < len; first += block_size, ++b) {
    const T* block = cache + table[b] * block_size * token_stride + head_offset;
    const int64_t n = std::min(block_size, len - first);
    for (int64_t j = 0; j < n; ++j) fn(block + j * token_stride, first + j);
  }
}

// kDim > 0 fixes head_dim at compile time (fully unrolled, vectorised rows); 0 reads it at run time.
template <typename T, int64_t kDim>
static void decode_one(const T* q, const T* kc, const T* vc, const int64_t* table, int64_t len,
                       int64_t kv_head, int64_t group, int64_t dim_arg, int64_t block_size,
                       int64_t num_kv_heads, float scale, T* out, std::vector<float>& scores,
                       std::vector<float>& acc, std::vector<float>& qf) {
  // q, out point at the group's first query head: [group, dim]; scores: [group, len]
  const int64_t dim = kDim > 0 ? kDim : dim_arg;
  for (int64_t i = 0; i < group * dim; ++i) qf[i] = static_cast<float>(q[i]) * scale;
  const int64_t token_stride = num_kv_heads * dim;
  float buf[kMaxHeadDim];  // one K or V row, widened to float once for all the group's heads
  for_each_row(kc, table, len, block_size, token_stride, kv_head * dim, [&](const T* row, int64_t t) {
    const float* k = as_float(row, dim, buf);
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qf.data() + g * dim;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t d = 0; d < dim; ++d) s += qg[d] * k[d];
      scores[g * len + t] = s;
    }
  });
  // Softmax without normalising the weights: the sum divides the output once at the end.
  float inv_sum[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores.data() + g * len;
    float m = sg[0];
#pragma omp simd reduction(max : m)
    for (int64_t t = 0; t < len; ++t) m = std::max(m, sg[t]);
#pragma omp simd
    for (int64_t t = 0; t < len; ++t) sg[t] = std::exp(sg[t] - m);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < len; ++t) sum += sg[t];
    inv_sum[g] = 1.f / sum;
  }
  std::fill(acc.begin(), acc.begin() + group * dim, 0.f);
  for_each_row(vc, table, len, block_size, token_stride, kv_head * dim, [&](const T* row, int64_t t) {
    const float* v = as_float(row, dim, buf);
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * len + t];
      float* a = acc.data() + g * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) a[d] += p * v[d];
    }
  });
  for (int64_t i = 0; i < group * dim; ++i) out[i] = static_cast<T>(acc[i] * inv_sum[i / dim]);
}

template <typename T>
static void run(const torch::Tensor& query, const torch::Tensor& key_cache, const torch::Tensor& value_cache,
                const torch::Tensor& block_table, const torch::Tensor& seq_lens, double scale,
                torch::Tensor& out) {
  const int64_t num_seqs = query.size(0), num_heads = query.size(1), dim = query.size(2);
  const int64_t block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, max_blocks = block_table.size(1);
  const T* q = query.data_ptr<T>();
  const T* kc = key_cache.data_ptr<T>();
  const T* vc = value_cache.data_ptr<T>();
  const int64_t* tables = block_table.data_ptr<int64_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  T* o = out.data_ptr<T>();
  const int64_t max_len = max_blocks * block_size;
  auto one = dim == 64 ? decode_one<T, 64> : dim == 128 ? decode_one<T, 128> : decode_one<T, 0>;
  at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * max_len), acc(group * dim), qf(group * dim);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t s = i / num_kv_heads, h = i % num_kv_heads;
      const int64_t offset = (s * num_heads + h * group) * dim;
      one(q + offset, kc, vc, tables + s * max_blocks, lens[s], h, group, dim, block_size, num_kv_heads,
          static_cast<float>(scale), o + offset, scores, acc, qf);
    }
  });
}

torch::Tensor paged_decode_attention(torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                                     torch::Tensor block_table, torch::Tensor seq_lens, double scale) {
  TORCH_CHECK(query.dim() == 3 && key_cache.dim() == 4, "query [seqs, heads, dim], cache [blocks, bs, kv, dim]");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(query.size(1) % key_cache.size(2) == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(query.size(2) <= kMaxHeadDim, "head_dim above 256 is not supported");
  TORCH_CHECK(query.size(1) / key_cache.size(2) <= kMaxGroup, "more than 64 query heads per KV head");
  TORCH_CHECK(block_table.scalar_type() == torch::kInt64 && seq_lens.scalar_type() == torch::kInt32,
              "block_table int64, seq_lens int32");
  query = query.contiguous();
  block_table = block_table.contiguous();
  seq_lens = seq_lens.contiguous();
  auto out = torch::empty_like(query);
  if (query.scalar_type() == torch::kFloat) {
    run<float>(query, key_cache, value_cache, block_table, seq_lens, scale, out);
  } else if (query.scalar_type() == torch::kBFloat16) {
    run<c10::BFloat16>(query, key_cache, value_cache, block_table, seq_lens, scale, out);
  } else {
    TORCH_CHECK(false, "paged_decode_attention supports float32 and bfloat16");
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "paged decode attention (CPU)");
}
