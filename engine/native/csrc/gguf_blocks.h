// A weight in GGUF blocks as the native kernels take it (the layout is engine/quantized_weight.py's): its
// type, its arrays, and their checks, shared by the float (quantized_linear.cpp) and the integer
// (quantized_panels.cpp) kernels.
#pragma once

#include "tensor_api.h"

#include <cstdint>
#include <string>

namespace tandem {

constexpr int64_t kBlock = 32;  // weights per block, in every type here
constexpr int64_t kHalf = kBlock / 2;

enum class QType { kQ8_0, kQ4_0, kQ4_1 };

struct Blocks {
  const void* codes;     // Q8_0: int8 [out, in]; Q4_*: uint8 [out, in / 2] (byte j: weight j low, j + 16 high)
  const float* scales;   // [out, blocks]
  const float* offsets;  // [out, blocks], Q4_1 only
  int64_t blocks;        // blocks per output row
};

inline QType parse_qtype(const std::string& name) {
  if (name == "Q8_0") return QType::kQ8_0;
  if (name == "Q4_0") return QType::kQ4_0;
  TORCH_CHECK(name == "Q4_1", "quantized type must be Q8_0, Q4_0 or Q4_1, got ", name);
  return QType::kQ4_1;
}

// The blocks of a weight, its shape checked against the type.
inline Blocks check_blocks(QType type, const at::Tensor& codes, const at::Tensor& scales,
                           const c10::optional<at::Tensor>& offsets) {
  TORCH_CHECK(scales.dim() == 2 && scales.is_contiguous() && scales.scalar_type() == at::kFloat,
              "scales must be contiguous float32 [out, in / 32] (the file's float16 values, widened once)");
  const int64_t out = scales.size(0), blocks = scales.size(1);
  const bool eight = type == QType::kQ8_0;
  TORCH_CHECK(codes.dim() == 2 && codes.is_contiguous() && codes.size(0) == out &&
                  codes.size(1) == blocks * (eight ? kBlock : kHalf) &&
                  codes.scalar_type() == (eight ? at::kChar : at::kByte),
              "codes must be contiguous ", eight ? "int8 [out, in]" : "uint8 [out, in / 2]", " matching the scales");
  const bool has_offsets = offsets.has_value() && offsets->defined();
  TORCH_CHECK(has_offsets == (type == QType::kQ4_1), "offsets are for Q4_1 only, and Q4_1 needs them");
  if (has_offsets) {
    TORCH_CHECK(offsets->sizes() == scales.sizes() && offsets->is_contiguous() && offsets->scalar_type() == at::kFloat,
                "offsets must be contiguous float32 shaped as the scales");
  }
  return Blocks{codes.data_ptr(), scales.data_ptr<float>(), has_offsets ? offsets->data_ptr<float>() : nullptr,
                blocks};
}

// Calls fn(std::integral_constant<QType, type>{}).
template <typename Fn>
void dispatch_qtype(QType type, Fn&& fn) {
  switch (type) {
    case QType::kQ8_0: fn(std::integral_constant<QType, QType::kQ8_0>{}); break;
    case QType::kQ4_0: fn(std::integral_constant<QType, QType::kQ4_0>{}); break;
    case QType::kQ4_1: fn(std::integral_constant<QType, QType::kQ4_1>{}); break;
  }
}

}  // namespace tandem
