// y = x @ W^T (+ bias) for a handful of rows: the decode steps of a small batch.
//
// With few rows, a linear layer is bound by reading W once. BLAS GEMM packs W
// into its own layout first, which for 2..16 rows costs more than the product
// itself (measured here: 8 rows took 2.5x the time of 1 row). This kernel
// streams each row of W exactly once and multiplies it with every input row
// while it is in registers; the rows' partial sums live in one vector each.
//
// Shapes: x [rows, in] (rows contiguous), weight [out, in] contiguous, bias [out] or empty.
#include "tensor_api.h"
#include <cstdint>

#include "float_types.h"

namespace {

constexpr int64_t kMaxRows = 16;
constexpr int64_t kLanes = 16;        // one 512-bit vector of floats
constexpr int64_t kOutPerTask = 64;  // output features per parallel task

using tandem::to_float;

// out[m, n] for n in [n0, n1). kRows fixes the row count so acc[][] stays in registers.
template <typename T, int64_t kRows>
void rows_times_weight(const T* x, int64_t x_stride, const T* w, const T* bias, int64_t in, int64_t n0,
                       int64_t n1, T* out, int64_t out_stride) {
  const int64_t full = in / kLanes * kLanes;
  for (int64_t n = n0; n < n1; ++n) {
    const T* wn = w + n * in;
    float acc[kRows][kLanes] = {};
    for (int64_t k = 0; k < full; k += kLanes) {
      float wv[kLanes];
      for (int64_t j = 0; j < kLanes; ++j) wv[j] = to_float(wn[k + j]);
      for (int64_t m = 0; m < kRows; ++m) {
        const T* xm = x + m * x_stride + k;
#pragma omp simd
        for (int64_t j = 0; j < kLanes; ++j) acc[m][j] += wv[j] * to_float(xm[j]);
      }
    }
    const float b = bias != nullptr ? to_float(bias[n]) : 0.f;
    for (int64_t m = 0; m < kRows; ++m) {
      float s = 0.f;
      for (int64_t j = 0; j < kLanes; ++j) s += acc[m][j];
      for (int64_t k = full; k < in; ++k) s += to_float(wn[k]) * to_float(x[m * x_stride + k]);
      out[m * out_stride + n] = static_cast<T>(s + b);
    }
  }
}

template <typename T>
using RowsFn = void (*)(const T*, int64_t, const T*, const T*, int64_t, int64_t, int64_t, T*, int64_t);

template <typename T, int64_t... kRows>
RowsFn<T> pick(int64_t rows, std::integer_sequence<int64_t, kRows...>) {
  RowsFn<T> table[] = {rows_times_weight<T, kRows + 1>...};
  return table[rows - 1];
}

}  // namespace

at::Tensor small_linear(at::Tensor x, at::Tensor weight, c10::optional<at::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "x must be [rows, in] with contiguous rows");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= kMaxRows, "small_linear takes 1 to 16 rows");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == x.size(1),
              "weight must be contiguous [out, in]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "x and weight must share a dtype");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == weight.size(0) && bias->scalar_type() == x.scalar_type(),
                "bias must be contiguous [out] of the weight's dtype");
  }
  const int64_t rows = x.size(0), in = x.size(1), out_features = weight.size(0);
  auto out = at::empty({rows, out_features}, x.options());
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const RowsFn<T> fn = pick<T>(rows, std::make_integer_sequence<int64_t, kMaxRows>{});
    const T* xs = x.data_ptr<T>();
    const T* w = weight.data_ptr<T>();
    const T* b = has_bias ? bias->data_ptr<T>() : nullptr;
    T* o = out.data_ptr<T>();
    at::parallel_for(0, out_features, kOutPerTask, [&](int64_t n0, int64_t n1) {
      fn(xs, x.stride(0), w, b, in, n0, n1, o, out_features);
    });
  };
  tandem::dispatch_float_bf16(x, "small_linear", run);
  return out;
}
