// The CPU reference of the whole distributed MoE layer, forward and backward: the oracle every test is
// judged against. Plain loops over the unsharded math; instantiated for float (the oracle) and double
// (finite-difference tests). Results do not depend on the number of threads used.
//
// Data (all row-major, like torch):
//   rank s of W = ep*tp ranks owns T_s tokens (T_s may be 0): x [T_s][H], ids [T_s][k], gates [T_s][k].
//   Full expert weights: w0 [E][w0_rows][H] (w0_rows = 2F for swiglu: rows [0,F) gate, [F,2F) up;
//   F otherwise) and w1 [E][H][F], both nn.Linear style [out][in].
// Math, for token x of rank s and its slot j with expert e = ids[t][j]:
//   z = w0_e x;  h = act(z) in R^F  (swiglu: h_f = silu(z_f) * z_{F+f}; gelu (tanh form) / silu: elementwise)
//   y = w1_e h in R^H;  out_s[t] = sum_j gates[t][j] * y   (summed in slot order j = 0..k-1)
#pragma once

#include <cstdint>
#include <vector>

#include "comet/shape.hpp"

namespace comet::reference {

template <class T>
struct ExpertWeights {
  std::vector<T> w0;  // [E][w0_rows][H]
  std::vector<T> w1;  // [E][H][F]
};

template <class T>
struct RankInput {
  int tokens = 0;
  std::vector<T> x;          // [tokens][H]
  std::vector<int32_t> ids;  // [tokens][k], distinct experts per token, each in [0, E)
  std::vector<T> gates;      // [tokens][k]
};

// One vector per rank, [T_s][H].
template <class T>
using RankOutputs = std::vector<std::vector<T>>;

// Throws comet::InvalidArgument naming the problem: unsupported shape/layout, ranks.size() != W,
// wrong array sizes, an expert id out of range, or an expert twice in one token's top-k.
template <class T>
void check_inputs(const MoeShape& shape, const Parallel& par, const ExpertWeights<T>& weights,
                  const std::vector<RankInput<T>>& ranks);

// Every rank's layer output.
template <class T>
RankOutputs<T> forward(const MoeShape& shape, const Parallel& par, const ExpertWeights<T>& weights,
                       const std::vector<RankInput<T>>& ranks);

// The same outputs evaluated the way the ranks share the work: for each token, the partial sums of
// every rank q (the experts of q's EP group, restricted to q's TP shard of F) are added in increasing
// q. Equal to forward() up to rounding; a cross-check that the EP x TP partition is exactly the math.
template <class T>
RankOutputs<T> forward_distributed(const MoeShape& shape, const Parallel& par, const ExpertWeights<T>& weights,
                                   const std::vector<RankInput<T>>& ranks);

template <class T>
struct Gradients {
  RankOutputs<T> dx;      // per rank [T_s][H]
  RankOutputs<T> dgates;  // per rank [T_s][k]
  std::vector<T> dw0;     // [E][w0_rows][H]
  std::vector<T> dw1;     // [E][H][F]
};

// Gradients of sum_s <dout_s, out_s> with respect to every input; dout is per rank [T_s][H].
template <class T>
Gradients<T> backward(const MoeShape& shape, const Parallel& par, const ExpertWeights<T>& weights,
                      const std::vector<RankInput<T>>& ranks, const RankOutputs<T>& dout);

// Pieces for per-layer GPU tests: one token, one expert, the F-shard [f_begin, f_end).
// expert_hidden: act(w0_e x) on the shard, length f_end - f_begin (x has H values).
template <class T>
std::vector<T> expert_hidden(const MoeShape& shape, const ExpertWeights<T>& weights, int expert, const T* x,
                             int f_begin, int f_end);
// expert_output: w1_e[:, f_begin:f_end] * hidden_shard, length H (a TP partial of y when the shard
// is not the whole of F).
template <class T>
std::vector<T> expert_output(const MoeShape& shape, const ExpertWeights<T>& weights, int expert,
                             const T* hidden_shard, int f_begin, int f_end);

// fp8 (issue 17): what comet's fp8 layer 0 computes with. Every token row of x quantised to e4m3 in
// 1 x 128 blocks (comet/fp8.hpp), and w0 in 128 x 128 blocks of each rank's local layout
// (weight_layout.hpp: w0_local [E_l][N0_s][H], per expert), which is what the GPU multiplies: a swiglu
// shard interleaves gate and up rows, so its blocks are not blocks of the full w0. Then dequantised;
// w1 and the rest unchanged (layer 1 stays bf16). forward_fp8 is forward() over them: the oracle of
// the fp8 path, whose GEMM differs from it only by fp32 accumulation order.
template <class T>
struct Fp8Layer0 {
  ExpertWeights<T> weights;
  std::vector<RankInput<T>> ranks;
  // The scale each element of the full w0 was quantised with, [E][w0_rows][H / 128].
  std::vector<float> w0_scales;
};
Fp8Layer0<float> quantize_layer0(const MoeShape& shape, const Parallel& par, const ExpertWeights<float>& weights,
                                 const std::vector<RankInput<float>>& ranks);
RankOutputs<float> forward_fp8(const MoeShape& shape, const Parallel& par, const ExpertWeights<float>& weights,
                               const std::vector<RankInput<float>>& ranks);

}  // namespace comet::reference
