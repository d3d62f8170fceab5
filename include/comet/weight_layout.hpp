// Per-rank expert weights in the layout the GPU kernels read.
//
// Rank r holds experts [g E_l, (g+1) E_l), g = par.ep_index(r), E_l = E/ep, and the F-shard
// [i F_s, (i+1) F_s), i = par.tp_index(r), F_s = F/tp. From the full weights w0 [E][w0_rows][H] and
// w1 [E][H][F] (see reference.hpp):
//   w0_local [E_l][N0_s][H], rows K-major (H contiguous values per row).
//     gelu / silu: N0_s = F_s, row n = w0[g E_l + e][i F_s + n].
//     swiglu:      N0_s = 2 F_s, gate and up rows interleaved in blocks of 8, so that the GEMM epilogue
//                  holds gate_f and up_f of one output column in the same thread's registers:
//                  for b < F_s/8, q < 8:  row 16b + q     = gate row  i F_s + 8b + q
//                                         row 16b + 8 + q = up row    F + i F_s + 8b + q
//   w1_local [E_l][H][F_s]: w1_local[e][h][f] = w1[g E_l + e][h][i F_s + f].
#pragma once

#include <vector>

#include "comet/bf16.hpp"
#include "comet/shape.hpp"

namespace comet {

template <class V>
struct RankWeightsOf {
  int local_experts = 0;  // E_l
  int w0_rows = 0;        // N0_s: rows of w0_local per expert (2 F_s for swiglu, else F_s)
  int ffn_shard = 0;      // F_s
  int hidden = 0;         // H
  std::vector<V> w0;      // [E_l][N0_s][H]
  std::vector<V> w1;      // [E_l][H][F_s]
};
using RankWeights = RankWeightsOf<bf16_bits>;  // what the kernels read
using RankWeightsF32 = RankWeightsOf<float>;   // the same layout in fp32 (tests, gradients)

// The row of the full w0[expert] (in [0, shape.w0_rows())) stored at local row local_row of every
// local expert of `rank`. The one place the interleave rule above is written down.
int w0_full_row(const MoeShape& shape, const Parallel& par, int rank, int local_row);

// Rank `rank`'s weights (bf16: round to nearest even of the fp32 values), from the full fp32 weights.
RankWeights shard_weights(const MoeShape& shape, const Parallel& par, int rank, const std::vector<float>& w0_full,
                          const std::vector<float>& w1_full);
RankWeightsF32 shard_weights_f32(const MoeShape& shape, const Parallel& par, int rank,
                                 const std::vector<float>& w0_full, const std::vector<float>& w1_full);

// The inverse, for gradients: add a rank's local-layout w0 / w1 (fp32) into the full-size arrays.
// Every full element is held by exactly one rank (its expert's EP group, its F column's TP index), so
// adding all W ranks' layouts into zeros rebuilds the full arrays.
void unshard_add_w0(const MoeShape& shape, const Parallel& par, int rank, const std::vector<float>& w0_local,
                    std::vector<float>& w0_full);
void unshard_add_w1(const MoeShape& shape, const Parallel& par, int rank, const std::vector<float>& w1_local,
                    std::vector<float>& w1_full);

}  // namespace comet
