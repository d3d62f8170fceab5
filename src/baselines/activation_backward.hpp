// The baselines' activation backward, between the backward's two data GEMMs (D = G W1_e before it,
// dA = dPre W0_e after it), over every row of every local expert of a rank (rows from the device plan,
// so no host copy is needed). For a row with gate g (its unit and slot's), in place:
//   gate_partials[row * gate_ld] = sum_f hid[f] * D[f]   (the row's gate gradient on this F shard)
//   pre <- dPre = act'(pre) . (g D)                       (swiglu: the interleaved gate / up columns of
//                                                          activation.hpp: dz_gate = g D up silu'(gate),
//                                                          dz_up = g D silu(gate))
//   hid <- g hid                                          (what dW1_e = G_e^T (g hid)_e reads)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "comet/shape.hpp"

namespace comet::baselines {

struct GradActivationArgs {
  const void* d = nullptr;         // [rows_cap][ffn_shard] bf16: D = G W1_e
  void* pre = nullptr;             // [rows_cap][ld_pre] bf16: pre-activations in, their gradients out
  int ld_pre = 0;                  // W0 rows of the shard: 2 F_s (swiglu) or F_s
  void* hidden = nullptr;          // [rows_cap][ffn_shard] bf16: the forward's hidden rows in, g hid out
  int ffn_shard = 0;
  float* gate_partials = nullptr;  // [rows_cap][gate_ld] fp32: column 0 is written
  int gate_ld = 0;
  Activation act = Activation::swiglu;
  int topk = 0;
  int local_experts = 0;
  // The device plan's arrays (plan.hpp).
  const int32_t* expert_offset = nullptr;
  const int32_t* expert_rows = nullptr;
  const int32_t* row_unit = nullptr;
  const int32_t* row_slot = nullptr;
  const float* unit_gates = nullptr;
};

// max_rows: the most rows any local expert has (sizes the grid; 0 launches nothing).
void launch_activation_backward(const GradActivationArgs& args, int max_rows, cudaStream_t stream);

}  // namespace comet::baselines
