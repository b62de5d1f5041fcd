// y = x @ W^T (+ bias) over a weight kept in the blocks its GGUF file ships (Q8_0, Q4_0, Q4_1; the layout is
// engine/quantized_weight.py's), and that weight widened to float32 once for products of many rows.
//
// A decode step is bound by the bytes of its weights: the default model's linears take 4.5 bits a weight in
// its file (Q4_1) and 32 as float32. This kernel streams the blocks as they are, widens each block of 32
// weights into registers (ggml's values: d * q, d * (q - 8), d * q + m, from the float16 scales) and
// multiplies it into every row of the call while it is there, so the widening is paid once per block for up
// to kMaxRows rows. More rows take it again per kMaxRows: for a prefill, widening the whole weight once
// (`dequantize_blocks`) and a GEMM is the other candidate, and the choice is timed (engine.layers.ops).
//
// With AVX-512 (or AVX2 with FMA), a block is widened by intrinsics into two (four) vectors: the
// plain loops over its 32 lanes at the end, left to GCC's vectoriser, ran at 2 GB/s of blocks, 4x slower,
// and are kept for CPUs with neither.
//
// Shapes: x [rows, in] float32, rows contiguous; codes [out, in] int8 (Q8_0) or [out, in / 2] uint8 (Q4_*:
// byte j of a block holds weight j in its low nibble, weight j + 16 in its high one); scales and offsets
// [out, in / 32] float32 (offsets: Q4_1 only): the file's float16 values widened once at load, since
// converting a float16 scalar per block took a third of the kernel's time (Q4_1 at one row: 128 against
// 80 us for 3072 x 576 on the Xeon of 2026-11-28), for 4 bytes more a block; bias [out] float32 or none.
// The result: [rows, out] float32.
#include "gguf_blocks.h"
#include "tensor_api.h"

// The vector width the blocks are widened into: 512 (AVX-512), 256 (AVX2 with FMA), or none (plain loops).
#if defined(__AVX512F__)
#define TANDEM_BLOCK_VECTOR_BITS 512
#elif defined(__AVX2__) && defined(__FMA__)
#define TANDEM_BLOCK_VECTOR_BITS 256
#endif
#ifdef TANDEM_BLOCK_VECTOR_BITS
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace {

using tandem::Blocks;
using tandem::kBlock;
using tandem::kHalf;
using tandem::QType;

constexpr int64_t kMaxRows = 8;      // rows multiplied into one widened block
constexpr int64_t kOutPerTask = 16;  // output features per parallel task

// out[0:32] = block b of output row n as float32.
template <QType kType>
inline void widen(const Blocks& w, int64_t n, int64_t b, float* __restrict out) {
  const int64_t i = n * w.blocks + b;
  const float d = w.scales[i];
  if constexpr (kType == QType::kQ8_0) {
    const int8_t* q = static_cast<const int8_t*>(w.codes) + i * kBlock;
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j) out[j] = d * static_cast<float>(q[j]);
  } else {
    const uint8_t* q = static_cast<const uint8_t*>(w.codes) + i * kHalf;
    const float m = kType == QType::kQ4_1 ? w.offsets[i] : 0.f;
#pragma omp simd
    for (int64_t j = 0; j < kHalf; ++j) {
      const float low = static_cast<float>(q[j] & 15), high = static_cast<float>(q[j] >> 4);
      if constexpr (kType == QType::kQ4_0) {
        out[j] = d * (low - 8.f);
        out[j + kHalf] = d * (high - 8.f);
      } else {
        out[j] = d * low + m;
        out[j + kHalf] = d * high + m;
      }
    }
  }
}

#if TANDEM_BLOCK_VECTOR_BITS == 512
// Block i (of all blocks, row-major) as two vectors of float32: weights 0-15 and 16-31. Q4_0's d * (q - 8)
// is one FMA, q * d + (-8 d): exact before its one rounding, so the same bits as the reference.
template <QType kType>
inline void widen_vectors(const Blocks& w, int64_t i, __m512& lo, __m512& hi) {
  const float d = w.scales[i];
  const __m512 dv = _mm512_set1_ps(d);
  if constexpr (kType == QType::kQ8_0) {
    const int8_t* q = static_cast<const int8_t*>(w.codes) + i * kBlock;
    const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + kHalf));
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(first)), dv);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(second)), dv);
  } else {
    const uint8_t* q = static_cast<const uint8_t*>(w.codes) + i * kHalf;
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    const __m512 low = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(15)));
    const __m512 high = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
    const __m512 mv = _mm512_set1_ps(kType == QType::kQ4_1 ? w.offsets[i] : -8.f * d);
    lo = _mm512_fmadd_ps(low, dv, mv);
    hi = _mm512_fmadd_ps(high, dv, mv);
  }
}

