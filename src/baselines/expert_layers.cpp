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

void* ExpertLayers::pre_activation(const MoeEngine& moe, int rank) const {
  return moe.options().training ? moe.pre_activation(rank) : scratch_;
}

GemmOperands ExpertLayers::gemm0(const MoeEngine& moe, int rank) const {
  return GemmOperands{moe.gathered(rank), w0_, pre_activation(moe, rank), w0_shard_rows(moe), moe.shape().hidden};
}

GemmOperands ExpertLayers::gemm1(const MoeEngine& moe, int rank) const {
  return GemmOperands{moe.hidden(rank), w1_, moe.expert_out(rank), moe.shape().hidden,
                      moe.parallel().ffn_shard(moe.shape())};
}

ActivationArgs ExpertLayers::activation(const MoeEngine& moe, int rank, int pos_begin, int pos_end) const {
  const PlanView& plan = moe.plan(rank).view();
  ActivationArgs a;
  a.c = pre_activation(moe, rank);
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

GemmOperands ExpertLayers::grad_gemm1(const MoeEngine& moe, int rank) const {
  return GemmOperands{moe.grad_gathered(rank), w1_, scratch_, moe.parallel().ffn_shard(moe.shape()),
                      moe.shape().hidden, WeightLayout::k_by_n};
}

GradActivationArgs ExpertLayers::grad_activation(const MoeEngine& moe, int rank) const {
  const PlanView& plan = moe.plan(rank).view();
  GradActivationArgs a;
  a.d = scratch_;
  a.pre = moe.pre_activation(rank);
  a.ld_pre = w0_shard_rows(moe);
  a.hidden = moe.hidden(rank);
  a.ffn_shard = moe.parallel().ffn_shard(moe.shape());
  a.gate_partials = moe.gate_partials(rank);
  a.gate_ld = moe.gate_blocks();
  a.act = moe.shape().act;
  a.topk = moe.shape().topk;
  a.local_experts = moe.parallel().local_experts(moe.shape());
  a.expert_offset = plan.expert_offset;
  a.expert_rows = plan.expert_rows;
  a.row_unit = plan.row_unit;
  a.row_slot = plan.row_slot;
  a.unit_gates = plan.unit_gates;
  return a;
}

GemmOperands ExpertLayers::grad_gemm0(const MoeEngine& moe, int rank) const {
  return GemmOperands{moe.pre_activation(rank), w0_, moe.expert_out(rank), moe.shape().hidden, w0_shard_rows(moe),
                      WeightLayout::k_by_n};
}

WeightGradOperands ExpertLayers::wgrad1(const MoeEngine& moe, int rank, void* dw1, GradType type) const {
  return WeightGradOperands{moe.grad_gathered(rank), moe.hidden(rank), dw1, moe.shape().hidden,
                            moe.parallel().ffn_shard(moe.shape()), type};
}

WeightGradOperands ExpertLayers::wgrad0(const MoeEngine& moe, int rank, void* dw0, GradType type) const {
  return WeightGradOperands{moe.pre_activation(rank), moe.gathered(rank), dw0, w0_shard_rows(moe),
                            moe.shape().hidden, type};
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
