// What both baselines keep per rank around their cuBLAS GEMMs: the rank's weights, a scratch
// [rows_cap][n0], and the operands of the forward's GEMM0 / GEMM1 / activation and of the backward's
// GEMMs / activation backward over FusedMoe's buffers. The scratch holds GEMM0's output before the
// activation, except when training: then GEMM0 writes the engine's pre-activation buffer (the backward
// reads it) and the scratch holds the backward's D = G W1_e instead. Also the comm-only variants that
// stand for "the copy kernels of today's stacks".
#pragma once

#include "baselines/activation.hpp"
#include "baselines/activation_backward.hpp"
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

  // GEMM0: gathered rows [rows][H] x W0_e^T -> pre-activations [rows][n0] (pre_activation()).
  GemmOperands gemm0(const MoeEngine& moe, int rank) const;
  // GEMM1: hidden rows [rows][F_s] x W1_e^T -> expert outputs [rows][H].
  GemmOperands gemm1(const MoeEngine& moe, int rank) const;
  // Activation of the rows of source positions [pos_begin, pos_end): pre-activations -> hidden.
  ActivationArgs activation(const MoeEngine& moe, int rank, int pos_begin, int pos_end) const;

  // ---- backward (MoeOptions::training) ----------------------------------------------------------------
  // D = G W1_e: gathered output gradients [rows][H] x W1_e [H][F_s] -> scratch [rows][F_s].
  GemmOperands grad_gemm1(const MoeEngine& moe, int rank) const;
  // The activation backward of every row: D, pre -> dPre, hidden -> gate . hidden, gate partials (column 0).
  GradActivationArgs grad_activation(const MoeEngine& moe, int rank) const;
  // dA = dPre W0_e: [rows][n0] x W0_e [n0][H] -> expert outputs [rows][H] (what the combine ships).
  GemmOperands grad_gemm0(const MoeEngine& moe, int rank) const;
  // dW1_e = G_e^T (gate . hidden)_e -> dw1 [E_l][H][F_s]; dW0_e = dPre_e^T A_e -> dw0 [E_l][n0][H].
  WeightGradOperands wgrad1(const MoeEngine& moe, int rank, void* dw1, GradType type) const;
  WeightGradOperands wgrad0(const MoeEngine& moe, int rank, void* dw0, GradType type) const;

 private:
  // Where GEMM0's output lives: the engine's pre-activations when training, else the scratch.
  void* pre_activation(const MoeEngine& moe, int rank) const;

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
