#include "memory_plan.hpp"

#include <cmath>

#include "comet/footprint.hpp"

namespace comet::bench {

MemoryNeed memory_need(const MoeShape& shape, const Parallel& par, Link link, int max_tokens, int max_rows,
                       bool training) {
  const double W = par.world(), T = max_tokens, H = shape.hidden, k = shape.topk;
  const double fs = par.ffn_shard(shape), el = par.local_experts(shape);
  const double n0 = is_gated(shape.act) ? 2 * fs : fs;
  // The layer as FusedMoe sizes it: rank 0 computes (its private buffers and plan), every rank exports.
  const LayerFootprint f = layer_footprint(shape, par, MoeCapacity{max_tokens, max_rows}, training);
  // The benchmark's batches per rank: x, out [T][H], ids, gates [T][k].
  const double batches = T * H * 4 + T * k * 8;
  const double weights = el * (n0 * H + H * fs) * 2;
  const double scratch = 2.0 * max_rows * n0 * 2;  // GEMM0 output of the sequential and the chunked baseline
  const double fixed = 2.0 * (1ull << 30);  // context, cuBLAS workspaces, kernels, events
  // Rank 0's gradients: dout, dx [T][H], dgates [T][k] fp32, dW0 and dW1 (bf16, the weights' size).
  const double grads = training ? T * H * 4 + T * k * 4 + weights : 0;
  MemoryNeed need;
  need.device_bytes = double(f.compute()) + W * batches + weights + grads + scratch + fixed +
                      (link == Link::device ? W * double(f.symmetric) : 0);
  need.host_pinned_bytes = link == Link::host ? W * double(f.symmetric) : 0;
  return need;
}

}  // namespace comet::bench
