// How both prefill attention kernels (paged_prefill.cpp, paged_prefill_bf16dot.h) split a step's prefill
// chunks into tasks: one per sequence, tile of query tokens and KV head.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tandem {

// Calls fn(entry of seqs, sequence, first row, rows, first context position, KV head) for each task:
// up to `tile_rows` query tokens of one sequence's chunk (its rows from `starts`, its context after the
// chunk from `lens`), against one KV head.
template <typename Fn>
void for_each_prefill_task(const int32_t* lens, const int32_t* starts, const int64_t* seqs, int64_t num_seqs,
                           int64_t num_kv_heads, int64_t tile_rows, Fn&& fn) {
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t s = seqs[i];
    const int64_t chunk = starts[s + 1] - starts[s], prefix = lens[s] - chunk;
    for (int64_t row = 0; row < chunk; row += tile_rows) {
      for (int64_t kv = 0; kv < num_kv_heads; ++kv) {
        fn(i, s, starts[s] + row, std::min(tile_rows, chunk - row), prefix + row, kv);
      }
    }
  }
}

}  // namespace tandem
