// y = x @ W^T (+ bias) over a weight in GGUF blocks (Q8_0, Q4_0, Q4_1) repacked into panels of 16 outputs
// (engine/quantized_panels.py), by integer dot products, llama.cpp's way: each block of 32 activations is
// quantized to int8 with a scale of its own (d_x = max |x| / 127, to nearest even) and meets the blocks' codes
// in VPDPBUSD (AVX512-VNNI). The result differs from the float kernels' (quantized_linear.cpp) by the
// activations' rounding (a relative error of about 0.4% / sqrt(32) per block's sum): the engine offers it as a
// choice of its own.
//
// Per block of output o and row r (d: float32 scales, q: integer codes, s = d_x * sum_j qx_j):
//   Q4_1: w = d q + m       ->  d d_x sum(q qx) + m s
//   Q4_0: w = d (q - 8)     ->  d d_x sum(q qx) - 8 d s
//   Q8_0: w = d q (signed)  ->  d d_x sum(q qx); VPDPBUSD takes one unsigned operand, so the activations go
//         in as qx + 128 (1..255) and 128 sum(q), stored with the panel, is taken off.
//
// Each int32 lane of a vector is an output of its own: VPDPBUSD of the panel's 4 weights per output (64
// bytes) with 4 activation bytes broadcast to every lane adds those 4 products to 16 outputs, 8 of them cover
// a block, and the block's scales are applied once per 16 outputs. A block of 16 outputs costs 8 integer
// instructions and 4 float ones per row (the float kernel: 64 FMAs), the unpacking of the panel's nibbles (Q4)
// paid once for up to kMaxRows rows. (A kernel that summed a block of one output in one vector, then scaled
// it, spent per row and block as many float operations as the float kernel: measured here at 1 / 8 / 64 rows
// in 4.5 / 15.8 / 86 ms against these panels' 3.5 / 5.7 / 24 for the default model's Q4_1 linears; dropped.)
//
// Layout of a panel p and block b (its 16 outputs o, padded with zeros past out_features):
//   Q8_0: 512 codes, byte (k * 16 + o) * 4 + t = q(o, 4k + t), k < 8
//   Q4_*: 256 bytes, byte (k * 16 + o) * 4 + t = q(o, 4k + t) | q(o, 16 + 4k + t) << 4, k < 4
//   scales [panels, blocks, 16] float32; extra [panels, blocks, 16]: Q4_1 the offsets m (float32), Q8_0
//   128 * sum_j q(o, j) (int32), Q4_0 none.
//
// Shapes: x [rows, in] float32 or bfloat16, rows contiguous; bias [out] in x's dtype or none. The result:
// [rows, out] in x's dtype.
#include "float_types.h"
#include "gguf_blocks.h"
#include "tensor_api.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define TANDEM_INT8_PANELS 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#ifdef TANDEM_INT8_PANELS
namespace {

using tandem::kBlock;
using tandem::QType;

constexpr int64_t kPanel = 16;    // outputs per panel: one int32 lane each
constexpr int64_t kMaxRows = 8;   // rows multiplied into a block of a panel while it is unpacked
constexpr int64_t kQuads = kBlock / 4;  // 4-weight groups per block: one VPDPBUSD each

struct Panels {
  const uint8_t* codes;  // [panels, blocks, 512 or 256]
  const float* scales;   // [panels, blocks, 16]
  const void* extra;     // [panels, blocks, 16] or null (Q4_0)
  int64_t blocks, out_features;
};

// The activations of a call, quantized per block in their own order (Q8_0: + 128, as unsigned bytes).
struct QuantizedRows {
  const uint8_t* codes;  // [rows, in]
  const float* scales;   // [rows, blocks]: d_x
  const float* sums;     // [rows, blocks]: d_x * sum(qx) (Q4 only)
};

// 16 values of x from `at` as float32.
template <typename T>
inline __m512 load16(const T* at) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_loadu_ps(at);
  } else {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
}

template <QType kType, typename T>
void quantize_row(const T* x, int64_t blocks, uint8_t* codes, float* scales, float* sums) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 lo = load16(x + b * kBlock), hi = load16(x + b * kBlock + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, sign), _mm512_and_ps(hi, sign)));
    const __m512 inverse = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    // to nearest, ties to even (the rounding mode in force), as std::nearbyint and torch.round
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse));
    const __m512i offset = _mm512_set1_epi32(kType == QType::kQ8_0 ? 128 : 0);
    __m128i* at = reinterpret_cast<__m128i*>(codes + b * kBlock);
    _mm_storeu_si128(at, _mm512_cvtepi32_epi8(_mm512_add_epi32(qlo, offset)));  // (truncated: they fit a byte)
    _mm_storeu_si128(at + 1, _mm512_cvtepi32_epi8(_mm512_add_epi32(qhi, offset)));
    scales[b] = amax / 127.f;
    if (sums != nullptr) {
      sums[b] = scales[b] * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi)));
    }
  }
}

