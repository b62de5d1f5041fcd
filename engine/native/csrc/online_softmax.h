// The online softmax step the attention kernels take per row and tile of keys: the row's running max
// and sum move to the new tile, what was accumulated so far is rescaled to the new max, and the tile's
// scores become the probabilities P·V then accumulates. Scores past `visible` (keys the row may not see,
// or past the tile's end) get probability 0; the loop runs over all `count` of them so that a fixed count
// vectorises whole.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tandem {

// s: [count] scores in, probabilities out; returns the factor by which the row's P·V so far must be
// rescaled (the caller does it: a kernel holding the accumulator in registers does it on the way in).
inline float softmax_step(float* s, int64_t count, int64_t visible, float& row_max, float& row_sum) {
  float m = row_max;
  for (int64_t j = 0; j < visible; ++j) m = std::max(m, s[j]);
  const float alpha = std::exp(row_max - m);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < count; ++j) {
    const float e = std::exp(s[j] - m);
    s[j] = j < visible ? e : 0.f;
    sum += s[j];
  }
  row_sum = row_sum * alpha + sum;
  row_max = m;
  return alpha;
}

// s: [count] scores in, probabilities out; acc: [dim] the row's P·V so far, rescaled here.
inline void online_softmax_tile(float* s, int64_t count, int64_t visible, float& row_max, float& row_sum,
                                float* acc, int64_t dim) {
  const float alpha = softmax_step(s, count, visible, row_max, row_sum);
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) acc[d] *= alpha;
}

}  // namespace tandem
