// The baselines' activation between their two cuBLAS GEMMs: GEMM0's output rows c [rows][ldc] (bf16)
// -> the hidden rows of FusedMoe [rows][ffn_shard], for the rows of source positions
// [pos_begin, pos_end) of every local expert (read from the device plan, so no host copy is needed).
//   swiglu: c's columns are W0's interleaved rows (weight_layout.hpp): hidden column f is
//           silu(c[(f/8)*16 + f%8]) * c[(f/8)*16 + 8 + f%8]
//   gelu (tanh form) / silu: hidden = act(c), elementwise
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "comet/shape.hpp"

namespace comet::baselines {

struct ActivationArgs {
  const void* c = nullptr;  // [rows_cap][ldc] bf16
  int ldc = 0;              // W0 rows of the shard: 2 F_s (swiglu) or F_s
  void* hidden = nullptr;   // [rows_cap][ffn_shard] bf16
  int ffn_shard = 0;
  Activation act = Activation::swiglu;
  const int32_t* segment_offset = nullptr;  // device plan arrays [E_l * W]
  const int32_t* segment_rows = nullptr;
  int world = 1;
  int local_experts = 0;
  int pos_begin = 0;  // source positions [pos_begin, pos_end)
  int pos_end = 0;
};

// max_rows: the most rows any expert has in the position range (sizes the grid; 0 launches nothing).
void launch_activation(const ActivationArgs& args, int max_rows, cudaStream_t stream);

}  // namespace comet::baselines
