// What both prefill attention kernels (paged_prefill.cpp, paged_prefill_bf16dot.h) share: the shapes they
// read, where a context row lives in the paged cache, how a step's prefill chunks split into tasks (one
// per sequence, tile of query tokens and KV head), and how the tasks are dealt out to threads.
#pragma once

#include "tensor_api.h"

#include <algorithm>
#include <cstdint>

namespace tandem {

struct PrefillShape {
  int64_t num_heads, num_kv_heads, dim, block_size, max_blocks;
};

// Context position `pos` of a sequence (its block table `table`), KV head `kv`: its `dim` elements.
template <typename T>
const T* context_row(const T* cache, const int64_t* table, int64_t pos, const PrefillShape& s, int64_t kv) {
  const int64_t block = table[pos / s.block_size], offset = pos % s.block_size;
  return cache + ((block * s.block_size + offset) * s.num_kv_heads + kv) * s.dim;
}

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

// Runs fn(task index, scratch) for tasks [0, num_tasks) on the intra-op threads, each thread with its own
// `make_scratch()`. Dealt out round-robin: a task's cost grows with its position in its sequence, so
// contiguous ranges would give one thread all the long contexts.
template <typename MakeScratch, typename Fn>
void run_round_robin(int64_t num_tasks, MakeScratch&& make_scratch, Fn&& fn) {
  const int64_t lanes = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_tasks));
  at::parallel_for(0, lanes, 1, [&](int64_t lane_begin, int64_t lane_end) {
    auto scratch = make_scratch();
    for (int64_t lane = lane_begin; lane < lane_end; ++lane) {
      for (int64_t i = lane; i < num_tasks; i += lanes) fn(i, scratch);
    }
  });
}

}  // namespace tandem
