// The whole backward of a baseline for every local rank (SequentialMoe, ChunkedMoe): every refusal
// before any work, the output gradients staged, a team barrier, each rank's own steps, a team barrier,
// the final reduces of dx and the gate gradients.
#pragma once

#include <vector>

#include "comet/cuda_check.hpp"
#include "comet/fused_moe.hpp"
#include "ops/moe_engine.hpp"

namespace comet::baselines {

// per_rank(rank, grad): the baseline's steps between the two barriers (prepare_grad .. weight gradients).
template <class PerRank>
void drive_backward(MoeEngine& moe, const char* who, const std::vector<RankGrad>& grads, PerRank&& per_rank) {
  const std::vector<int> local = moe.team().local_ranks();
  COMET_REQUIRE(grads.size() == local.size(), who, "::backward: ", grads.size(), " gradients for ", local.size(),
                " local ranks");
  for (size_t i = 0; i < local.size(); ++i) moe.check_grad(local[i], grads[i]);  // all refusals before any work
  for (size_t i = 0; i < local.size(); ++i) moe.stage_grad(local[i], grads[i]);
  moe.team().barrier();  // every rank's output gradients are in its exported buffer
  for (size_t i = 0; i < local.size(); ++i) per_rank(local[i], grads[i]);
  moe.team().barrier();  // every input-gradient row and gate partial is in its owner's receive buffer
  for (size_t i = 0; i < local.size(); ++i) moe.finish_grad(local[i], grads[i]);
  if (moe.options().checking) moe.sync_and_check();
}

}  // namespace comet::baselines
