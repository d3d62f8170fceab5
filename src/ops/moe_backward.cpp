// MoeEngine's backward (moe_engine.hpp: the steps). The gradient of combine is a dispatch and the
// gradient of dispatch is a combine, so the backward runs the forward's two fused kernels with other
// operands, on the forward's plan (same routing, same rows):
//   grad_layer1  layer 0's kernel: pull the output-gradient rows G (as layer 0 pulls tokens), D = G W1_e
//                (W1 read N-major), epilogue: gate partials <h, D>, dPre = act'(z) . g D, h <- g h
//   grad_layer0  layer 1's kernel: dA = dPre W0_e (W0 read N-major), combine with unit weights (the
//                tokens' owners sum the k slots and the TP shards, as for the forward's output)
//   weights      dW1_e = G_e^T (g h)_e and dW0_e = dPre_e^T A_e: one grouped GEMM each, K over the
//                expert's rows (weight_grad_kernel.cuh)
// Saved by the forward (MoeOptions::training): A (the gathered tokens, kept anyway), the hidden rows, the
// pre-activations (one buffer more: R x N0_s bf16), the plan and the staged routing.
#include "comet/cuda_check.hpp"
#include "comet/footprint.hpp"
#include "kernels/fused_layers.hpp"
#include "kernels/grad_rows.hpp"
#include "kernels/local_rows.hpp"
#include "ops/moe_engine.hpp"
#include "ops/launch_schedule.hpp"
#include "ops/rank_state.hpp"

