// What SequentialMoe keeps per rank, shared by its forward (sequential_moe.cpp) and its backward
// (sequential_backward.cpp).
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "baselines/baselines.hpp"
#include "baselines/expert_layers.hpp"
#include "baselines/fp8_expert_gemm.hpp"
#include "ops/host_plan_counts.hpp"

namespace comet {

struct SequentialMoe::RankState {
  int rank;
  cudaStream_t stream;
  baselines::ExpertLayers layers;
  baselines::CublasHandle handle;
  HostPlanCounts host_counts;
  baselines::GemmProblems problems0, problems1;          // forward: GEMM0, GEMM1
  baselines::GemmProblems grad_problems1, grad_problems0;  // backward: D = G W1_e, dA = dPre W0_e
  ExpertRows counts;
  std::vector<baselines::RowBlock> blocks;  // one per local expert, from counts
  int max_rows = 0;
  // MoeOptions::dtype e4m3: W0's block scales and the cuBLASLt fp8 GEMM0 (made on first prepare).
  const float* w0_scales = nullptr;
  std::unique_ptr<baselines::Fp8ExpertGemm> fp8_gemm0;
  bool prepared = false;       // forward GEMM problems match the plan
  bool grad_prepared = false;  // backward GEMM problems match the plan

  RankState(const MoeEngine& moe, int r)
      : rank(r),
        stream(moe.team().stream(r)),
        handle(stream),
        problems0(moe.parallel().local_experts(moe.shape())),
        problems1(moe.parallel().local_experts(moe.shape())),
        grad_problems1(moe.parallel().local_experts(moe.shape())),
        grad_problems0(moe.parallel().local_experts(moe.shape())) {}

  // Reads the plan's per-expert row counts (waits for the stream up to the copy; raises
  // DeviceReportedError for bad routing) into counts, blocks and max_rows.
  void read_counts(const MoeEngine& moe) {
    const int el = moe.parallel().local_experts(moe.shape());
    counts = host_counts.read(moe.plan(rank).view(), el, moe.shape().num_experts, stream);
    blocks.clear();
    for (size_t e = 0; e < counts.rows.size(); ++e)
      blocks.push_back(baselines::RowBlock{int(e), counts.offset[e], counts.rows[e]});
    max_rows = counts.rows.empty() ? 0 : *std::max_element(counts.rows.begin(), counts.rows.end());
  }
};

}  // namespace comet
