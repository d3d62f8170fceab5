// SequentialMoe's backward: the forward's pattern with the roles swapped, each step with the whole GPU,
// one after the other on the rank's stream. The engine pulls the output-gradient rows (layer 0's pull,
// comm_only), ships the gate partials and the input-gradient rows (layer 1's combine, comm_only, unit
// weights) and finishes; cuBLAS does the four GEMMs. See baselines.hpp and expert_gemm.hpp.
#include "baselines/backward_driver.hpp"
#include "baselines/sequential_state.hpp"
#include "comet/cuda_check.hpp"

namespace comet {

namespace {

void require_grad_prepared(bool prepared, int rank) {
  COMET_REQUIRE(prepared, "SequentialMoe: rank ", rank, " has not been prepared for the backward (call prepare_grad)");
}

void require_weight_grads(const RankGrad& grad, int rank) {
  COMET_REQUIRE(grad.dw0 && grad.dw1, "SequentialMoe::backward: rank ", rank, " passes a null dw0 / dw1");
}

void require_training(const MoeEngine& moe) {
  COMET_REQUIRE(moe.options().training,
                "SequentialMoe::backward: the FusedMoe was not built with MoeOptions::training");
}

}  // namespace

void SequentialMoe::prepare_grad(int rank) {
  RankState& s = state(rank);
  require_training(moe_);
  COMET_REQUIRE(s.layers.has_weights(), "SequentialMoe: no weights set for rank ", rank,
                " (set them through the baseline)");
  s.grad_prepared = false;
  moe_.prepare_grad(rank);
  s.read_counts(moe_);
  s.layers.ensure_scratch(moe_);
  s.grad_problems1.assign(s.layers.grad_gemm1(moe_, rank), s.blocks, s.stream);
  s.grad_problems0.assign(s.layers.grad_gemm0(moe_, rank), s.blocks, s.stream);
  s.grad_prepared = true;
}

void SequentialMoe::grad_dispatch(int rank) {
  require_grad_prepared(state(rank).grad_prepared, rank);
  if (moe_.parallel().world() == 1) return;  // every row is local and prepare_grad put it in G
  moe_.grad_layer1(rank, LayerMode::comm_only, baselines::all_sm_variant(moe_, 0, options_.tile_n));
}

void SequentialMoe::grad_gemm1(int rank) {
  RankState& s = state(rank);
  require_grad_prepared(s.grad_prepared, rank);
  s.grad_problems1.run(s.handle.get(), options_.grad1);
}

void SequentialMoe::grad_activation(int rank) {
  RankState& s = state(rank);
  require_grad_prepared(s.grad_prepared, rank);
  baselines::launch_activation_backward(s.layers.grad_activation(moe_, rank), s.max_rows, s.stream);
}

void SequentialMoe::grad_gates(int rank) {
  require_grad_prepared(state(rank).grad_prepared, rank);
  moe_.grad_gates(rank);  // the activation backward wrote each row's whole sum into column 0
}

void SequentialMoe::grad_wgrad1(int rank, const RankGrad& grad, const BackwardOptions& options) {
  RankState& s = state(rank);
  require_grad_prepared(s.grad_prepared, rank);
  require_weight_grads(grad, rank);
  baselines::run_weight_grads(s.handle.get(), s.stream, s.layers.wgrad1(moe_, rank, grad.dw1, options.grad_type),
                              s.blocks, options.accumulate);
}

void SequentialMoe::grad_gemm0(int rank) {
  RankState& s = state(rank);
  require_grad_prepared(s.grad_prepared, rank);
  s.grad_problems0.run(s.handle.get(), options_.grad0);
}

void SequentialMoe::grad_combine(int rank) {
  require_grad_prepared(state(rank).grad_prepared, rank);
  moe_.grad_layer0(rank, LayerMode::comm_only, baselines::all_sm_variant(moe_, 1, options_.tile_n));
}

void SequentialMoe::grad_wgrad0(int rank, const RankGrad& grad, const BackwardOptions& options) {
  RankState& s = state(rank);
  require_grad_prepared(s.grad_prepared, rank);
  require_weight_grads(grad, rank);
  baselines::run_weight_grads(s.handle.get(), s.stream, s.layers.wgrad0(moe_, rank, grad.dw0, options.grad_type),
                              s.blocks, options.accumulate);
}

void SequentialMoe::grad_layer1(int rank, const RankGrad& grad, const BackwardOptions& options) {
  grad_dispatch(rank);
  grad_gemm1(rank);
  grad_activation(rank);
  grad_gates(rank);
  grad_wgrad1(rank, grad, options);  // reads gate . hidden, which the activation backward just wrote
}

void SequentialMoe::grad_layer0(int rank, const RankGrad& grad, const BackwardOptions& options) {
  grad_gemm0(rank);
  grad_combine(rank);
  grad_wgrad0(rank, grad, options);
}

void SequentialMoe::backward(const std::vector<RankGrad>& grads, const BackwardOptions& options) {
  baselines::drive_backward(moe_, "SequentialMoe", grads, [&](int rank, const RankGrad& grad) {
    prepare_grad(rank);
    grad_layer1(rank, grad, options);
    grad_layer0(rank, grad, options);
  });
}

}  // namespace comet