namespace comet {

namespace {

constexpr int kTileM = kernels::kTileM;

bool aligned(const void* p, size_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

}  // namespace

int MoeEngine::w0_shard_rows() const {
  return is_gated(shape_.act) ? 2 * par_.ffn_shard(shape_) : par_.ffn_shard(shape_);
}

// Gate-partial columns per row (footprint.hpp: gate_partial_columns): activation_grad sums each row
// whole into column 0; the fused epilogue (BackwardOptions::fused_activation) writes one per N-block of
// the backward of layer 1.
int MoeEngine::gate_blocks() const { return gate_partial_columns(shape_, par_); }

const PlannedLaunch& MoeEngine::grad_plan(int layer, RankState& s, LayerMode mode, const LayerRequest& request,
                                          TimedLaunch& timed) const {
  // Launches 2 and 3 of the planner (comet/tune.hpp): their own table keys, else the cost model with
  // the backward's GEMM shapes (N = F/tp for the backward of layer 1, K = W0 rows for that of layer 0).
  return checked_plan(s, layer == 1 ? 2 : 3, mode, request, timed);
}

void MoeEngine::check_grad(int rank, const RankGrad& g) const {
  COMET_REQUIRE(!team_.closed(), "FusedMoe::backward: the team is closed (IpcTeam::close): no call may run on it");
  const RankState& s = compute_state(rank);
  COMET_REQUIRE(options_.training, "FusedMoe::backward: the layer was built without MoeOptions::training");
  COMET_REQUIRE(s.saved, "FusedMoe::backward: rank ", rank,
                " has no forward to differentiate: backward needs a whole forward since the last backward "
                "(the backward consumes the forward's saved activations)");
  COMET_REQUIRE(s.tokens == 0 || (g.dout && g.dx && g.dgates), "FusedMoe::backward: rank ", rank,
                " passes a null dout/dx/dgates pointer");
  COMET_REQUIRE(g.dw0 && g.dw1, "FusedMoe::backward: rank ", rank, " passes a null dw0/dw1 pointer");
  COMET_REQUIRE(aligned(g.dout, 16) && aligned(g.dx, 16) && aligned(g.dw0, 16) && aligned(g.dw1, 16) &&
                    aligned(g.dgates, 4),
                "FusedMoe::backward: rank ", rank, ": dout, dx, dw0 and dw1 must be 16-byte aligned");
}

void MoeEngine::stage_grad(int rank, const RankGrad& g) {
  check_grad(rank, g);
  RankState& s = compute_state(rank);
  s.saved = false;
  s.dout = g.dout;
  if (s.tokens == 0) return;
  COMET_CUDA_CHECK(cudaMemcpyAsync(team_.local_ptr(x_sym_, rank), g.dout, size_t(s.tokens) * shape_.hidden * 2,
                                   cudaMemcpyDefault, s.stream));
}

void MoeEngine::prepare_grad(int rank) {
  RankState& s = compute_state(rank);
  kernels::advance_epoch(s.sync.epoch, s.stream);
  const PlanView plan = s.plan.view();
  const int H = shape_.hidden, El = par_.local_experts(shape_);
  // The weight gradients run K over whole tiles: the padding rows of both of their operands must be
  // zero (not stale rows that could hold anything). The epilogue of grad_layer1 zeroes those of dPre
  // and of the hidden rows; these are G's and A's.
  kernels::zero_padding_rows(s.grad_rows, H, El, plan, s.stream);
  kernels::zero_padding_rows(s.a, H, El, plan, s.stream);
  s.gate_partial_blocks = 1;  // what activation_grad writes; the fused epilogue's launch says otherwise
  if (s.tokens > 0) kernels::scatter_local(s.dout, s.grad_rows, H, shape_.topk, s.tokens * shape_.topk, plan, s.stream);
}

void MoeEngine::grad_layer1(int rank, LayerMode mode, const LayerRequest& request, bool fused_activation,
                            UnitRange units) {
  RankState& s = compute_state(rank);
  COMET_REQUIRE(s.w1 || mode == LayerMode::comm_only, "FusedMoe: no weights (w1) set for rank ", rank);
  TimedLaunch timed;  // ends (MoeOptions::check_schedule) after the launches below
  const PlannedLaunch& planned = grad_plan(1, s, mode, request, timed);
  const LaunchDecision& d = planned.decision;
  s.last[2] = d;
  if (fused_activation) s.last[2].standalone_gemm = StandaloneGemm::comet;  // the epilogue is ours (below)
  kernels::GradLayer1Launch l;
  l.tile_n = d.tile_n;
  l.w1 = s.w1;
  l.ffn_shard = par_.ffn_shard(shape_);
  l.experts = par_.local_experts(shape_);
  l.rows_cap = cap_.max_rows_per_rank;
  l.d = s.d_rows;
  check_units(units, mode, "backward of layer 1");
  l.dispatch = dispatch_args(s, s.grad_rows, units);
  l.split = grid_split(s, planned, mode, 2);
  l.fused_activation = fused_activation;
  if (l.fused_activation && mode != LayerMode::comm_only) {
    // The epilogue writes dPre and g h on the real rows only (activation_grad zeroes the padding rows
    // as it goes); the padding rows the forward left must not hold NaN for the weight gradients.
    const PlanView plan = s.plan.view();
    kernels::zero_padding_rows(s.pre, w0_shard_rows(), l.experts, plan, s.stream);
    kernels::zero_padding_rows(s.hid, l.ffn_shard, l.experts, plan, s.stream);
  }
  if (l.fused_activation) {
    l.act = kernels::epilogue_op(shape_.act);
    l.pre = s.pre;
    l.pre_ld = w0_shard_rows();
    l.hid = s.hid;
    l.gate_partials = s.gate_partials;
    l.gate_ld = gate_blocks();
    l.topk = shape_.topk;
  }
  auto launch = [&](const auto& x) { launch_fused(s, x); };
  run_schedule(l, d, /*pull=*/true, par_.world(), launch, [&](const auto& x) {
    // The fused activation backward lives in our kernel's epilogue; a plain D = G W1_e may be CUTLASS's.
    if (l.fused_activation) return launch(x);
    s.last[2].standalone_gemm =
        standalone_gemm(s, d.standalone_gemm, s.grad_rows, shape_.hidden, l.w1, /*w_kn=*/true, l.ffn_shard, l.d);
    if (s.last[2].standalone_gemm == StandaloneGemm::comet) launch(x);
  });
  if (mode == LayerMode::comm_only) return;
  if (l.fused_activation) {  // the epilogue did the activation's backward, one partial per N-block
    s.gate_partial_blocks = (l.ffn_shard + d.tile_n - 1) / d.tile_n;
    return;
  }
  // The activation's backward over D, the saved pre-activations and hidden rows (whole-row gate
  // partials in column 0).
  kernels::ActivationGradArgs a;
  a.d = s.d_rows;
  a.pre = s.pre;
  a.pre_ld = w0_shard_rows();
  a.hid = s.hid;
  a.ffn_shard = l.ffn_shard;
  a.gate_partials = s.gate_partials;
  a.gate_ld = gate_blocks();
  a.act = kernels::epilogue_op(shape_.act);
  a.topk = shape_.topk;
  a.local_experts = l.experts;
  a.rows_cap = l.rows_cap;
  a.plan = s.plan.view();
  kernels::activation_grad(a, s.stream);
}

void MoeEngine::grad_gates(int rank) {
  RankState& s = compute_state(rank);
  kernels::ShipGateGradsArgs a{};
  a.partials = s.gate_partials;
  a.partial_ld = gate_blocks();
  a.blocks = s.gate_partial_blocks;
  a.peer_recv = reinterpret_cast<float* const*>(nvshmem_transport() ? s.own_gate_recv
                                                                     : team_.peer_ptrs(gate_recv_sym_, rank));
  a.rank = rank;
  a.topk = shape_.topk;
  a.max_tokens = cap_.max_tokens_per_rank;
  a.max_rows = cap_.max_rows_per_rank;
  a.plan = s.plan.view();
  ship_gate_grads(s, a);
}

void MoeEngine::grad_weights1(int rank, const RankGrad& g, const BackwardOptions& o) {
  RankState& s = compute_state(rank);
  grad_weights1_on(s, g, o, s.stream);
}
void MoeEngine::grad_weights0(int rank, const RankGrad& g, const BackwardOptions& o) {
  RankState& s = compute_state(rank);
  grad_weights0_on(s, g, o, s.stream);
}

// dW1_e = G_e^T (g h)_e: P = G [rows][H], Q = the gated hidden rows [rows][F_s].
void MoeEngine::grad_weights1_on(RankState& s, const RankGrad& g, const BackwardOptions& o, cudaStream_t stream) {
  weight_grad(s, s.grad_rows, shape_.hidden, s.hid, par_.ffn_shard(shape_), g.dw1, o, 0, stream);
}

// dW0_e = dPre_e^T A_e: P = dPre [rows][N0_s] (over the pre-activations since grad_layer1), Q = A [rows][H].
void MoeEngine::grad_weights0_on(RankState& s, const RankGrad& g, const BackwardOptions& o, cudaStream_t stream) {
  weight_grad(s, s.pre, w0_shard_rows(), s.a, shape_.hidden, g.dw0, o, 1, stream);
}

void MoeEngine::weight_grad(const RankState& s, const void* p, int p_cols, const void* q, int q_cols, void* out,
                            const BackwardOptions& o, int launch, cudaStream_t stream) const {
  // MoeOptions::cublas_backward: cuBLAS per expert, where the caller left the kernel to the planner.
  if (s.cublas_rows && o.weight_grad_kernel == WeightGradKernel::automatic)
    return s.cublas->weight_grads(stream, *s.cublas_rows, p, p_cols, q, q_cols, out, o.grad_type == GradType::f32,
                                  o.accumulate);
  const PlanView plan = s.plan.view();
  kernels::WeightGradLaunch l;
  l.p = p;
  l.p_cols = p_cols;
  l.q = q;
  l.q_cols = q_cols;
  l.rows_cap = cap_.max_rows_per_rank;
  l.experts = par_.local_experts(shape_);
  l.expert_offset = plan.expert_offset;
  l.expert_rows = plan.expert_rows;
  l.out = out;
  l.out_f32 = o.grad_type == GradType::f32;
  l.accumulate = o.accumulate;
  l.kernel = planner_.weight_grad_kernel(s.tokens, o.weight_grad_kernel, q_cols);
  if (l.kernel != WeightGradKernel::persistent) {  // launch 0 (dW1) and 1 (dW0): a workspace each (they may overlap)
    l.workspace_bytes = s.wgrad_workspace_bytes;
    l.workspace = static_cast<char*>(s.wgrad_workspace) + size_t(launch) * l.workspace_bytes;
  }
  kernels::launch_weight_grad(l, stream);
}

void MoeEngine::grad_layer0(int rank, LayerMode mode, const LayerRequest& request, UnitRange units) {
  RankState& s = compute_state(rank);
  TimedLaunch timed;  // ends (MoeOptions::check_schedule) after the launches
  run_grad_layer0(s, grad_plan(0, s, mode, request, timed), mode, units);
}

void MoeEngine::run_grad_layer0(RankState& s, const PlannedLaunch& planned, LayerMode mode, UnitRange units) {
  COMET_REQUIRE(s.w0 || mode == LayerMode::comm_only, "FusedMoe: no weights (w0) set for rank ", s.rank);
  LaunchDecision d = planned.decision;
  if (s.cublas_rows) d.one_launch = false;  // cuBLAS's GEMM is a launch of its own
  s.last[3] = d;
  const int H = shape_.hidden;
  kernels::GradLayer0Launch l;
  l.tile_n = d.tile_n;
  l.dpre = s.pre;
  l.n0 = w0_shard_rows();
  l.w0 = s.w0;
  l.experts = par_.local_experts(shape_);
  l.rows_cap = cap_.max_rows_per_rank;
  l.y = s.y;
  l.tile_done = s.sync.tile_done;
  check_units(units, mode, "backward of layer 0");
  l.combine = combine_args(s, d.tile_n, units, /*unit_weights=*/true);
  l.split = grid_split(s, planned, mode, 3);
  auto launch = [&](const auto& x) { launch_fused(s, x); };
  run_schedule(l, d, /*pull=*/false, par_.world(), launch, [&](const auto& x) {
    // dA = dPre W0_e
    s.last[3].standalone_gemm = standalone_gemm(s, d.standalone_gemm, l.dpre, l.n0, l.w0, /*w_kn=*/true, H, l.y);
    if (s.last[3].standalone_gemm == StandaloneGemm::comet) launch(x);
  });
}

void MoeEngine::finish_grad(int rank, const RankGrad& g) {
  RankState& s = compute_state(rank);
  // The routing as the forward staged it (int32 ids): the caller's ids need not live this long.
  const RoutingBufferLayout layout{cap_.max_tokens_per_rank, shape_.topk};
  const int32_t* ids = layout.view(team_.local_ptr(routing_sym_, rank)).ids;
  kernels::final_reduce(final_reduce_args(s, ids, /*ids_64=*/false, g.dx, s.tokens), s.stream);

  kernels::ReduceGateGradsArgs r{};
  r.recv = static_cast<const float*>(team_.local_ptr(gate_recv_sym_, rank));
  r.ids = ids;
  r.ids_64 = false;
  r.dgates = g.dgates;
  r.tokens = s.tokens;
  r.topk = shape_.topk;
  r.max_tokens = cap_.max_tokens_per_rank;
  r.tp = par_.tp;
  r.local_experts = par_.local_experts(shape_);
  r.num_experts = shape_.num_experts;
  r.failure = call_failure(s);
  kernels::reduce_gate_grads(r, s.stream);
  gather_peer_failures(s);  // after the reduces that read the words
}

void MoeEngine::grad_steps(int rank, const RankGrad& g, const BackwardOptions& o, const LayerRequest& request1,
                           const LayerRequest& request0) {
  RankState& s = compute_state(rank);
  // MoeOptions::cublas_backward: the standalone GEMMs below run cuBLAS with the rows the forward read
  // back (this waits for that copy; an empty result keeps the device-shaped kernels).
  s.cublas_rows.reset();
  if (s.cublas_backward) {
    ExpertRows rows;
    if (s.host_counts.wait(cap_.max_rows_per_rank, rows)) s.cublas_rows = std::move(rows);
  }
  struct Reset {
    RankState& s;
    ~Reset() { s.cublas_rows.reset(); }
  } reset{s};
  prepare_grad(rank);
  grad_layer1(rank, LayerMode::fused, request1, o.fused_activation);
  grad_gates(rank);
  // MoeOptions::check_schedule times the backward of layer 0 with the weight gradients, on whichever
  // stream they run (beside a fused split, after the sequential schedule): the span either choice takes.
  TimedLaunch timed;
  const PlannedLaunch& planned0 = grad_plan(0, s, LayerMode::fused, request0, timed);
  if (planned0.decision.schedule == Schedule::sequential) {
    // No comm blocks to hide: grad_layer0 is a GEMM launch and then a combine launch on every SM. Beside
    // them, the weight gradients' persistent blocks take the SMs the GEMM's tail frees, and the combine
    // then waits for those blocks to finish all their tiles: 2-5 ms lost at 16384 tokens (TP 8, device
    // link, H200). So they run after it.
    run_grad_layer0(s, planned0, LayerMode::fused, {});
    grad_weights1_on(s, g, o, s.stream);
    grad_weights0_on(s, g, o, s.stream);
    return;
  }
  // dW1 and dW0 need only what grad_layer1 wrote: on the side stream, beside grad_layer0, whose
  // combine then overlaps them (one launch, first, so the fused kernel's grid is resident first).
  COMET_CUDA_CHECK(cudaEventRecord(s.side_fork, s.stream));
  run_grad_layer0(s, planned0, LayerMode::fused, {});
  COMET_CUDA_CHECK(cudaStreamWaitEvent(s.side, s.side_fork, 0));
  grad_weights1_on(s, g, o, s.side);
  grad_weights0_on(s, g, o, s.side);
  COMET_CUDA_CHECK(cudaEventRecord(s.side_join, s.side));
  COMET_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.side_join, 0));
}

