// The Python module of the native CPU kernels: one entry per op in the other files.
#include <torch/extension.h>

#include <string>
#include <vector>

torch::Tensor paged_decode_attention(torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                                     torch::Tensor block_table, torch::Tensor seq_lens, double scale);
void paged_prefill_attention(torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                             torch::Tensor block_tables, torch::Tensor seq_lens, torch::Tensor query_start,
                             torch::Tensor seqs, double scale, torch::Tensor out);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps);
torch::Tensor rotary_(torch::Tensor x, int64_t num_heads, torch::Tensor cos, torch::Tensor signed_sin);
torch::Tensor silu_and_mul(torch::Tensor gate_up);
torch::Tensor small_linear(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> bias);
torch::Tensor pack_linear_weight(torch::Tensor weight);
torch::Tensor unpack_linear_weight(torch::Tensor packed, int64_t out_features);
torch::Tensor packed_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features,
                            c10::optional<torch::Tensor> bias);
void write_kv_cache(torch::Tensor key, torch::Tensor value, torch::Tensor key_cache, torch::Tensor value_cache,
                    torch::Tensor slot_mapping);

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
  m.def("write_kv_cache", &write_kv_cache, "scatter K/V rows into the paged cache (slot -1 skipped)");
}
