// ChunkedMoe's backward: the forward's two-stream pipeline over the same stages, with the gradient's
// operands (baselines.hpp). The rank's stream pulls output-gradient rows and ships input-gradient rows
// stage by stage through FusedMoe's copy kernels; the compute stream runs cuBLAS:
//   rank's stream   pull 1 .. pull n-1 |                  gate partials | ship 0 | ship 1 | ...
//   compute stream  D 0 | D 1 (pull 1) | ... | activation backward | dA 0 | dA 1 | ... | dW1 | dW0
// The activation backward needs every row of D (its gate partials are whole-row sums), so it sits
// between the two halves. As in chunked_moe.cpp, every event record is enqueued before the wait on it.
#include <algorithm>

#include "baselines/activation_backward.hpp"
#include "baselines/backward_driver.hpp"
#include "baselines/chunked_state.hpp"

namespace comet {

void ChunkedMoe::prepare_grad(int rank) {
  RankState& s = state(rank);
  COMET_REQUIRE(moe_.options().training, "ChunkedMoe::backward: the FusedMoe was not built with MoeOptions::training");
  s.grad_ready = false;
  moe_.prepare_grad(rank);
  setup(rank);  // the stages of this routing (reads the plan: synchronises the rank's stream)
  const int el = moe_.parallel().local_experts(moe_.shape());
  while (int(s.grad_problems1.size()) < s.n_stages()) {
    s.grad_problems1.push_back(std::make_unique<GemmProblems>(std::max(el, 1)));
    s.grad_problems0.push_back(std::make_unique<GemmProblems>(std::max(el, 1)));
  }
  // An expert's rows are contiguous across the stages (source positions in order).
  s.all_rows.assign(el, RowBlock{});
  for (int e = 0; e < el; ++e) s.all_rows[e] = RowBlock{e, s.stages.empty() ? 0 : s.stages[0].row_begin[e], 0};
  for (int i = 0; i < s.n_stages(); ++i) {
    const ChunkStage& st = s.stages[i];
    std::vector<RowBlock> blocks;
    for (int e = 0; e < el; ++e) {
      blocks.push_back(RowBlock{e, st.row_begin[e], st.row_count[e]});
      s.all_rows[e].rows += st.row_count[e];
    }
    s.grad_problems1[i]->assign(s.layers.grad_gemm1(moe_, rank), blocks, s.compute);
    s.grad_problems0[i]->assign(s.layers.grad_gemm0(moe_, rank), blocks, s.compute);
  }
  s.all_max_rows = 0;
  for (const RowBlock& b : s.all_rows) s.all_max_rows = std::max(s.all_max_rows, b.rows);
  s.grad_ready = true;
}

void ChunkedMoe::run_backward(int rank, const RankGrad& grad, const BackwardOptions& options) {
  RankState& s = state(rank);
  COMET_REQUIRE(s.grad_ready, "ChunkedMoe: rank ", rank, " has not been prepared for the backward (prepare_grad)");
  COMET_REQUIRE(grad.dw0 && grad.dw1, "ChunkedMoe::backward: rank ", rank, " passes a null dw0 / dw1");
  s.grad_ready = false;  // the saved activations are consumed: a second pipeline needs a new forward
  const int n = s.n_stages();
  const LayerRequest comm = baselines::comm_variant(options_.tile_n, options_.comm_blocks);
  s.fork();  // the compute stream after prepare_grad's own rows of G

  // Backward of layer 1: the pulls back to back; stage i's D = G W1_e once its rows have landed.
  for (int i = 1; i < n; ++i) {
    const ChunkStage& st = s.stages[i];
    if (st.unit_end > st.unit_begin)
      moe_.grad_layer1(rank, LayerMode::comm_only, comm, false, UnitRange{st.unit_begin, st.unit_end});
    COMET_CUDA_CHECK(cudaEventRecord(s.pulled[i], s.comm));
  }
  for (int i = 0; i < n; ++i) {
    if (i > 0) s.wait(s.compute, s.pulled[i]);
    s.grad_problems1[i]->run(s.handle->get(), options_.grad1);
  }
  baselines::launch_activation_backward(s.layers.grad_activation(moe_, rank), s.all_max_rows, s.compute);
  COMET_CUDA_CHECK(cudaEventRecord(s.activated, s.compute));
  s.wait(s.comm, s.activated);
  moe_.grad_gates(rank);  // the activation backward wrote each row's whole sum into column 0

  // Backward of layer 0: stage i's dA = dPre W0_e, then its combine while stage i+1 computes.
  for (int i = 0; i < n; ++i) {
    s.grad_problems0[i]->run(s.handle->get(), options_.grad0);
    COMET_CUDA_CHECK(cudaEventRecord(s.done[i], s.compute));
    s.wait(s.comm, s.done[i]);
    const ChunkStage& st = s.stages[i];
    if (st.unit_end > st.unit_begin)
      moe_.grad_layer0(rank, LayerMode::comm_only, comm, UnitRange{st.unit_begin, st.unit_end});
  }
  // The weight gradients need only local rows: beside the last combines.
  baselines::run_weight_grads(s.handle->get(), s.compute, s.layers.wgrad1(moe_, rank, grad.dw1, options.grad_type),
                              s.all_rows, options.accumulate);
  baselines::run_weight_grads(s.handle->get(), s.compute, s.layers.wgrad0(moe_, rank, grad.dw0, options.grad_type),
                              s.all_rows, options.accumulate);
  s.join();
}

void ChunkedMoe::backward(const std::vector<RankGrad>& grads, const BackwardOptions& options) {
  baselines::drive_backward(moe_, "ChunkedMoe", grads, [&](int rank, const RankGrad& grad) {
    prepare_grad(rank);
    run_backward(rank, grad, options);
  });
}

}  // namespace comet
