// What the kernel files take from torch: its Tensor (with TORCH_CHECK and the dtype constants), the three
// factories they call and at::parallel_for. Not <torch/extension.h>: that brings pybind11 and the whole C++
// frontend, and each file including it took ~50 s to compile on a 2-core machine (~9 s with these), paid on
// every machine's first start and by every build of another instruction set. Only bindings.cpp needs it.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
