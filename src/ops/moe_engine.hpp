// MoeEngine: the fused MoE layer step by step, for every rank this process drives. FusedMoe (the public
// API) runs it as one call on the caller's stream; the baselines, the benchmark and the tests drive the
// steps themselves (stage, prepare, layer0, layer1, finish) on the team's per-rank streams.
//
//   stage     x and routing into the rank's exported buffers (then a team barrier)
//   prepare   device plan, new epoch, local rows into A
//   layer0    dispatch + GEMM0 + activation (fused kernel; or the sequential schedule)
//   layer1    GEMM1 + weighted top-k combine into the owners' receive slots (then a team barrier)
//   finish    each rank sums its tokens' partial rows in rank order (bitwise reproducible)
//
// Internal: not a stable interface.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "comet/device_plan.hpp"
#include "comet/fused_moe.hpp"
#include "kernels/fused_layers.hpp"
#include "kernels/grad_rows.hpp"
#include "kernels/local_rows.hpp"
#include "tune/launch_planner.hpp"
#include "tune/schedule_check.hpp"

namespace comet {

class TimedLaunch;  // ops/launch_timer.hpp
struct ExpertRows;  // ops/host_plan_counts.hpp

// A sub-range of the plan's units (baselines that pipeline the layer in chunks); {-1, -1}: all.
struct UnitRange {
  int begin = -1;
  int end = -1;
  bool all() const { return begin < 0 && end < 0; }
};
// Refuses a range outside comm_only launches, or one that is not a range; `layer` names the launch.
void check_units(UnitRange units, LayerMode mode, const char* layer);

class MoeEngine {
 public:
  MoeEngine(Team& team, const MoeShape& shape, const Parallel& par, const MoeCapacity& cap, const MoeOptions& options);
  ~MoeEngine();
  MoeEngine(const MoeEngine&) = delete;
  MoeEngine& operator=(const MoeEngine&) = delete;

  void set_weights(int rank, const void* w0, const void* w1, const float* w0_scales = nullptr);

  // The whole layer for every local rank on the team's streams; batches[i] is team.local_ranks()[i]'s.
  void forward(const std::vector<RankBatch>& batches);
  // The same, ordered on `stream`: the team's streams wait for it first, and it waits for them after.
  // Which part of the layer: both layers, or layer 0 (up to the hidden rows), or layer 1 (from them).
  enum class Part { whole, layer0, layer1 };
  void forward_on(const std::vector<RankBatch>& batches, cudaStream_t stream, Part part = Part::whole);

  // ---- the steps, per local rank --------------------------------------------------------------------
  void check_batch(int rank, const RankBatch& batch) const;  // the refusals of stage, without its effects
  // What the backward's launches (2, 3) are asked: the forward's request of the same kernel.
  LayerRequest backward_request(int launch) const;
  void stage(int rank, const RankBatch& batch);
  // Builds the rank's plan for its staged batch and scatters its local rows. The plan's tiles are
  // ordered for layer 0's fused launch with `layer0` (default: options.layer0): the tuner's chunk rule
  // of that launch (wave_chunk_rule). A fused layer0() whose launch wants another rule re-runs the
  // plan's order kernel before it (a few microseconds), so the order always follows the launch.
  void prepare(int rank);
  void prepare(int rank, const LayerRequest& layer0);
  // The chunk rule of layer 0's fused launch with `layer0` for `tokens` on this rank: its adaptive
  // split's (the table's wave chunk per load class); none where options.wave_chunk is set or the launch
  // does not adapt (a forced n_comm, the sequential schedule).
  WaveChunkRule wave_chunk_rule(int tokens, const LayerRequest& layer0) const;
  // The wave chunk that launch's plan orders a batch with `rows` on this rank by.
  int plan_wave_chunk(int tokens, int rows, const LayerRequest& layer0) const;
  // A unit range (comm_only only) restricts which units are pulled (layer 0) or shipped (layer 1).
  void layer0(int rank, LayerMode mode, const LayerRequest& request, UnitRange units = {});
  void layer1(int rank, LayerMode mode, const LayerRequest& request, UnitRange units = {});
  // A failed call on this rank (its plan refused the batch, a wait timed out) raises its word in every
  // peer's failure area, before the barrier that ends the combine (kernels/peer_failure.hpp); finish
  // and finish_grad write NaN where a peer raised its word, then record it in the rank's status.
  void publish_failure(int rank);
  void finish(int rank, const RankBatch& batch);
  void advance_epoch(int rank);  // a new generation for flags (benchmarks re-running a layer)
  void set_epoch(int rank, uint64_t epoch);  // tests: start the generation anywhere (synchronises)
  // Tests: every data buffer of the rank (gathered rows, hidden, expert outputs, partials, receive
  // slots, training buffers; not the flags) filled with 0xFF bytes (NaN), so that a call must rewrite
  // everything it reads. Synchronises.
  void poison_buffers(int rank);

