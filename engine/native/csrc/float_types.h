// The element types the native kernels take (float32 and bfloat16), shared by every kernel file.
#pragma once

#include "tensor_api.h"

#include <cstdint>
#include <cstring>

namespace tandem {

// bfloat16 <-> float by plain bit operations, which the compiler vectorises (c10::BFloat16's own
// conversion kept the elementwise loops scalar: measured 2-7x slower than PyTorch's ops). The same
// results as c10: round to nearest even, and a NaN becomes the quiet NaN 0x7FC0.
inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + UINT32_C(0x7FFF) + ((u >> 16) & 1)) >> 16;
  return (u & UINT32_C(0x7FFFFFFF)) > UINT32_C(0x7F800000) ? UINT16_C(0x7FC0) : static_cast<uint16_t>(rounded);
}

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return bf16_bits_to_float(v.x); }

// A float as dtype T (bfloat16: rounded to nearest even).
template <typename T>
inline T from_float(float v) { return v; }
template <>
inline c10::BFloat16 from_float<c10::BFloat16>(float v) {
  return c10::BFloat16(float_to_bf16_bits(v), c10::BFloat16::from_bits());
}

// Rounds a float the way a PyTorch op producing dtype T would.
template <typename T>
inline float round_as(float v) { return to_float(from_float<T>(v)); }

// Calls fn(T{}) with T the C++ type of `x`'s dtype; other dtypes are an error naming the op.
template <typename Fn>
void dispatch_float_bf16(const at::Tensor& x, const char* op, Fn&& fn) {
  if (x.scalar_type() == at::kFloat) {
    fn(float{});
  } else if (x.scalar_type() == at::kBFloat16) {
    fn(c10::BFloat16{});
  } else {
    TORCH_CHECK(false, op, " supports float32 and bfloat16");
  }
}

}  // namespace tandem