// out[r, n..n + kCols) for r < kRows: each block widened once into two vectors, then into every row. Few
// rows take several outputs at once: with one row, one output's sum is a chain of dependent FMAs (4 cycles
// each), which bounded the kernel where four chains side by side run at the blocks' own pace.
template <QType kType, int64_t kRows, int64_t kCols>
inline void rows_times_columns(const float* __restrict x, int64_t x_stride, const Blocks& w, const float* bias,
                               int64_t n, float* __restrict out, int64_t out_stride) {
  __m512 lo_acc[kRows][kCols], hi_acc[kRows][kCols];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) lo_acc[r][c] = hi_acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < w.blocks; ++b) {
#pragma GCC unroll 4
    for (int64_t c = 0; c < kCols; ++c) {
      __m512 lo, hi;
      widen_vectors<kType>(w, (n + c) * w.blocks + b, lo, hi);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kRows; ++r) {
        const float* xr = x + r * x_stride + b * kBlock;
        lo_acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr), lo, lo_acc[r][c]);
        hi_acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr + kHalf), hi, hi_acc[r][c]);
      }
    }
  }
  for (int64_t c = 0; c < kCols; ++c) {
    const float bn = bias != nullptr ? bias[n + c] : 0.f;
    for (int64_t r = 0; r < kRows; ++r) {
      out[r * out_stride + n + c] = _mm512_reduce_add_ps(_mm512_add_ps(lo_acc[r][c], hi_acc[r][c])) + bn;
    }
  }
}
#elif TANDEM_BLOCK_VECTOR_BITS == 256
// The same with 256-bit vectors: a block is four vectors of 8 weights.
template <QType kType>
inline void widen_vectors(const Blocks& w, int64_t i, __m256 (&v)[4]) {
  const float d = w.scales[i];
  const __m256 dv = _mm256_set1_ps(d);
  if constexpr (kType == QType::kQ8_0) {
    const int8_t* q = static_cast<const int8_t*>(w.codes) + i * kBlock;
    for (int k = 0; k < 4; ++k) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * k));
      v[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), dv);
    }
  } else {
    const uint8_t* q = static_cast<const uint8_t*>(w.codes) + i * kHalf;
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i nibble = _mm_set1_epi8(15);
    const __m128i low = _mm_and_si128(bytes, nibble), high = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
    const __m256 mv = _mm256_set1_ps(kType == QType::kQ4_1 ? w.offsets[i] : -8.f * d);
    const __m128i parts[4] = {low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)};  // weights 0-7, ..., 24-31
    for (int k = 0; k < 4; ++k) v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k])), dv, mv);
  }
}

inline float sum_lanes(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)));
}

template <QType kType, int64_t kRows, int64_t kCols>
inline void rows_times_columns(const float* __restrict x, int64_t x_stride, const Blocks& w, const float* bias,
                               int64_t n, float* __restrict out, int64_t out_stride) {
  __m256 acc[kRows][kCols];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < w.blocks; ++b) {
#pragma GCC unroll 4
    for (int64_t c = 0; c < kCols; ++c) {
      __m256 v[4];
      widen_vectors<kType>(w, (n + c) * w.blocks + b, v);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kRows; ++r) {
        const float* xr = x + r * x_stride + b * kBlock;
        for (int k = 0; k < 4; ++k) acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8 * k), v[k], acc[r][c]);
      }
    }
  }
  for (int64_t c = 0; c < kCols; ++c) {
    const float bn = bias != nullptr ? bias[n + c] : 0.f;
    for (int64_t r = 0; r < kRows; ++r) out[r * out_stride + n + c] = sum_lanes(acc[r][c]) + bn;
  }
}
#endif

