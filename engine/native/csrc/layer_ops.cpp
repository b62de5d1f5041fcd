// Elementwise layer ops for CPU, one pass over memory each where PyTorch takes
// several ops (and several dispatches, which dominate a batch-1 decode step).
//
// Every op follows the arithmetic of the Hugging Face modules it replaces,
// rounding to the model dtype where they round, so bfloat16 results match
// PyTorch's up to float summation order:
//   rms_norm       w * (x * rsqrt(mean(x^2) + eps))          (LlamaRMSNorm)
//   add_rms_norm   residual += x, then rms_norm(residual)    (the residual add before each norm)
//   rotary_        x * cos + rotate_half(x) * sin            (in place, NeoX layout)
//   silu_and_mul   silu(gate) * up
//   write_kv_cache cache[slot] = row for every slot >= 0
#include "tensor_api.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "float_types.h"

namespace {

constexpr int64_t kMaxRow = 8192;  // widest hidden size a row buffer holds
constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kElementsPerTask = 16384;  // below this a row block is not worth a second thread

using tandem::from_float;
using tandem::round_as;
using tandem::to_float;

template <typename T>
void norm_row(const T* x, const T* w, float eps, T* out, int64_t dim) {
  float xf[kMaxRow];
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < dim; ++d) {
    xf[d] = to_float(x[d]);
    sum += xf[d] * xf[d];
  }
  // In double so -ffast-math cannot swap in the approximate rsqrt instruction.
  const float r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sum / dim + eps)));
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) out[d] = from_float<T>(to_float(w[d]) * round_as<T>(xf[d] * r));
}

void check_rows(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "rows must be [tokens, dim] with contiguous rows");
  TORCH_CHECK(w.is_contiguous() && w.numel() == x.size(1), "weight must be [dim]");
  TORCH_CHECK(x.size(1) <= kMaxRow, "rows wider than 8192 are not supported");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "x and weight must share a dtype");
}

// fn(t) for every token, split over threads in blocks of at least kElementsPerTask elements.
template <typename Fn>
void for_tokens(int64_t num_tokens, int64_t row_elements, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, row_elements));
  at::parallel_for(0, num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) fn(t);
  });
}

using tandem::dispatch_float_bf16;

}  // namespace

// x: [tokens, dim] -> [tokens, dim]
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  check_rows(x, weight);
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  dispatch_float_bf16(x, "rms_norm", [&](auto zero) {
    using T = decltype(zero);
    const T* xs = x.data_ptr<T>();
    const T* w = weight.data_ptr<T>();
    T* o = out.data_ptr<T>();
    const int64_t dim = x.size(1), stride = x.stride(0);
    for_tokens(x.size(0), x.size(1), [&](int64_t t) { norm_row(xs + t * stride, w, float(eps), o + t * dim, dim); });
  });
  return out;
}

// residual += x (in place), returns rms_norm(residual). x, residual: [tokens, dim]
at::Tensor add_rms_norm(at::Tensor x, at::Tensor residual, at::Tensor weight, double eps) {
  check_rows(x, weight);
  TORCH_CHECK(residual.is_contiguous() && residual.sizes() == x.sizes(), "residual must be contiguous like x");
  TORCH_CHECK(residual.scalar_type() == x.scalar_type(), "x and residual must share a dtype");
  auto out = at::empty_like(residual);
  dispatch_float_bf16(x, "add_rms_norm", [&](auto zero) {
    using T = decltype(zero);
    const T* xs = x.data_ptr<T>();
    const T* w = weight.data_ptr<T>();
    T* res = residual.data_ptr<T>();
    T* o = out.data_ptr<T>();
    const int64_t dim = x.size(1), stride = x.stride(0);
    for_tokens(x.size(0), dim, [&](int64_t t) {
      T* r = res + t * dim;
      const T* xt = xs + t * stride;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) r[d] = from_float<T>(to_float(r[d]) + to_float(xt[d]));
      norm_row(r, w, float(eps), o + t * dim, dim);
    });
  });
  return out;
}

