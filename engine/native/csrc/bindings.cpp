// The Python module of the native CPU kernels: one entry per op in the other files.
#include <torch/python.h>  // pybind11 and the Tensor caster, without the C++ frontend of <torch/extension.h>

#include <string>
#include <vector>

at::Tensor paged_decode_attention(at::Tensor query, at::Tensor key_cache, at::Tensor value_cache,
                                  at::Tensor block_table, at::Tensor seq_lens, double scale);
void paged_prefill_attention(at::Tensor query, at::Tensor key_cache, at::Tensor value_cache,
                             at::Tensor block_tables, at::Tensor seq_lens, at::Tensor query_start,
                             at::Tensor seqs, double scale, at::Tensor out);
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
at::Tensor add_rms_norm(at::Tensor x, at::Tensor residual, at::Tensor weight, double eps);
at::Tensor rotary_(at::Tensor x, int64_t num_heads, at::Tensor cos, at::Tensor signed_sin);
at::Tensor silu_and_mul(at::Tensor gate_up);
at::Tensor small_linear(at::Tensor x, at::Tensor weight, c10::optional<at::Tensor> bias);
at::Tensor pack_linear_weight(at::Tensor weight);
at::Tensor unpack_linear_weight(at::Tensor packed, int64_t out_features);
at::Tensor packed_linear(at::Tensor x, at::Tensor packed, int64_t out_features,
                         c10::optional<at::Tensor> bias);
at::Tensor quantized_linear(at::Tensor x, const std::string& qtype, at::Tensor codes, at::Tensor scales,
                            c10::optional<at::Tensor> offsets, c10::optional<at::Tensor> bias);
bool int8_dot_built();
at::Tensor quantized_panels_linear(at::Tensor x, const std::string& qtype, at::Tensor codes, at::Tensor scales,
                                   c10::optional<at::Tensor> extra, int64_t out_features,
                                   c10::optional<at::Tensor> bias);
at::Tensor dequantize_blocks(const std::string& qtype, at::Tensor codes, at::Tensor scales,
                             c10::optional<at::Tensor> offsets);
void write_kv_cache(at::Tensor key, at::Tensor value, at::Tensor key_cache, at::Tensor value_cache,
                    at::Tensor slot_mapping);

// The vector extensions this build was compiled for (what -march and TANDEM_CPU_MAX_ISA left on).
std::vector<std::string> built_with() {
  std::vector<std::string> on;
#ifdef __AVX2__
  on.push_back("avx2");
#endif
#ifdef __FMA__
  on.push_back("fma");
#endif
#ifdef __AVX512F__
  on.push_back("avx512f");
#endif
#ifdef __AVX512BF16__
  on.push_back("avx512_bf16");
#endif
#ifdef __AVX512VNNI__
  on.push_back("avx512_vnni");
#endif
#ifdef __AMX_TILE__
  on.push_back("amx_tile");
#endif
  return on;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("built_with", &built_with, "the vector extensions compiled in, named as in /proc/cpuinfo");
  m.def("paged_decode_attention", &paged_decode_attention, "paged decode attention, one query per sequence");
  m.def("paged_prefill_attention", &paged_prefill_attention,
        "causal attention of the chunks of `seqs` over their cached prefix and themselves, into out's rows");
  m.def("rms_norm", &rms_norm, "RMSNorm of each row");
  m.def("add_rms_norm", &add_rms_norm, "residual += x in place, then RMSNorm of residual");
  m.def("rotary_", &rotary_, "rotary embedding of the first num_heads heads, in place");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up");
  m.def("small_linear", &small_linear, "x @ weight.T (+ bias) for 1 to 16 rows, streaming the weight once",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none());
  m.def("pack_linear_weight", &pack_linear_weight, "float32 [out, in] -> [panels, in, 32] for packed_linear");
  m.def("unpack_linear_weight", &unpack_linear_weight, "pack_linear_weight's inverse");
  m.def("packed_linear", &packed_linear, "x @ weight.T (+ bias), float32, over a packed weight", py::arg("x"),
        py::arg("packed"), py::arg("out_features"), py::arg("bias") = py::none());
  m.def("quantized_linear", &quantized_linear,
        "x @ weight.T (+ bias), float32, over a weight in GGUF blocks (Q8_0, Q4_0, Q4_1) widened in registers",
        py::arg("x"), py::arg("qtype"), py::arg("codes"), py::arg("scales"), py::arg("offsets") = py::none(),
        py::arg("bias") = py::none());
  m.def("int8_dot_built", &int8_dot_built, "whether quantized_panels_linear was compiled in (AVX512-VNNI)");
  m.def("quantized_panels_linear", &quantized_panels_linear,
        "x @ weight.T (+ bias) over a weight in GGUF blocks repacked into panels of 16 outputs "
        "(engine.quantized_panels), x quantized to int8 per block of 32 (VNNI dots)",
        py::arg("x"), py::arg("qtype"), py::arg("codes"), py::arg("scales"), py::arg("extra"),
        py::arg("out_features"), py::arg("bias") = py::none());
  m.def("dequantize_blocks", &dequantize_blocks, "a weight in GGUF blocks as float32 [out, in]", py::arg("qtype"),
        py::arg("codes"), py::arg("scales"), py::arg("offsets") = py::none());
  m.def("write_kv_cache", &write_kv_cache, "scatter K/V rows into the paged cache (slot -1 skipped)");
}
