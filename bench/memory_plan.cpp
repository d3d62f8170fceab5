#include "memory_plan.hpp"

#include <cmath>

#include "comet/plan.hpp"

namespace comet::bench {

MemoryNeed memory_need(const MoeShape& shape, const Parallel& par, Link link, int max_tokens, int max_rows,
                       bool training) {
  const double W = par.world(), T = max_tokens, R = max_rows, H = shape.hidden, k = shape.topk;
  const double fs = par.ffn_shard(shape), el = par.local_experts(shape);
  const double n0 = is_gated(shape.act) ? 2 * fs : fs;
  const double plan = double(plan_bytes(PlanConfig{shape, par, 0, 128, PlanCapacity{max_tokens, max_rows}}));
  const double tiles = R / 128;
  // FusedMoe, per rank: A, Y [rows][H], hidden [rows][F_s], own partials [T][H], plan and its builder's
  // scratch (taken as large as the plan), tile flags.
  const double per_rank = R * (2 * H + fs) * 2 + T * H * 2 + 2 * plan + tiles * 4 * (2 + (H + 127) / 128) + 4096;
  // Exported per rank: x [T][H], routing, receive slots [W][T][H].
  const double exported = T * H * 2 + 16 + T * k * 8 + W * T * H * 2;
  // The benchmark's batches per rank: x, out [T][H], ids, gates [T][k].
  const double batches = T * H * 4 + T * k * 8;
  const double weights = el * (n0 * H + H * fs) * 2;
  const double scratch = 2 * R * n0 * 2;  // GEMM0 output of the sequential and the chunked baseline
  const double fixed = 2.0 * (1ull << 30);  // context, cuBLAS workspaces, kernels, events
  // Training, per rank: pre-activations [rows][n0], gathered output gradients [rows][H], gate partials
  // [rows][F_s / 128 column blocks] fp32; exported gate-gradient slots [W][T][k] fp32. Rank 0's
  // gradients: dout, dx [T][H], dgates [T][k] fp32, dW0 and dW1 (bf16, the weights' size).
  const double train_per_rank = training ? R * (n0 + H) * 2 + R * std::ceil(fs / 128) * 4 : 0;
  const double train_exported = training ? W * T * k * 4 : 0;
  const double grads = training ? T * H * 4 + T * k * 4 + weights : 0;
  MemoryNeed need;
  need.device_bytes = W * (per_rank + batches + train_per_rank) + weights + grads + scratch + fixed +
                      (link == Link::device ? W * (exported + train_exported) : 0);
  need.host_pinned_bytes = link == Link::host ? W * (exported + train_exported) : 0;
  return need;
}

}  // namespace comet::bench