  // ---- backward, per local rank (after a whole forward with MoeOptions::training) ------------------
  //   stage_grad      dout into the rank's exported token buffer (then a team barrier)
  //   prepare_grad    new epoch; the rank's own dout rows into the gathered-gradient buffer G
  //   grad_layer1     pull dout rows into G + D = G W1_e (fused, layer 0's kernel; comm_only: the pull),
  //                   then the activation's backward over D: dgate partials, hidden rows *= gate,
  //                   pre-activations -> dPre (kernels/grad_rows.hpp: activation_grad); with
  //                   fused_activation (BackwardOptions) in the GEMM's epilogue instead, D never stored
  //   grad_gates      the gate-gradient partials into the owners' receive slots
  //   grad_weights1   dW1_e = G_e^T (gate . hidden)_e
  //   grad_layer0     dA = dPre W0_e + combine with unit weights (fused, layer 1's kernel; comm_only: the
  //                   combine of what is in the expert-output buffer Y) (then a team barrier)
  //   grad_weights0   dW0_e = dPre_e^T A_e
  //   finish_grad     dx (the partial rows in rank order) and dgates
  void check_grad(int rank, const RankGrad& grad) const;  // the refusals of stage_grad, without its effects
  void stage_grad(int rank, const RankGrad& grad);
  void prepare_grad(int rank);
  // units (comm_only, as in layer0 / layer1): only those units' rows are pulled / shipped (the chunked
  // baseline's stages).
  void grad_layer1(int rank, LayerMode mode, const LayerRequest& request, bool fused_activation = false,
                   UnitRange units = {});
  void grad_gates(int rank);  // each row's gate partial (column 0) to its token's owner
  void grad_weights1(int rank, const RankGrad& grad, const BackwardOptions& options);
  void grad_layer0(int rank, LayerMode mode, const LayerRequest& request, UnitRange units = {});
  void grad_weights0(int rank, const RankGrad& grad, const BackwardOptions& options);
  void finish_grad(int rank, const RankGrad& grad);
  // Everything between the two barriers of the fused backward (prepare_grad .. grad_weights0), with the
  // weight gradients on a side stream beside grad_layer0 (after it when grad_layer0 runs the sequential
  // schedule, which has no comm blocks for them to hide): request1 / request0 are the launches of
  // grad_layer1 / grad_layer0 (the forward's layer 0 / layer 1 kind of kernel).
  void grad_steps(int rank, const RankGrad& grad, const BackwardOptions& options, const LayerRequest& request1,
                  const LayerRequest& request0);
  // The whole backward, for every local rank on the team's streams / ordered on `stream`.
  void backward(const std::vector<RankGrad>& grads, const BackwardOptions& options);
  void backward_on(const std::vector<RankGrad>& grads, cudaStream_t stream, const BackwardOptions& options);
  // Synchronises; raises the first error since the last check (see FusedMoe::sync_and_check) after
  // resetting what a failed call leaves behind (recover), so that the next call is right.
  void sync_and_check();
  // FusedMoe::close: the private buffers and the symmetric ones freed (collective), later calls refused.
  void close();

  // The planner's decision for a launch of `rank`'s staged batch.
  const LaunchDecision& decision(int layer, int rank, LayerMode mode, const LayerRequest& request) const;
  const LaunchDecision& last_decision(int rank, int layer) const;
  // Comm blocks of the last launch of a layer: the kernel's adaptive pick where it adapted (synchronises
  // the rank's stream), else the decision's.
  int last_n_comm(int rank, int layer) const;
  const LaunchPlanner& planner() const { return planner_; }
  // MoeOptions::check_schedule: the schedule `rank` settled on for a launch id and token count, once it
  // has (nothing before, or without the option), and the medians (pick, sequential; ms) it came from.
  std::optional<ScheduleArm> schedule_verdict(int rank, int launch, int tokens) const;
  std::optional<std::pair<float, float>> schedule_medians(int rank, int launch, int tokens) const;
  int resident_blocks(int layer, int tile_n) const { return planner_.resident_blocks(layer, tile_n); }

