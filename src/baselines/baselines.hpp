// The MoE layer the way users run it today, for side-by-side numbers with FusedMoe (same inputs, same
// outputs, same layout of every buffer). Both baselines are built ON a FusedMoe: they reuse its staging,
// device plan, buffers, its copy kernels launched in comm_only mode (dispatch = layer 0's pull, combine =
// layer 1's weighted ship) and its final reduce, and only replace the expert GEMMs by cuBLAS calls. So
// nothing but the schedule differs from comet.
//
//   SequentialMoe  (Megatron-style)  dispatch on the whole GPU, then GEMM0 + activation + GEMM1 through
//                  cuBLAS over the local experts, then combine on the whole GPU. The host reads the
//                  per-expert row counts first (a synchronisation, as Megatron's tokens_per_expert.cpu()).
//                  Its backward runs the same way: the pull of the output-gradient rows, cuBLAS D = G W1_e,
//                  the activation backward (with the gate gradients), cuBLAS dW1, dA = dPre W0_e and dW0,
//                  the combine of the input-gradient rows; the engine's own steps stage and finish it.
//   ChunkedMoe     (Tutel / FasterMoE-style coarse overlap)  a rank's remote source ranks are split into
//                  C chunks of consecutive source positions; on two streams, chunk i's GEMMs overlap
//                  chunk i+1's pull and chunk i-1's ship. The local rows (position 0) form a first stage
//                  that needs no pull. The host reads the plan once per routing (setup).
//
// Usage (every rank of a LocalTeam; an IpcTeam process passes its one rank):
//   FusedMoe moe(team, shape, par, cap);
//   SequentialMoe seq(moe);
//   seq.set_weights(r, w0, w1);   // also gives them to moe
//   seq.forward(batches);
//   seq.backward(grads);          // after a forward of a FusedMoe built with MoeOptions::training
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "ops/moe_engine.hpp"

namespace comet {

// How the per-expert GEMMs reach cuBLAS. Experts with no rows are skipped in both.
//  grouped: one cublasGemmGroupedBatchedEx call, one group (of batch 1) per expert.
//  loop:    one cublasGemmEx call per expert.
enum class GemmPath : int { grouped = 0, loop = 1 };
const char* to_string(GemmPath path);
GemmPath parse_gemm_path(const std::string& s);  // "grouped" | "loop"; throws InvalidArgument

struct SequentialOptions {
  GemmPath gemm0 = GemmPath::grouped;
  GemmPath gemm1 = GemmPath::grouped;
  GemmPath grad1 = GemmPath::grouped;  // backward D = G W1_e (the weight gradients always loop)
  GemmPath grad0 = GemmPath::grouped;  // backward dA = dPre W0_e
  int tile_n = 256;  // compiled variant of FusedMoe's kernels used for dispatch / combine (their grid size)
};

class SequentialMoe {
 public:
  explicit SequentialMoe(FusedMoe& moe, const SequentialOptions& options = {});
  ~SequentialMoe();
  SequentialMoe(const SequentialMoe&) = delete;
  SequentialMoe& operator=(const SequentialMoe&) = delete;

  // Expert weights of a local rank (layout of weight_layout.hpp); passed on to the FusedMoe as well.
  // With the FusedMoe's dtype e4m3, w0 holds e4m3 codes and w0_scales their 128 x 128 block scales
  // (FusedMoe::set_weights), and GEMM0 runs on cuBLASLt's block-scaled fp8 (fp8_expert_gemm.hpp) over
  // the records the dispatch gathered: the fp8 sequential baseline.
  void set_weights(int rank, const void* w0, const void* w1, const float* w0_scales = nullptr);

  // The whole layer for every local rank; batches[i] belongs to team.local_ranks()[i].
  void forward(const std::vector<RankBatch>& batches);

  // ---- the steps of forward(), per local rank (after moe.stage of every rank and a team barrier) ------
  // moe.prepare, then the per-expert row counts to the host: synchronises the rank's stream and raises
  // DeviceReportedError for bad routing.
  void prepare(int rank);
  void layer0(int rank);  // dispatch + GEMM0 + activation
  void layer1(int rank);  // GEMM1 + combine
  // The pieces of the layers (benchmarks time cuBLAS alone).
  void dispatch(int rank);
  void gemm0(int rank);
  void activation(int rank);
  void gemm1(int rank);
  void combine(int rank);

  // Gradients of the last forward() for every local rank (the FusedMoe must be built with
  // MoeOptions::training): moe.stage_grad, team barrier, per rank prepare_grad + grad_layer1 +
  // grad_layer0, team barrier, moe.finish_grad. The same gradients as FusedMoe::backward up to bf16
  // rounding; like it, this consumes the forward's saved activations (pre-activations and hidden rows
  // are overwritten by their gradients).
  void backward(const std::vector<RankGrad>& grads, const BackwardOptions& options = {});

