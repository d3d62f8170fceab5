// What ChunkedMoe keeps per rank and the steps of one stage, shared by its forward (chunked_moe.cpp)
// and its backward (chunked_backward.cpp).
#pragma once

#include <memory>
#include <vector>

#include "baselines/baselines.hpp"
#include "baselines/expert_layers.hpp"
#include "baselines/plan_readback.hpp"
#include "comet/cuda_check.hpp"

namespace comet {

using baselines::GemmProblems;
using baselines::RowBlock;

struct ChunkedMoe::RankState {
  int rank;
  cudaStream_t comm;               // the rank's team stream: FusedMoe's copy kernels run there
  cudaStream_t compute = nullptr;  // owned: cuBLAS GEMMs and the activation
  baselines::ExpertLayers layers;
  std::unique_ptr<baselines::CublasHandle> handle;
  std::vector<ChunkStage> stages;
  std::vector<std::unique_ptr<GemmProblems>> problems0, problems1;  // per stage (grown on demand)
  std::vector<int> max_rows;                                        // per stage: most rows of one expert
  std::vector<cudaEvent_t> pulled, done;                            // per stage, [W]
  cudaEvent_t forked = nullptr, joined = nullptr;
  bool ready = false;
  // The backward (chunked_backward.cpp): per stage D = G W1_e and dA = dPre W0_e; every row of each expert
  // for the activation backward and the weight gradients; the activation backward's end (compute) that
  // the gate partials' ship (rank's stream) waits for.
  std::vector<std::unique_ptr<GemmProblems>> grad_problems1, grad_problems0;
  std::vector<RowBlock> all_rows;  // [E_l]
  int all_max_rows = 0;
  cudaEvent_t activated = nullptr;
  bool grad_ready = false;

  RankState(const MoeEngine& moe, int r)
      : rank(r), comm(moe.team().stream(r)) {
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    handle = std::make_unique<baselines::CublasHandle>(compute);
    const int w = moe.parallel().world();
    pulled.assign(w, nullptr);
    done.assign(w, nullptr);
    for (auto* list : {&pulled, &done})
      for (cudaEvent_t& e : *list) COMET_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    COMET_CUDA_CHECK(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    COMET_CUDA_CHECK(cudaEventCreateWithFlags(&activated, cudaEventDisableTiming));
    COMET_CUDA_CHECK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
  }
  ~RankState() {
    if (compute) cudaStreamSynchronize(compute);
    problems0.clear();
    problems1.clear();
    grad_problems1.clear();
    grad_problems0.clear();
    handle.reset();
    for (auto* list : {&pulled, &done})
      for (cudaEvent_t e : *list)
        if (e) cudaEventDestroy(e);
    if (forked) cudaEventDestroy(forked);
    if (activated) cudaEventDestroy(activated);
    if (joined) cudaEventDestroy(joined);
    if (compute) cudaStreamDestroy(compute);
  }
  int n_stages() const { return int(stages.size()); }

  // ---- the steps of one stage, each on its stream ----------------------------------------------------
  // Pulls stage i's remote units into A (rank's stream); records pulled[i].
  void pull(MoeEngine& moe, const ChunkedOptions& o, int i) {
    const ChunkStage& st = stages[i];
    if (st.unit_end > st.unit_begin)
      moe.layer0(rank, LayerMode::comm_only, baselines::comm_variant(o.tile_n, o.comm_blocks),
                 UnitRange{st.unit_begin, st.unit_end});
    COMET_CUDA_CHECK(cudaEventRecord(pulled[i], comm));
  }
  // Weights, pre-reduces and ships stage i's finished rows to their owners (rank's stream).
  void ship(MoeEngine& moe, const ChunkedOptions& o, int i) {
    const ChunkStage& st = stages[i];
    if (st.unit_end > st.unit_begin)
      moe.layer1(rank, LayerMode::comm_only, baselines::comm_variant(o.tile_n, o.comm_blocks),
                 UnitRange{st.unit_begin, st.unit_end});
  }
  // GEMM0 + activation of stage i's rows (compute stream).
  void compute0(const MoeEngine& moe, const ChunkedOptions& o, int i) {
    problems0[i]->run(handle->get(), o.gemm0);
    baselines::launch_activation(layers.activation(moe, rank, stages[i].pos_begin, stages[i].pos_end), max_rows[i],
                                 compute);
  }
  // GEMM1 of stage i's rows (compute stream); records done[i].
  void compute1(const ChunkedOptions& o, int i) {
    problems1[i]->run(handle->get(), o.gemm1);
    COMET_CUDA_CHECK(cudaEventRecord(done[i], compute));
  }
  static void wait(cudaStream_t stream, cudaEvent_t e) { COMET_CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0)); }
  // The compute stream starts after everything already on the rank's stream (prepare's local rows).
  void fork() {
    COMET_CUDA_CHECK(cudaEventRecord(forked, comm));
    wait(compute, forked);
  }
  // The rank's stream continues after everything on the compute stream.
  void join() {
    COMET_CUDA_CHECK(cudaEventRecord(joined, compute));
    wait(comm, joined);
  }
};

}  // namespace comet