  // ---- introspection -----------------------------------------------------------------------------
  const MoeShape& shape() const { return shape_; }
  const Parallel& parallel() const { return par_; }
  const MoeCapacity& capacity() const { return cap_; }
  const MoeOptions& options() const { return options_; }
  void set_dispatch_store_lag(int lag);
  // Benchmarks (comet-bench --trace): the rank's fused layer-0 launches stamp their timeline into
  // `trace` (kernels/launch_trace.hpp) until it is set back to an empty one.
  void set_layer0_trace(int rank, const kernels::LaunchTrace& trace);
  Team& team() const { return team_; }
  const DevicePlan& plan(int rank) const;
  size_t device_bytes_per_rank() const { return device_bytes_per_rank_; }
  // Per-rank device buffers (rows laid out by the plan); baselines write them with their own GEMMs.
  void* gathered(int rank) const;    // A [rows_cap][H]
  void* hidden(int rank) const;      // layer 0 output [rows_cap][F/tp]
  void* expert_out(int rank) const;  // layer 1 GEMM output [rows_cap][H]
  // Training buffers (MoeOptions::training): layer 0's pre-activations [rows_cap][N0_s] (dPre after
  // grad_layer1), the gathered output gradients G [rows_cap][H], the gate-gradient partials
  // [rows_cap][gate_blocks] fp32 (gate_blocks() == 1: whole-row sums), and D [rows_cap][F_s] of the
  // backward of layer 1 (in Y when F_s <= H, else its own buffer).
  void* pre_activation(int rank) const;
  void* grad_gathered(int rank) const;
  float* gate_partials(int rank) const;
  // Whether this rank's backward runs its standalone GEMMs with cuBLAS (MoeOptions::cublas_backward).
  bool cublas_backward(int rank) const;
  int gate_blocks() const;
  int w0_shard_rows() const;  // N0_s: W0 rows per local expert (2 F_s for swiglu)

