// How one launch of a fused layer runs: what a caller may ask for (LayerRequest) and what the launch
// planner decided (LaunchDecision). The tuner's table stores LayerVariant entries.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace comet {

// Element type of layer 0's GEMM inputs (MoeOptions::dtype). bf16: tokens and W0 as given. e4m3 (issue
// 17): each token quantised to e4m3 with 1 x 128 fp32 scales once, on its owner, and moved as one
// packed record (comet/fp8.hpp); W0 given as e4m3 codes with 128 x 128 fp32 scales; fp32 accumulation
// and a bf16 hidden output, so layer 1 and the combine stay bf16.
enum class DType : int { bf16 = 0, e4m3 = 1 };
inline const char* to_string(DType t) { return t == DType::e4m3 ? "e4m3" : "bf16"; }

// fused:     comm and compute blocks in one persistent launch (the product).
// gemm_only: compute blocks only, no waits (layer 0 assumes its rows are present): T_gemm.
// comm_only: comm blocks only, no waits on compute (layer 1 ships whatever Y holds): T_comm.
enum class LayerMode : int { fused = 0, gemm_only = 1, comm_only = 2 };

// Which GEMM makes the weight gradients dW0_e = dPre_e^T A_e and dW1_e = G_e^T (g h)_e.
enum class WeightGradKernel {
  automatic,   // the launch planner's rule by shape (LaunchPlanner::weight_grad_kernel); all three give
               // the same bits, so the choice is only about speed
  persistent,  // ours (src/kernels/weight_grad_kernel.cuh): 128 x 256 tiles, cooperative warp groups
  grouped,     // CUTLASS's grouped GEMM, ping-pong schedule, 128 x 128 tiles in 2 x 1 clusters
               // (src/kernels/weight_grad_grouped.cu): one warp group's epilogue under the other's mainloop
  grouped_cooperative,  // the same grouped GEMM, cooperative 128 x 256 tiles in 2 x 1 clusters (TMA multicast)
  grouped_320,          // the same on 128 x 320 tiles (a narrow N: prefers_320_tiles below)
};
inline const char* to_string(WeightGradKernel k) {
  switch (k) {
    case WeightGradKernel::automatic: return "auto";
    case WeightGradKernel::persistent: return "persistent";
    case WeightGradKernel::grouped: return "grouped";
    case WeightGradKernel::grouped_cooperative: return "grouped_cooperative";
    case WeightGradKernel::grouped_320: return "grouped_320";
  }
  return "?";
}
// Every WeightGradKernel, the planner's choice first (what a request or a table entry may name).
inline constexpr WeightGradKernel kWeightGradKernels[] = {WeightGradKernel::automatic, WeightGradKernel::persistent,
                                                          WeightGradKernel::grouped, WeightGradKernel::grouped_cooperative,
                                                          WeightGradKernel::grouped_320};
// The value among `all` that to_string names `name`; nullopt for another name.
template <class E, size_t N>
std::optional<E> enum_named(const std::string& name, const E (&all)[N]) {
  for (E e : all)
    if (name == to_string(e)) return e;
  return std::nullopt;
}
// "a, b, ... or z": the names of `all`, for the message that refuses another name.
template <class E, size_t N>
std::string enum_names(const E (&all)[N]) {
  std::string names;
  for (size_t i = 0; i < N; ++i) names += std::string(i == 0 ? "" : i + 1 < N ? ", " : " or ") + to_string(all[i]);
  return names;
}
inline std::optional<WeightGradKernel> weight_grad_kernel_named(const std::string& name) {
  return enum_named(name, kWeightGradKernels);
}