  // ---- the steps of backward(), per local rank (after moe.stage_grad of every rank and a team barrier) -
  // moe.prepare_grad, then the per-expert row counts to the host again (synchronises the rank's stream):
  // the backward keeps nothing of this object's forward, so it also follows FusedMoe's own forward.
  void prepare_grad(int rank);
  void grad_layer1(int rank, const RankGrad& grad, const BackwardOptions& options);  // dispatch .. wgrad1
  void grad_layer0(int rank, const RankGrad& grad, const BackwardOptions& options);  // gemm0 .. wgrad0
  // The pieces of the backward layers, in their order (benchmarks time cuBLAS alone).
  void grad_dispatch(int rank);    // pull the output-gradient rows of remote tokens into G
  void grad_gemm1(int rank);       // D = G W1_e (into the baseline's scratch)
  void grad_activation(int rank);  // dPre over the pre-activations, gate . hidden, the gate partials
  void grad_gates(int rank);       // the gate partials to the tokens' owners
  void grad_wgrad1(int rank, const RankGrad& grad, const BackwardOptions& options);  // dW1 into grad.dw1
  void grad_gemm0(int rank);       // dA = dPre W0_e into the expert-output rows Y
  void grad_combine(int rank);     // Y's rows to the tokens' owners with unit weights
  void grad_wgrad0(int rank, const RankGrad& grad, const BackwardOptions& options);  // dW0 into grad.dw0

  // Rows of each local expert as the last prepare() or prepare_grad() read them.
  const std::vector<int>& expert_rows(int rank) const;
  SequentialOptions& options() { return options_; }
  const SequentialOptions& options() const { return options_; }

 private:
  struct RankState;
  RankState& state(int rank) const;

  MoeEngine& moe_;
  SequentialOptions options_;
  std::vector<std::unique_ptr<RankState>> ranks_;  // by local slot
};

struct ChunkedOptions {
  int chunks = 4;        // C: remote source positions 1..W-1 in C groups (at most W-1 are used)
  int comm_blocks = 16;  // blocks of each pull / ship launch; they share the GPU with cuBLAS's kernels
  GemmPath gemm0 = GemmPath::grouped;
  GemmPath gemm1 = GemmPath::grouped;
  GemmPath grad1 = GemmPath::grouped;  // the backward's D = G W1_e
  GemmPath grad0 = GemmPath::grouped;  // and dA = dPre W0_e
  int tile_n = 256;  // compiled variant of FusedMoe's comm kernels
};

// One stage of the chunked pipeline: source positions [pos_begin, pos_end), their units (pull / ship
// order) and, per local expert, their rows of the gathered buffer.
struct ChunkStage {
  int pos_begin = 0, pos_end = 0;
  int unit_begin = 0, unit_end = 0;
  std::vector<int> row_begin, row_count;  // [E_l]
};

// Stage 0 holds position 0 (the rank's own tokens, already in A after prepare); stages 1..C split the
// remote positions 1..W-1 into C groups of consecutive positions, as even as possible (C is clamped to
// W-1). Pure host function of the plan's arrays (tested on the CPU).
//   segment_offset / segment_rows: [E_l * W] as in plan.hpp; unit_src: [num_units].
std::vector<ChunkStage> plan_chunk_stages(int rank, int world, int local_experts, int chunks,
                                          const std::vector<int>& segment_offset,
                                          const std::vector<int>& segment_rows, const std::vector<int>& unit_src);

class ChunkedMoe {
 public:
  explicit ChunkedMoe(FusedMoe& moe, const ChunkedOptions& options = {});
  ~ChunkedMoe();
  ChunkedMoe(const ChunkedMoe&) = delete;
  ChunkedMoe& operator=(const ChunkedMoe&) = delete;

  void set_weights(int rank, const void* w0, const void* w1);  // passed on to the FusedMoe as well

  // The whole layer for every local rank (stage, barrier, prepare, setup, run, barrier, finish).
  void forward(const std::vector<RankBatch>& batches);

  // ---- steps, per local rank ---------------------------------------------------------------------------
  // After moe.prepare(rank): reads the rank's plan (synchronises its stream; raises DeviceReportedError
  // for bad routing) and lays out the stages for options().chunks. Valid until the routing changes.
  void setup(int rank);
  // The pipelined layer (after moe.prepare and setup): stage s's GEMM0 + activation + GEMM1 on the
  // compute stream while the rank's stream pulls the next stages and ships the finished ones.
  void run(int rank);
  // Each layer alone, pipelined over the same stages (benchmarks):
  //   layer0: pulls back to back on the rank's stream; stage s's GEMM0 + activation once s has landed.
  //   layer1: stage s's GEMM1, then its ship as soon as it is done.
  void layer0(int rank);
  void layer1(int rank);

  // Gradients of the last forward (the FusedMoe built with MoeOptions::training), pipelined over the
  // same stages (chunked_backward.cpp): stage s's pull of output-gradient rows overlaps the D = G W1_e
  // GEMM of the stage before; the activation backward runs over every row; stage s's dA = dPre W0_e then
  // overlaps the combine of the stage before; the weight gradients (cuBLAS per expert) run last, beside
  // the last combines. The same gradients as SequentialMoe::backward; like it, consumes the forward's
  // saved activations.
  void backward(const std::vector<RankGrad>& grads, const BackwardOptions& options = {});
  // Its steps, per local rank (after moe.stage_grad of every rank and a team barrier): moe.prepare_grad,
  // then the plan read and the stages (setup; synchronises the rank's stream) and the backward's GEMM
  // problems; then the pipeline.
  void prepare_grad(int rank);
  void run_backward(int rank, const RankGrad& grad, const BackwardOptions& options);

  // Remote chunks actually used by the last setup(rank) (<= options().chunks).
  int chunks(int rank) const;
  const std::vector<ChunkStage>& stages(int rank) const;
  ChunkedOptions& options() { return options_; }
  const ChunkedOptions& options() const { return options_; }

 private:
  struct RankState;
  RankState& state(int rank) const;

  MoeEngine& moe_;
  ChunkedOptions options_;
  std::vector<std::unique_ptr<RankState>> ranks_;  // by local slot
};

}  // namespace comet