 private:
  struct RankState;
  RankState& state(int rank) const;
  void require_open() const;  // refuses any call on a closed layer (close())
  RankState& compute_state(int rank) const;  // state(rank); refused if the layer is closed or the rank idle
  void free_symmetric();  // the layer's symmetric buffers back to the team (collective)
  void gather_peer_failures(const RankState& s);
  void run(const std::vector<RankBatch>& batches, Part part);  // forward's launches, without the check
  void recover();  // every local rank's flags zeroed and status cleared (after a reported failure)
  kernels::CallFailure call_failure(const RankState& s) const;  // what the output kernels poison on
  void fork(cudaStream_t stream);  // the ranks' streams wait for `stream`
  void join(cudaStream_t stream);  // `stream` waits for the ranks' streams
  void* alloc(RankState& s, size_t bytes);
  // Bytes of one token row that the dispatch moves: 2 H in bf16, a record (fp8.hpp) in e4m3.
  int token_row_bytes() const;
  void grad_weights1_on(RankState& s, const RankGrad& g, const BackwardOptions& o, cudaStream_t stream);
  // out_e = P_e^T Q_e over the plan's expert rows of P [rows_cap][p_cols] and Q [rows_cap][q_cols]; launch 0
  // (dW1) or 1 (dW0) picks the grouped kernel's workspace.
  void weight_grad(const RankState& s, const void* p, int p_cols, const void* q, int q_cols, void* out,
                   const BackwardOptions& o, int launch, cudaStream_t stream) const;
  // The comm roles' arguments and the final reduce's, over the rank's buffers.
  kernels::DispatchArgs dispatch_args(const RankState& s, void* rows, UnitRange units) const;
  // The transport (MoeOptions::transport): its checks and binding at construction, and the forward's
  // fused launches through the one chosen.
  bool nvshmem_transport() const { return options_.transport == DeviceTransport::nvshmem; }
  void check_transport();
  // The transport's tile where unset, for the backward's launches (2, 3); the others as asked.
  LayerRequest transport_request(int launch, const LayerRequest& request) const;
  static constexpr int kNvshmemGradTileN = 256;  // kernels::nvshmem::kTileN (checked in moe_engine.cpp)
  void register_get_targets(RankState& s);  // NVSHMEM with a NIC: the local ends of gets registered
  void launch_fused(const RankState& s, const kernels::Layer0Launch& l) const;
  void launch_fused(const RankState& s, const kernels::Layer1Launch& l) const;
  void launch_fused(const RankState& s, const kernels::GradLayer1Launch& l) const;
  void launch_fused(const RankState& s, const kernels::GradLayer0Launch& l) const;
  void ship_gate_grads(const RankState& s, const kernels::ShipGateGradsArgs& a) const;
  kernels::CombineArgs combine_args(const RankState& s, int tile_n, UnitRange units, bool unit_weights) const;
  kernels::FinalReduceArgs final_reduce_args(const RankState& s, const void* ids, bool ids_64, void* out,
                                             int tokens) const;
  void grad_weights0_on(RankState& s, const RankGrad& g, const BackwardOptions& o, cudaStream_t stream);
  // The planner's launch for the backward of `layer` (launch id 2 for layer 1, 3 for layer 0), through
  // checked_plan.
  const PlannedLaunch& grad_plan(int layer, RankState& s, LayerMode mode, const LayerRequest& request,
                                 TimedLaunch& timed) const;
  // A planned layer-0 launch's chunk rule (none where options.wave_chunk holds every batch to one chunk).
  WaveChunkRule wave_chunk_rule(const PlannedLaunch& layer0) const;
  // The planner's decision for a launch of `launch` on rank s, or, under MoeOptions::check_schedule
  // where the pick is a fused split, the schedule the check runs now (the pick or the sequential
  // schedule); a launch the check times starts its timing in `timed`, which ends it when it goes out
  // of scope: after the launch's work on the rank's stream.
  const PlannedLaunch& checked_plan(RankState& s, int launch, LayerMode mode, const LayerRequest& request,
                                    TimedLaunch& timed) const;
  // grad_layer0 on a decision made (grad_steps times it with the weight gradients beside it).
  void run_grad_layer0(RankState& s, const PlannedLaunch& planned, LayerMode mode, UnitRange units);
  // The grid split of a launch of `layer` on a rank, from the planner's decision.
  kernels::GridSplit grid_split(const RankState& s, const PlannedLaunch& planned, LayerMode mode, int layer) const;
  // A launch's standalone GEMM (LaunchDecision::standalone_gemm) on the rank's stream: out rows of expert
  // e = its rows of A [rows][k] times W_e ([k][n] if w_kn, else [n][k]). CUTLASS's grouped GEMM, or
  // cuBLAS (the pick, or the backward's rule) with the rows on the host. Returns the GEMM it ran; comet:
  // the caller runs ours (the pick is ours, or cuBLAS has no rows (graph capture, a refused plan) or
  // cannot be loaded).
  StandaloneGemm standalone_gemm(RankState& s, StandaloneGemm gemm, const void* a, int k, const void* w, bool w_kn,
                                 int n, void* out) const;
  // Whether a launch of this plan may run cuBLAS's GEMMs: the backward's rule, or the plan forward() makes
  // for layer 1 (and, training, backward() for its launches) picks StandaloneGemm::cublas.
  bool wants_host_rows(const RankState& s) const;
  // The plan's per-expert rows on the host for cuBLAS (loading cuBLAS on first use): the backward's, else
  // the copy prepare() started (started now where it did not), into `scratch`. Null: our kernel runs.
  const ExpertRows* host_rows(RankState& s, ExpertRows& scratch) const;
  // CUTLASS's grouped GEMM `gemm` (standalone_gemm's).
  void grouped_expert_gemm(const RankState& s, StandaloneGemm gemm, const void* a, int k, const void* w, bool w_kn,
                           int n, void* out) const;

  Team& team_;
  MoeShape shape_;
  Parallel par_;
  MoeCapacity cap_;
  MoeOptions options_;
  SymmetricId x_sym_, routing_sym_, recv_sym_;
  SymmetricId failed_sym_;  // [W] int32 per rank: word s raised by peer s when its call failed
  SymmetricId gate_recv_sym_{};  // training: gate-gradient partials [W][T_cap][k] fp32 from each rank
  SymmetricId staging_sym_{};    // transport nvshmem: layer 1's put staging (kernels/nvshmem/fused_nvshmem.hpp)
  LaunchPlanner planner_;
  size_t device_bytes_per_rank_ = 0;
  bool closed_ = false;
  std::vector<std::unique_ptr<RankState>> ranks_;  // by local slot
};

}  // namespace comet