// Where the weight gradients' cooperative grouped GEMM runs 128 x 320 tiles instead of 128 x 256 when the
// planner chooses: an N that 256-wide tiles pad by at least a fifth and 320-wide ones pad less
// (Qwen2-57B's TP 8 shard F / 8 = 320, Phi-3.5's 800). Measured on the H100 (comet-probe-grouped-gemm,
// bench/results/h100_probe_tiles_b37ed5d/): Qwen2-57B TP 8's dW1 at 16384 tokens 3.74 ms against 6.79,
// slower where N is a multiple of 256 or 176. A request is obeyed as given. The planner applies it
// under PlannerPolicy::narrow_n_tiles (MoeOptions::narrow_n_tiles, on by default). (It once widened a
// standalone GEMM's 128 x 160 pick too; on CuTe's n160 atoms the 160 tile leads there, launch_planner.cpp.)
inline bool prefers_320_tiles(int n) {
  const int pad256 = (n + 255) / 256 * 256, pad320 = (n + 319) / 320 * 320;
  return n > 0 && 5 * (pad256 - n) >= pad256 && pad320 < pad256;
}

// The GEMM of a launch that has no comm blocks beside it (gemm_only mode, or the GEMM launch of the
// sequential schedule) in layer 1 and in the backward's launches 2 (when its activation backward is a
// second pass) and 3; layer 0's applies the activation in its epilogue and is always comet's.
enum class StandaloneGemm {
  comet,                // our kernel in gemm_only mode (128 x tile_n, cooperative warp groups)
  grouped,              // CUTLASS's grouped GEMM, ping-pong, 128 x 128 tiles in 2 x 1 clusters
  grouped_cooperative,  // CUTLASS's grouped GEMM, cooperative 128 x 256 tiles in 2 x 1 clusters
  grouped_160,          // CUTLASS's grouped GEMM, cooperative 128 x 160 tiles in 2 x 1 clusters (narrow N)
  grouped_320,          // CUTLASS's grouped GEMM, cooperative 128 x 320 tiles in 2 x 1 clusters (narrow N)
  // cuBLAS, one cublasGemmEx per expert with rows. Needs each expert's rows on the host: a copy of the
  // plan's counts, enqueued after the plan build and waited for before the launch (under CUDA-graph
  // capture, or where cuBLAS cannot be loaded, our kernel runs instead). Not our kernel's bits.
  cublas,
};
// Every StandaloneGemm, ours first (what a sweep times and a table may name).
inline constexpr StandaloneGemm kStandaloneGemms[] = {StandaloneGemm::comet, StandaloneGemm::grouped,
                                                      StandaloneGemm::grouped_cooperative, StandaloneGemm::grouped_160,
                                                      StandaloneGemm::grouped_320, StandaloneGemm::cublas};
// CUTLASS's grouped GEMMs sum K in our kernel's order (fp32, one rounding to bf16): the same bits, so
// picking one never changes a result. cuBLAS's kernels sum in their own order.
inline constexpr bool gives_our_bits(StandaloneGemm g) { return g != StandaloneGemm::cublas; }
inline const char* to_string(StandaloneGemm g) {
  switch (g) {
    case StandaloneGemm::grouped: return "grouped";
    case StandaloneGemm::grouped_cooperative: return "grouped_cooperative";
    case StandaloneGemm::grouped_160: return "grouped_160";
    case StandaloneGemm::grouped_320: return "grouped_320";
    case StandaloneGemm::cublas: return "cublas";
    case StandaloneGemm::comet: break;
  }
  return "comet";
}
inline std::optional<StandaloneGemm> standalone_gemm_named(const std::string& name) {
  return enum_named(name, kStandaloneGemms);
}

