// The small kernels around the backward's fused kernels (grad_rows.cu).
#pragma once

#include <cuda_runtime.h>

#include "comet/plan.hpp"
#include "kernels/layer_args.hpp"
#include "kernels/local_rows.hpp"

namespace comet::kernels {

// Zeroes the padding rows of every expert segment of a gathered buffer [rows_cap][width] bf16 (rows
// [expert_offset[e] + expert_rows[e], expert_offset[e + 1])): the weight-gradient GEMMs run K over them.
void zero_padding_rows(void* rows, int width, int local_experts, const PlanView& plan, cudaStream_t stream);

// The backward of the activation, after the GEMM D = G W1_e of the backward of layer 1 (D's rows in the
// gathered layout, bf16). For every row of the plan's expert segments, in place, with g the gate of the
// row's (token, slot):
//   gate_partials[row * gate_ld] = <h, D>           (the row's gate gradient on this F shard; y = W1 h)
//   pre <- dPre = act'(z) . (g D)                   (swiglu: dz_gate = g D up silu'(gate),
//                                                    dz_up = g D silu(gate), columns interleaved by 8)
//   hid <- g h                                      (what dW1_e = G_e^T (g h)_e reads)
// Padding rows get zeros in pre and hid: the weight-gradient GEMMs run K over whole tiles.
struct ActivationGradArgs {
  const void* d = nullptr;  // [rows_cap][ffn_shard] bf16
  void* pre = nullptr;      // [rows_cap][pre_ld] bf16: z in, dPre out
  int pre_ld = 0;           // 2 F_s (swiglu) or F_s
  void* hid = nullptr;      // [rows_cap][ffn_shard] bf16: h in, g h out
  int ffn_shard = 0;
  float* gate_partials = nullptr;  // [rows_cap][gate_ld] fp32: column 0 is written
  int gate_ld = 0;
  EpilogueOp act = EpilogueOp::swiglu;
  int topk = 0;
  int local_experts = 0;
  int rows_cap = 0;
  PlanView plan;
};
void activation_grad(const ActivationGradArgs& args, cudaStream_t stream);

// Gate gradients, step 1 (each rank): for every gathered row, the sum of its gate partials over the
// column blocks [0, blocks) in order, stored into the token owner's receive slot for this rank:
// peer_recv[owner][rank][token][slot] (fp32, [W][T_cap][k] per owner).
struct ShipGateGradsArgs {
  const float* partials;  // [rows_cap][partial_ld]
  int partial_ld;
  int blocks;
  float* const* peer_recv;  // [W] each owner's receive buffer, as seen from here
  int rank, topk, max_tokens, max_rows;
  PlanView plan;
};
void ship_gate_grads(const ShipGateGradsArgs& args, cudaStream_t stream);

// Step 2 (the owner, after a team barrier): dgates[t][j] = sum over the TP ranks of the EP group that
// holds expert ids[t][j], in rank order, of their partials (deterministic).
struct ReduceGateGradsArgs {
  const float* recv;  // this rank's receive buffer [W][T_cap][k]
  const void* ids;    // [tokens][k] int32 or int64
  bool ids_64;
  float* dgates;      // [tokens][k]
  int tokens, topk, max_tokens, tp, local_experts, num_experts;
  CallFailure failure;  // a failed call's dgates are NaN
};
void reduce_gate_grads(const ReduceGateGradsArgs& args, cudaStream_t stream);

}  // namespace comet::kernels
