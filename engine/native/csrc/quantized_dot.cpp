// y = x @ W^T (+ bias) over a weight in GGUF blocks (Q8_0, Q4_0, Q4_1) by integer dot products, llama.cpp's
// way: each block of 32 activations is quantized to int8 with a scale of its own (d = max |x| / 127), and a
// block of the weight meets it in VPDPBUSD (AVX512-VNNI: 64 byte products summed by fours into int32 in one
// instruction), so a block costs one multiply-add per row where widening it to float32 costs two FMAs and the
// widening (quantized_linear.cpp). The result differs from the float path by the activations' rounding (a
// relative error of about 0.4% / sqrt(32) per block's sum): the engine offers it as a choice of its own.
//
// Per block b of output n and row r (d: float32 scales, q: integer codes, s_r,b = d_x * sum_j qx_j):
//   Q4_1: w = d q + m       ->  d d_x sum(q qx) + m s_r,b
//   Q4_0: w = d (q - 8)     ->  d d_x sum(q qx) - 8 d s_r,b
//   Q8_0: w = d q (signed)  ->  d d_x sum(q qx); VPDPBUSD takes one unsigned operand, so the activations go
//         in as qx + 128 (1..255) and 128 sum(q), summed by the same instruction once per block for all rows,
//         is taken off.
// Blocks are taken in pairs, 64 weights to a 512-bit vector. A Q4 pair is its 32 code bytes split into low and
// high nibbles: [b: weights 0-15 | b+1: 0-15 | b: 16-31 | b+1: 16-31]; the activations are quantized into that
// order once per call (a Q8_0 pair is its 64 bytes as they lie, the activations in their own order). An odd
// last block pairs with zeros.
//
// Shapes: x [rows, in] float32 or bfloat16, rows contiguous; the weight as quantized_linear.cpp takes it; bias
// [out] in x's dtype or none. The result: [rows, out] in x's dtype.
#include "float_types.h"
#include "gguf_blocks.h"
#include "tensor_api.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define TANDEM_INT8_DOT 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef TANDEM_INT8_DOT
namespace {

using tandem::Blocks;
using tandem::kBlock;
using tandem::kHalf;
using tandem::QType;

constexpr int64_t kPair = 2 * kBlock;
constexpr int64_t kMaxRows = 16;     // rows multiplied into one pair of weight blocks
constexpr int64_t kOutPerTask = 16;  // output features per parallel task

// The activations of a call, quantized: per row, per pair p, 64 codes in the pair's order and 16 lane scales
// (the scale of the block each int32 lane of VPDPBUSD sums), and per row and block d_x * sum(codes) (Q4 only).
struct QuantizedRows {
  const uint8_t* codes;  // [rows, pairs, 64]
  const float* lane_scales;  // [rows, pairs, 16]
  const float* code_sums;    // [rows, blocks]
  int64_t pairs, blocks;
};

// Which block of a pair (0 or 1) each int32 lane of a pair's VPDPBUSD covers.
template <QType kType>
inline __m512i lane_blocks() {
  return kType == QType::kQ8_0 ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
                               : _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
}

// Position in a pair's code order of weight j of block `second` (0 or 1).
template <QType kType>
inline int64_t pair_position(int64_t second, int64_t j) {
  if constexpr (kType == QType::kQ8_0) return second * kBlock + j;
  return (j < kHalf ? 0 : kBlock) + second * kHalf + j % kHalf;
}

template <QType kType, typename T>
void quantize_row(const T* x, int64_t blocks, int64_t pairs, uint8_t* codes, float* lane_scales, float* sums) {
  std::fill(codes, codes + pairs * kPair, kType == QType::kQ8_0 ? 128 : 0);  // an odd last block's partner: 0
  float scales[2];
  for (int64_t b = 0; b < blocks; ++b) {
    const T* xb = x + b * kBlock;
    float amax = 0.f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(tandem::to_float(xb[j])));
    const float d = amax / 127.f, inverse = amax > 0.f ? 127.f / amax : 0.f;
    int32_t sum = 0;
    uint8_t* pair = codes + (b / 2) * kPair;
    for (int64_t j = 0; j < kBlock; ++j) {
      const int32_t q = static_cast<int32_t>(std::nearbyint(tandem::to_float(xb[j]) * inverse));
      sum += q;
      pair[pair_position<kType>(b % 2, j)] = static_cast<uint8_t>(kType == QType::kQ8_0 ? q + 128 : q);
    }
    scales[b % 2] = d;
    if (sums != nullptr) sums[b] = d * static_cast<float>(sum);
    if (b % 2 == 1 || b + 1 == blocks) {
      if (b % 2 == 0) scales[1] = 0.f;
      const __m128 two = _mm_set_ps(0, 0, scales[1], scales[0]);
      const __m512 both = _mm512_permutexvar_ps(lane_blocks<kType>(), _mm512_castps128_ps512(two));
      _mm512_storeu_ps(lane_scales + (b / 2) * 16, both);
    }
  }
}