// out[r0 + r, 16 p .. 16 p + 16) for r < kRows.
template <QType kType, int64_t kRows, typename T>
void panel_rows(const Panels& w, int64_t p, const QuantizedRows& x, int64_t r0, const T* bias, T* out,
                int64_t out_stride) {
  constexpr int64_t kPanelBytes = kType == QType::kQ8_0 ? 512 : 256;  // a block of a panel's codes
  const int64_t in = w.blocks * kBlock;
  __m512 acc[kRows];
  for (int64_t r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(15);
  for (int64_t b = 0; b < w.blocks; ++b) {
    const int64_t at = p * w.blocks + b;
    const uint8_t* codes = w.codes + at * kPanelBytes;
    __m512i weights[kQuads];  // weights[k]: weights 4k..4k+3 of each output, one lane an output
    if constexpr (kType == QType::kQ8_0) {
      for (int64_t k = 0; k < kQuads; ++k) weights[k] = _mm512_loadu_si512(codes + 64 * k);
    } else {
      for (int64_t k = 0; k < kQuads / 2; ++k) {
        const __m512i both = _mm512_loadu_si512(codes + 64 * k);
        weights[k] = _mm512_and_si512(both, nibble);
        weights[k + kQuads / 2] = _mm512_and_si512(_mm512_srli_epi16(both, 4), nibble);
      }
    }
    const __m512 w_scales = _mm512_loadu_ps(w.scales + at * kPanel);
    __m512i dots[kRows];
    for (int64_t r = 0; r < kRows; ++r) dots[r] = _mm512_setzero_si512();
    for (int64_t k = 0; k < kQuads; ++k) {  // rows side by side: each row's sum is a chain of 8
#pragma GCC unroll 8
      for (int64_t r = 0; r < kRows; ++r) {
        int32_t four;
        std::memcpy(&four, x.codes + (r0 + r) * in + b * kBlock + 4 * k, sizeof four);
        const __m512i xq = _mm512_set1_epi32(four);
        dots[r] = kType == QType::kQ8_0 ? _mm512_dpbusd_epi32(dots[r], xq, weights[k])
                                        : _mm512_dpbusd_epi32(dots[r], weights[k], xq);
      }
    }
    if constexpr (kType == QType::kQ8_0) {  // the activations' + 128, times each output's code sum
      const __m512i shift = _mm512_loadu_si512(static_cast<const int32_t*>(w.extra) + at * kPanel);
      for (int64_t r = 0; r < kRows; ++r) dots[r] = _mm512_sub_epi32(dots[r], shift);
    }
    // Q4: what each block's offset adds (Q4_1: m; Q4_0: -8 d), times s
    __m512 offsets = _mm512_setzero_ps();
    if constexpr (kType == QType::kQ4_1) {
      offsets = _mm512_loadu_ps(static_cast<const float*>(w.extra) + at * kPanel);
    }
    if constexpr (kType == QType::kQ4_0) offsets = _mm512_mul_ps(w_scales, _mm512_set1_ps(-8.f));
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t xb = (r0 + r) * w.blocks + b;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r]), _mm512_mul_ps(w_scales, _mm512_set1_ps(x.scales[xb])),
                               acc[r]);  // fmt: skip
      if constexpr (kType != QType::kQ8_0) acc[r] = _mm512_fmadd_ps(offsets, _mm512_set1_ps(x.sums[xb]), acc[r]);
    }
  }
  const int64_t n0 = p * kPanel, count = std::min(kPanel, w.out_features - n0);
  for (int64_t r = 0; r < kRows; ++r) {
    alignas(64) float y[kPanel];
    _mm512_store_ps(y, acc[r]);
    T* o = out + r * out_stride + n0;
    for (int64_t j = 0; j < count; ++j) {
      o[j] = tandem::from_float<T>(y[j] + (bias != nullptr ? tandem::to_float(bias[n0 + j]) : 0.f));
    }
  }
}

template <QType kType, typename T>
using RowsFn = void (*)(const Panels&, int64_t, const QuantizedRows&, int64_t, const T*, T*, int64_t);

template <QType kType, typename T, int64_t... kRows>
RowsFn<kType, T> pick(int64_t rows, std::integer_sequence<int64_t, kRows...>) {
  RowsFn<kType, T> table[] = {panel_rows<kType, kRows + 1, T>...};
  return table[rows - 1];
}

