#include "baselines/expert_layers.hpp"

#include <algorithm>

#include "comet/cuda_check.hpp"

namespace comet::baselines {

ExpertLayers::~ExpertLayers() {
  if (scratch_) cudaFree(scratch_);
}

void ExpertLayers::set_weights(const void* w0, const void* w1) {
  w0_ = w0;
  w1_ = w1;
}

int w0_shard_rows(const MoeEngine& moe) {
  const int fs = moe.parallel().ffn_shard(moe.shape());
  return is_gated(moe.shape().act) ? 2 * fs : fs;
}

void ExpertLayers::ensure_scratch(const MoeEngine& moe) {
  if (scratch_) return;
  const size_t bytes = size_t(moe.capacity().max_rows_per_rank) * w0_shard_rows(moe) * 2;
  COMET_CUDA_CHECK(cudaMalloc(&scratch_, std::max<size_t>(bytes, 16)));
}

GemmOperands ExpertLayers::gemm0(const MoeEngine& moe, int rank) const {
  return GemmOperands{moe.gathered(rank), w0_, scratch_, w0_shard_rows(moe), moe.shape().hidden};
}

GemmOperands ExpertLayers::gemm1(const MoeEngine& moe, int rank) const {
  return GemmOperands{moe.hidden(rank), w1_, moe.expert_out(rank), moe.shape().hidden,
                      moe.parallel().ffn_shard(moe.shape())};
}

ActivationArgs ExpertLayers::activation(const MoeEngine& moe, int rank, int pos_begin, int pos_end) const {
  const PlanView& plan = moe.plan(rank).view();
  ActivationArgs a;
  a.c = scratch_;
  a.ldc = w0_shard_rows(moe);
  a.hidden = moe.hidden(rank);
  a.ffn_shard = moe.parallel().ffn_shard(moe.shape());
  a.act = moe.shape().act;
  a.segment_offset = plan.segment_offset;
  a.segment_rows = plan.segment_rows;
  a.world = moe.parallel().world();
  a.local_experts = moe.parallel().local_experts(moe.shape());
  a.pos_begin = pos_begin;
  a.pos_end = pos_end;
  return a;
}

LayerRequest comm_variant(int tile_n, int blocks) {
  LayerRequest r = LayerRequest::forced(tile_n, blocks);
  r.m_group = 16;
  r.n_group = 1;
  return r;
}

LayerRequest all_sm_variant(const MoeEngine& moe, int layer, int tile_n) {
  return comm_variant(tile_n, std::max(1, moe.resident_blocks(layer, tile_n) - 1));
}

}  // namespace comet::baselines