// Pair p of output n's blocks as VPDPBUSD takes it, and its 16 lane scales.
template <QType kType>
inline __m512i weight_pair(const Blocks& w, int64_t n, int64_t p, __m512& lane_scales) {
  const int64_t b = 2 * p, i = n * w.blocks + b;
  const bool both = b + 1 < w.blocks;
  const __m128 two = _mm_maskz_loadu_ps(both ? 0x3 : 0x1, w.scales + i);
  lane_scales = _mm512_permutexvar_ps(lane_blocks<kType>(), _mm512_castps128_ps512(two));
  const uint8_t* codes = static_cast<const uint8_t*>(w.codes);
  if constexpr (kType == QType::kQ8_0) {
    return _mm512_maskz_loadu_epi8(both ? ~__mmask64{0} : __mmask64{0xFFFFFFFF}, codes + i * kBlock);
  } else {
    const __m256i bytes = _mm256_maskz_loadu_epi8(both ? ~__mmask32{0} : __mmask32{0xFFFF}, codes + i * kHalf);
    const __m256i nibble = _mm256_set1_epi8(15);
    const __m256i low = _mm256_and_si256(bytes, nibble), high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
  }
}

// sum_b offset(n, b) * s_r,b: the part of a Q4 block's product its offset makes (Q4_1: m; Q4_0: -8 d).
template <QType kType>
inline float offset_part(const Blocks& w, int64_t n, const float* sums) {
  if constexpr (kType == QType::kQ8_0) {
    return 0.f;
  } else {
    const float* values = (kType == QType::kQ4_1 ? w.offsets : w.scales) + n * w.blocks;
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 16 <= w.blocks; b += 16) {
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(values + b), _mm512_loadu_ps(sums + b), acc);
    }
    const __mmask16 tail = static_cast<__mmask16>((1u << (w.blocks - b)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, values + b), _mm512_maskz_loadu_ps(tail, sums + b), acc);
    const float total = _mm512_reduce_add_ps(acc);
    return kType == QType::kQ4_1 ? total : -8.f * total;
  }
}

// out[r, n..n + kCols) for r < kRows (rows r0.. of the quantized activations).
template <QType kType, int64_t kRows, int64_t kCols, typename T>
inline void rows_times_columns(const QuantizedRows& x, int64_t r0, const Blocks& w, const T* bias, int64_t n,
                               T* __restrict out, int64_t out_stride) {
  __m512 acc[kRows][kCols];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);
  for (int64_t p = 0; p < x.pairs; ++p) {
#pragma GCC unroll 4
    for (int64_t c = 0; c < kCols; ++c) {
      __m512 w_scales;
      const __m512i wq = weight_pair<kType>(w, n + c, p, w_scales);
      // Q8_0: 128 * the codes' sums per lane, what the activations' +128 added
      const __m512i shift = kType == QType::kQ8_0 ? _mm512_slli_epi32(_mm512_dpbusd_epi32(zero, ones, wq), 7) : zero;
#pragma GCC unroll 16
      for (int64_t r = 0; r < kRows; ++r) {
        const int64_t at = (r0 + r) * x.pairs + p;
        const __m512i xq = _mm512_loadu_si512(x.codes + at * kPair);
        const __m512i dot = kType == QType::kQ8_0 ? _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, xq, wq), shift)
                                                  : _mm512_dpbusd_epi32(zero, wq, xq);
        const __m512 scale = _mm512_mul_ps(w_scales, _mm512_loadu_ps(x.lane_scales + at * 16));
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r][c]);
      }
    }
  }
  for (int64_t c = 0; c < kCols; ++c) {
    const float bn = bias != nullptr ? tandem::to_float(bias[n + c]) : 0.f;
    for (int64_t r = 0; r < kRows; ++r) {
      const float* sums = x.code_sums + (r0 + r) * x.blocks;
      const float y = _mm512_reduce_add_ps(acc[r][c]) + offset_part<kType>(w, n + c, sums) + bn;
      out[r * out_stride + n + c] = tandem::from_float<T>(y);
    }
  }
}