// Rotates the first `num_heads` heads of every token in place.
// x: [tokens, >= num_heads, head_dim] (heads and dims contiguous); cos, signed_sin: [tokens, head_dim]
// signed_sin has its first half negated, so rotate_half(x) * sin == roll(x, half) * signed_sin.
at::Tensor rotary_(at::Tensor x, int64_t num_heads, at::Tensor cos, at::Tensor signed_sin) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), "x must be [tokens, heads, dim]");
  TORCH_CHECK(num_heads <= x.size(1), "num_heads exceeds the heads of x");
  TORCH_CHECK(x.size(2) % 2 == 0 && x.size(2) <= kMaxHeadDim, "head_dim must be even and at most 256");
  TORCH_CHECK(cos.is_contiguous() && signed_sin.is_contiguous(), "cos/sin must be contiguous");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && signed_sin.scalar_type() == x.scalar_type(),
              "cos/sin must have the dtype of x");
  TORCH_CHECK(cos.numel() == x.size(0) * x.size(2), "cos/sin must be [tokens, head_dim]");
  dispatch_float_bf16(x, "rotary_", [&](auto zero) {
    using T = decltype(zero);
    T* xs = x.data_ptr<T>();
    const T* cs = cos.data_ptr<T>();
    const T* ss = signed_sin.data_ptr<T>();
    const int64_t dim = x.size(2), half = dim / 2, stride = x.stride(0);
    for_tokens(x.size(0), num_heads * dim, [&](int64_t t) {
      const T* c = cs + t * dim;
      const T* s = ss + t * dim;
      float rolled[kMaxHeadDim];  // roll(x, half): the partner of each element
      for (int64_t h = 0; h < num_heads; ++h) {
        T* row = xs + t * stride + h * dim;
        for (int64_t d = 0; d < half; ++d) {
          rolled[d] = to_float(row[d + half]);
          rolled[d + half] = to_float(row[d]);
        }
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) {
          const float a = round_as<T>(to_float(row[d]) * to_float(c[d]));
          const float b = round_as<T>(rolled[d] * to_float(s[d]));
          row[d] = from_float<T>(a + b);
        }
      }
    });
  });
  return x;
}

// gate_up: [tokens, 2 * inter] (gate first) -> [tokens, inter]
at::Tensor silu_and_mul(at::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up must be contiguous [tokens, 2 * intermediate]");
  const int64_t inter = gate_up.size(1) / 2;
  auto out = at::empty({gate_up.size(0), inter}, gate_up.options());
  dispatch_float_bf16(gate_up, "silu_and_mul", [&](auto zero) {
    using T = decltype(zero);
    const T* in = gate_up.data_ptr<T>();
    T* o = out.data_ptr<T>();
    for_tokens(gate_up.size(0), 2 * inter, [&](int64_t t) {
      const T* g = in + t * 2 * inter;
      const T* u = g + inter;
      T* ot = o + t * inter;
#pragma omp simd
      for (int64_t i = 0; i < inter; ++i) {
        const float gf = to_float(g[i]);
        ot[i] = from_float<T>(round_as<T>(gf / (1.f + std::exp(-gf))) * to_float(u[i]));
      }
    });
  });
  return out;
}

// key, value: [tokens, kv_heads, head_dim] (rows contiguous); caches: [blocks, block_size, kv_heads, head_dim]
// slot_mapping: [tokens] int64, -1 = skip.
void write_kv_cache(at::Tensor key, at::Tensor value, at::Tensor key_cache, at::Tensor value_cache,
                    at::Tensor slot_mapping) {
  const int64_t row = key_cache.size(2) * key_cache.size(3);
  TORCH_CHECK(key.stride(2) == 1 && key.stride(1) == key.size(2) && value.stride(2) == 1 &&
                  value.stride(1) == value.size(2),
              "key/value rows must be contiguous");
  TORCH_CHECK(key.size(1) * key.size(2) == row && value.size(1) * value.size(2) == row, "key/value shape mismatch");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(key.scalar_type() == key_cache.scalar_type() && value.scalar_type() == value_cache.scalar_type(),
              "key/value must have the cache dtype");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(), "slot_mapping int64");
  TORCH_CHECK(slot_mapping.numel() == key.size(0) && value.size(0) == key.size(0), "one slot per token");
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t bytes = row * key.element_size();
  auto* kc = static_cast<char*>(key_cache.data_ptr());
  auto* vc = static_cast<char*>(value_cache.data_ptr());
  const auto* k = static_cast<const char*>(key.data_ptr());
  const auto* v = static_cast<const char*>(value.data_ptr());
  const int64_t k_stride = key.stride(0) * key.element_size(), v_stride = value.stride(0) * value.element_size();
  for (int64_t t = 0; t < slot_mapping.numel(); ++t) {
    const int64_t s = slots[t];
    if (s < 0) continue;
    TORCH_CHECK(s < num_slots, "slot ", s, " is outside the cache");
    std::memcpy(kc + s * bytes, k + t * k_stride, bytes);
    std::memcpy(vc + s * bytes, v + t * v_stride, bytes);
  }
}
