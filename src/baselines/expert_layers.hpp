// What both baselines keep per rank around their cuBLAS GEMMs: the rank's weights, the scratch that
// holds GEMM0's output before the activation, and the operands of GEMM0 / GEMM1 / the activation over
// FusedMoe's buffers. Also the comm-only variants that stand for "the copy kernels of today's stacks".
#pragma once

#include "baselines/activation.hpp"
#include "baselines/expert_gemm.hpp"
#include "ops/moe_engine.hpp"

namespace comet::baselines {

class ExpertLayers {
 public:
  ExpertLayers() = default;
  ~ExpertLayers();
  ExpertLayers(const ExpertLayers&) = delete;
  ExpertLayers& operator=(const ExpertLayers&) = delete;

  void set_weights(const void* w0, const void* w1);
  bool has_weights() const { return w0_ && w1_; }
  // Allocates GEMM0's output [rows_cap][n0] on first use (a rank that never runs a baseline pays nothing).
  void ensure_scratch(const MoeEngine& moe);

  // GEMM0: gathered rows [rows][H] x W0_e^T -> scratch [rows][n0].
  GemmOperands gemm0(const MoeEngine& moe, int rank) const;
  // GEMM1: hidden rows [rows][F_s] x W1_e^T -> expert outputs [rows][H].
  GemmOperands gemm1(const MoeEngine& moe, int rank) const;
  // Activation of the rows of source positions [pos_begin, pos_end): scratch -> hidden.
  ActivationArgs activation(const MoeEngine& moe, int rank, int pos_begin, int pos_end) const;

 private:
  const void* w0_ = nullptr;
  const void* w1_ = nullptr;
  void* scratch_ = nullptr;
};

// W0 rows per expert on one rank: 2 F_s for gated activations, F_s otherwise.
int w0_shard_rows(const MoeEngine& moe);

// A comm-only variant of FusedMoe's layer `layer` with `blocks` comm blocks.
LayerRequest comm_variant(int tile_n, int blocks);
// The whole GPU copies: every resident block but one (FusedMoe keeps n_comm below the resident limit).
LayerRequest all_sm_variant(const MoeEngine& moe, int layer, int tile_n);

}  // namespace comet::baselines