template <QType kType, int64_t kRows, typename T>
void rows_times_blocks(const QuantizedRows& x, int64_t r0, const Blocks& w, const T* bias, int64_t n0, int64_t n1,
                       T* out, int64_t out_stride) {
  constexpr int64_t kCols = kRows == 1 ? 4 : kRows == 2 ? 2 : 1;  // independent sums side by side
  int64_t n = n0;
  for (; n + kCols <= n1; n += kCols) rows_times_columns<kType, kRows, kCols>(x, r0, w, bias, n, out, out_stride);
  for (; n < n1; ++n) rows_times_columns<kType, kRows, 1>(x, r0, w, bias, n, out, out_stride);
}

template <QType kType, typename T>
using RowsFn = void (*)(const QuantizedRows&, int64_t, const Blocks&, const T*, int64_t, int64_t, T*, int64_t);

template <QType kType, typename T, int64_t... kRows>
RowsFn<kType, T> pick(int64_t rows, std::integer_sequence<int64_t, kRows...>) {
  RowsFn<kType, T> table[] = {rows_times_blocks<kType, kRows + 1, T>...};
  return table[rows - 1];
}

template <QType kType, typename T>
void multiply(const at::Tensor& x, const Blocks& w, const T* bias, at::Tensor& out) {
  const int64_t rows = x.size(0), out_features = out.size(1), pairs = (w.blocks + 1) / 2;
  // The quantized activations: a buffer per calling thread, kept between calls (a decode step makes ~200).
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> lane_scales, sums;
  codes.resize(rows * pairs * kPair);
  lane_scales.resize(rows * pairs * 16);
  sums.resize(rows * w.blocks);
  // (pointers: inside the parallel regions `codes` would name the worker thread's own buffer)
  uint8_t* codes_at = codes.data();
  float *scales_at = lane_scales.data(), *sums_at = kType == QType::kQ8_0 ? nullptr : sums.data();
  const T* xs = x.data_ptr<T>();
  const int64_t x_stride = x.stride(0);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      quantize_row<kType>(xs + r * x_stride, w.blocks, pairs, codes_at + r * pairs * kPair, scales_at + r * pairs * 16,
                          sums_at == nullptr ? nullptr : sums_at + r * w.blocks);
    }
  });
  const QuantizedRows q{codes_at, scales_at, sums_at, pairs, w.blocks};
  T* o = out.data_ptr<T>();
  at::parallel_for(0, out_features, kOutPerTask, [&](int64_t n0, int64_t n1) {
    for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
      const int64_t count = std::min(kMaxRows, rows - r0);
      pick<kType, T>(count, std::make_integer_sequence<int64_t, kMaxRows>{})(q, r0, w, bias, n0, n1,
                                                                            o + r0 * out_features, out_features);
    }
  });
}

}  // namespace
#endif

bool int8_dot_built() {
#ifdef TANDEM_INT8_DOT
  return true;
#else
  return false;
#endif
}

at::Tensor quantized_linear_int8(at::Tensor x, const std::string& qtype, at::Tensor codes, at::Tensor scales,
                                 c10::optional<at::Tensor> offsets, c10::optional<at::Tensor> bias) {
#ifdef TANDEM_INT8_DOT
  const QType type = tandem::parse_qtype(qtype);
  const Blocks w = tandem::check_blocks(type, codes, scales, offsets);
  return tandem::product_in_x_dtype(x, type, w.blocks * kBlock, scales.size(0), bias, "quantized_linear_int8",
                                    [&](auto element, auto kind, const auto* b, at::Tensor& out) {
                                      multiply<decltype(kind)::value, decltype(element)>(x, w, b, out);
                                    });
#else
  TORCH_CHECK(false, "quantized_linear_int8 needs AVX512-VNNI (with BW and VL), which this build lacks");
#endif
}