// What a caller asks of a layer's launches. Every field left empty is the planner's choice (the tuner's
// table, else its cost model, and the rasterisation rule); a field that is set is obeyed (and checked).
struct LayerRequest {
  std::optional<int> tile_n;   // compiled GEMM tile 128 x tile_n: 128 or 256, and 192 in the forward's layers
  std::optional<int> n_comm;   // comm blocks; 0: the sequential schedule (below)
  std::optional<int> m_group;  // M-tiles per rasterisation group, >= 1
  std::optional<int> n_group;  // layer 1: column blocks shipped together, >= 1
  std::optional<StandaloneGemm> standalone_gemm;  // where the launch has a replaceable standalone GEMM (above)
  // A combine launch's (layer 1, the backward of layer 0) sequential schedule with our GEMM in one launch
  // (true) or as a GEMM launch and a combine launch (false); empty: the tuner's table entry (two launches
  // where it says nothing). The same bits either way (LaunchDecision::one_launch).
  std::optional<bool> one_launch;
  // Layer 0's fused launch only: its compute blocks take their tiles in m order (expert by expert, as
  // the sequential schedule's GEMM does) instead of arrival order (wave by wave). A wave holds a few
  // tiles of every expert, so an expert with tiles in several waves streams its weights once per wave;
  // in m order they cross HBM about once, but a tile may wait for its last source. Empty: arrival order.
  // For experiments (comet-bench --tile-order); docs/design-changes.md, "Layer 0's tile order under skew".
  std::optional<bool> m_order;

  // tile and comm blocks fixed, the rest the planner's.
  static LayerRequest forced(int tile_n, int n_comm) {
    LayerRequest r;
    r.tile_n = tile_n;
    r.n_comm = n_comm;
    return r;
  }
};

// A measured or chosen variant, every field resolved (the tuner table's entries). m_group 0 in a table
// entry means "the planner's rasterisation rule".
struct LayerVariant {
  int tile_n = 256;
  int n_comm = 2;
  int m_group = 0;
  int n_group = 1;
  // With n_comm 0 in layers 1-3: the sequential schedule's GEMM (comet-tune sets it where one of
  // CUTLASS's grouped GEMMs measured faster than ours on the case).
  StandaloneGemm standalone_gemm = StandaloneGemm::comet;
  // With n_comm 0 and our GEMM in layers 1 and 3: the GEMM and the combine in one launch (comet-tune
  // sets it where that measured faster than two launches on the case).
  bool one_launch = false;
  // Layer 0's entries of a load class > 1 only: the plan's wave chunk measured fastest beside this
  // n_comm on the class (PlanConfig::chunk_rule, comet/plan.hpp); 0: the default order.
  int wave_chunk = 0;
  // Entries of the weight gradients' keys (kWeightGradLaunch, comet/tune.hpp) only: the GEMM measured
  // fastest on the case (the other fields are unused there).
  WeightGradKernel weight_grad = WeightGradKernel::automatic;
};

// fused:      comm blocks inside the GEMM kernel (n_comm > 0).
// sequential: the communication runs as its own launch on the whole GPU, before the GEMM (layer 0) or
//             after it (layer 1); where the link is as fast as HBM this beats a few comm blocks.
enum class Schedule : int { fused = 0, sequential = 1 };

// What the planner decided for one launch; made once per (layer, mode, tokens, request) and memoised.
struct LaunchDecision {
  int layer = 0;
  LayerMode mode = LayerMode::fused;
  Schedule schedule = Schedule::fused;
  int tile_n = 256;
  int n_comm = 0;          // comm blocks of the fused schedule (0 in the sequential one)
  int m_group = 1;         // resolved, >= 1
  int n_group = 1;
  int resident_blocks = 0;  // the tile's resident grid on this device: comm + compute blocks
  bool adaptive = false;   // the kernel may re-pick n_comm from the batch's plan (adaptive split)
  StandaloneGemm standalone_gemm = StandaloneGemm::comet;  // the GEMM of a gemm_only or sequential launch
  // A combine launch's (layers 1 and 3) sequential schedule with our GEMM, run as one launch: every block
  // computes its tiles, then takes batches of the combine from a shared counter, so the blocks that have
  // no tile in the GEMM's last wave ship finished columns while that wave runs, and no launch boundary
  // drains the GPU in between. The tiles, items and sums are the two-launch schedule's, so the bits are
  // too. (Pull launches have no such form: docs/design-changes.md, "The sequential schedule in one launch".)
  bool one_launch = false;
  bool m_order = false;  // layer 0's fused launch: tiles in m order (LayerRequest::m_order)
  const char* picked_by = "";  // "forced", "table", "cost_model"
};

}  // namespace comet