template <QType kType, typename T>
void multiply(const at::Tensor& x, const Panels& w, const T* bias, at::Tensor& out) {
  const int64_t rows = x.size(0), in = w.blocks * kBlock, panels = (w.out_features + kPanel - 1) / kPanel;
  // The quantized activations: a buffer per calling thread, kept between calls.
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> scales, sums;
  codes.resize(rows * in);
  scales.resize(rows * w.blocks);
  sums.resize(rows * w.blocks);
  // (pointers: inside the parallel regions the thread_local names would be the worker thread's own)
  uint8_t* codes_at = codes.data();
  float *scales_at = scales.data(), *sums_at = kType == QType::kQ8_0 ? nullptr : sums.data();
  const T* xs = x.data_ptr<T>();
  const int64_t x_stride = x.stride(0);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      quantize_row<kType>(xs + r * x_stride, w.blocks, codes_at + r * in, scales_at + r * w.blocks,
                          sums_at == nullptr ? nullptr : sums_at + r * w.blocks);
    }
  });
  const QuantizedRows q{codes_at, scales_at, sums_at};
  T* o = out.data_ptr<T>();
  const int64_t out_features = w.out_features;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
        const int64_t count = std::min(kMaxRows, rows - r0);
        pick<kType, T>(count, std::make_integer_sequence<int64_t, kMaxRows>{})(w, p, q, r0, bias,
                                                                              o + r0 * out_features, out_features);
      }
    }
  });
}

Panels check_panels(QType type, const at::Tensor& codes, const at::Tensor& scales,
                    const c10::optional<at::Tensor>& extra, int64_t out_features) {
  TORCH_CHECK(scales.dim() == 3 && scales.size(2) == kPanel && scales.is_contiguous() &&
                  scales.scalar_type() == at::kFloat,
              "panel scales must be contiguous float32 [panels, blocks, 16]");
  const int64_t panels = scales.size(0), blocks = scales.size(1);
  TORCH_CHECK(out_features > (panels - 1) * kPanel && out_features <= panels * kPanel,
              "out_features must fill the last of the panels");
  const bool eight = type == QType::kQ8_0;
  TORCH_CHECK(codes.dim() == 3 && codes.size(0) == panels && codes.size(1) == blocks &&
                  codes.size(2) == (eight ? 512 : 256) && codes.is_contiguous() &&
                  codes.scalar_type() == (eight ? at::kChar : at::kByte),
              "panel codes must be contiguous ", eight ? "int8 [panels, blocks, 512]" : "uint8 [panels, blocks, 256]");
  const bool has_extra = extra.has_value() && extra->defined();
  TORCH_CHECK(has_extra == (type != QType::kQ4_0),
              "Q4_1 panels take their offsets, Q8_0 their code sums, Q4_0 nothing");
  if (has_extra) {
    TORCH_CHECK(extra->sizes() == scales.sizes() && extra->is_contiguous() &&
                    extra->scalar_type() == (eight ? at::kInt : at::kFloat),
                eight ? "Q8_0 code sums must be contiguous int32" : "Q4_1 offsets must be contiguous float32",
                " shaped as the scales");
  }
  return Panels{static_cast<const uint8_t*>(codes.data_ptr()), scales.data_ptr<float>(),
                has_extra ? extra->data_ptr() : nullptr, blocks, out_features};
}

}  // namespace
#endif

bool int8_dot_built() {
#ifdef TANDEM_INT8_PANELS
  return true;
#else
  return false;
#endif
}

at::Tensor quantized_panels_linear(at::Tensor x, const std::string& qtype, at::Tensor codes, at::Tensor scales,
                                   c10::optional<at::Tensor> extra, int64_t out_features,
                                   c10::optional<at::Tensor> bias) {
#ifdef TANDEM_INT8_PANELS
  const QType type = tandem::parse_qtype(qtype);
  const Panels w = check_panels(type, codes, scales, extra, out_features);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) == w.blocks * kBlock,
              "x must be [rows, in] with contiguous rows, in = the weight's in_features");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == out_features && bias->scalar_type() == x.scalar_type(),
                "bias must be contiguous [out] in x's dtype");
  }
  auto out = at::empty({x.size(0), out_features}, x.options());
  if (x.size(0) == 0) return out;
  tandem::dispatch_float_bf16(x, "quantized_panels_linear", [&](auto element) {
    using T = decltype(element);
    const T* b = has_bias ? bias->data_ptr<T>() : nullptr;
    tandem::dispatch_qtype(type, [&](auto kind) { multiply<decltype(kind)::value, T>(x, w, b, out); });
  });
  return out;
#else
  TORCH_CHECK(false, "quantized_panels_linear needs AVX512-VNNI (with BW and VL), which this build lacks");
#endif
}