#ifdef TANDEM_BLOCK_VECTOR_BITS
// out[r, n] for r < kRows, n in [n0, n1), kCols outputs at a time (rows_times_columns says why).
template <QType kType, int64_t kRows>
void rows_times_blocks(const float* __restrict x, int64_t x_stride, const Blocks& w, const float* bias, int64_t n0,
                       int64_t n1, float* __restrict out, int64_t out_stride) {
  constexpr int64_t kCols = kRows == 1 ? 4 : kRows == 2 ? 2 : 1;  // at most 8 accumulators side by side
  int64_t n = n0;
  for (; n + kCols <= n1; n += kCols) rows_times_columns<kType, kRows, kCols>(x, x_stride, w, bias, n, out, out_stride);
  for (; n < n1; ++n) rows_times_columns<kType, kRows, 1>(x, x_stride, w, bias, n, out, out_stride);
}
#else
// out[r, n] for r < kRows, n in [n0, n1). kRows fixes the row count so acc[][] stays in registers.
template <QType kType, int64_t kRows>
void rows_times_blocks(const float* __restrict x, int64_t x_stride, const Blocks& w, const float* bias, int64_t n0,
                       int64_t n1, float* __restrict out, int64_t out_stride) {
  for (int64_t n = n0; n < n1; ++n) {
    float acc[kRows][kBlock] = {};
    for (int64_t b = 0; b < w.blocks; ++b) {
      float wb[kBlock];
      widen<kType>(w, n, b, wb);
      for (int64_t r = 0; r < kRows; ++r) {
        const float* xr = x + r * x_stride + b * kBlock;
#pragma omp simd
        for (int64_t j = 0; j < kBlock; ++j) acc[r][j] += wb[j] * xr[j];
      }
    }
    const float bn = bias != nullptr ? bias[n] : 0.f;
    for (int64_t r = 0; r < kRows; ++r) {
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < kBlock; ++j) s += acc[r][j];
      out[r * out_stride + n] = s + bn;
    }
  }
}
#endif

using RowsFn = void (*)(const float*, int64_t, const Blocks&, const float*, int64_t, int64_t, float*, int64_t);

template <QType kType, int64_t... kRows>
RowsFn pick(int64_t rows, std::integer_sequence<int64_t, kRows...>) {
  RowsFn table[] = {rows_times_blocks<kType, kRows + 1>...};
  return table[rows - 1];
}

template <QType kType>
RowsFn pick(int64_t rows) {
  return pick<kType>(rows, std::make_integer_sequence<int64_t, kMaxRows>{});
}

}  // namespace

at::Tensor quantized_linear(at::Tensor x, const std::string& qtype, at::Tensor codes, at::Tensor scales,
                            c10::optional<at::Tensor> offsets, c10::optional<at::Tensor> bias) {
  const QType type = tandem::parse_qtype(qtype);
  const Blocks w = tandem::check_blocks(type, codes, scales, offsets);
  const int64_t in = w.blocks * kBlock, out_features = scales.size(0);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kFloat && x.size(1) == in,
              "x must be float32 [rows, in] with contiguous rows, in = the weight's in_features");
  const int64_t rows = x.size(0);
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == out_features && bias->scalar_type() == at::kFloat,
                "bias must be contiguous float32 [out]");
  }
  auto out = at::empty({rows, out_features}, x.options());
  if (rows == 0) return out;
  const float* xs = x.data_ptr<float>();
  const float* b = has_bias ? bias->data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  const int64_t x_stride = x.stride(0);
  tandem::dispatch_qtype(type, [&](auto kind) {
    constexpr QType kType = decltype(kind)::value;
    at::parallel_for(0, out_features, kOutPerTask, [&](int64_t n0, int64_t n1) {
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
        const int64_t count = std::min(kMaxRows, rows - r0);
        pick<kType>(count)(xs + r0 * x_stride, x_stride, w, b, n0, n1, o + r0 * out_features, out_features);
      }
    });
  });
  return out;
}

at::Tensor dequantize_blocks(const std::string& qtype, at::Tensor codes, at::Tensor scales,
                             c10::optional<at::Tensor> offsets) {
  const QType type = tandem::parse_qtype(qtype);
  const Blocks w = tandem::check_blocks(type, codes, scales, offsets);
  const int64_t out_features = scales.size(0), in = w.blocks * kBlock;
  auto out = at::empty({out_features, in}, scales.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  tandem::dispatch_qtype(type, [&](auto kind) {
    constexpr QType kType = decltype(kind)::value;
    at::parallel_for(0, out_features, kOutPerTask, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        for (int64_t b = 0; b < w.blocks; ++b) widen<kType>(w, n, b, o + n * in + b * kBlock);
      }
    });
  });
  return out;
}
