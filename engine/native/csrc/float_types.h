// The element types the native kernels take (float32 and bfloat16), shared by every kernel file.
#pragma once

#include <torch/extension.h>

namespace tandem {

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

// Rounds a float the way a PyTorch op producing dtype T would.
template <typename T>
inline float round_as(float v) { return to_float(static_cast<T>(v)); }

// Calls fn(T{}) with T the C++ type of `x`'s dtype; other dtypes are an error naming the op.
template <typename Fn>
void dispatch_float_bf16(const torch::Tensor& x, const char* op, Fn&& fn) {
  if (x.scalar_type() == torch::kFloat) {
    fn(float{});
  } else if (x.scalar_type() == torch::kBFloat16) {
    fn(c10::BFloat16{});
  } else {
    TORCH_CHECK(false, op, " supports float32 and bfloat16");
  }
}

}  // namespace tandem