LayerRequest MoeEngine::backward_request(int launch) const {
  // The backward's launches follow the forward's kernel of their kind (launch 2 is layer 0's kernel,
  // 3 layer 1's), except a forced tile the backward was not compiled with (192): that is the planner's,
  // and layer 0's m order.
  LayerRequest r = launch == 2 ? options_.layer0 : options_.layer1;
  if (r.tile_n && !kernels::is_supported_tile_n(*r.tile_n, launch)) r.tile_n.reset();
  // The NVSHMEM transport's backward has one width (transport_request sets it).
  if (r.tile_n && nvshmem_transport() && *r.tile_n != kNvshmemGradTileN) r.tile_n.reset();
  // m order is layer 0's fused launch's alone (the planner refuses it elsewhere): launch 2 runs layer 0's
  // kernel in arrival order. Without this, a training layer with layer0.m_order threw at its backward
  // (fuzz family 125 in the GPU suite, on the H200 at c76ffa9).
  r.m_order.reset();
  return r;
}

void MoeEngine::backward(const std::vector<RankGrad>& grads, const BackwardOptions& o) {
  const std::vector<int> local = team_.local_ranks();
  COMET_REQUIRE(grads.size() == local.size(), "FusedMoe::backward: ", grads.size(), " gradients for ", local.size(),
                " local ranks");
  for (size_t i = 0; i < local.size(); ++i) check_grad(local[i], grads[i]);  // all refusals before any work
  for (size_t i = 0; i < local.size(); ++i) stage_grad(local[i], grads[i]);
  team_.barrier();  // every rank's output gradients are in its exported buffer
  const LayerRequest bl1 = backward_request(2), bl0 = backward_request(3);
  for (size_t i = 0; i < local.size(); ++i) {
    grad_steps(local[i], grads[i], o, bl1, bl0);
    publish_failure(local[i]);
  }
  team_.barrier();  // every partial row of dx and of the gate gradients is in its owner's receive slots
  for (size_t i = 0; i < local.size(); ++i) finish_grad(local[i], grads[i]);
}

void MoeEngine::backward_on(const std::vector<RankGrad>& grads, cudaStream_t stream, const BackwardOptions& o) {
  fork(stream);
  backward(grads, o);
  join(stream);
  if (options_.checking) sync_and_check();
}

void* MoeEngine::pre_activation(int rank) const { return compute_state(rank).pre; }
void* MoeEngine::grad_gathered(int rank) const { return compute_state(rank).grad_rows; }
float* MoeEngine::gate_partials(int rank) const { return compute_state(rank).gate_partials; }
bool MoeEngine::cublas_backward(int rank) const { return compute_state(rank).cublas_backward; }

void FusedMoe::backward(const RankGrad& grad, cudaStream_t stream, const BackwardOptions& options) {
  COMET_REQUIRE(engine_->team().local_ranks().size() == 1, "FusedMoe::backward(grad, stream): this process drives ",
                engine_->team().local_ranks().size(), " ranks; pass one RankGrad per rank");
  engine_->backward_on({grad}, stream, options);
}

void FusedMoe::backward(const std::vector<RankGrad>& grads, cudaStream_t stream, const BackwardOptions& options) {
  engine_->backward_on(grads, stream, options);
}

}  // namespace comet
