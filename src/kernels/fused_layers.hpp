// Host-side entry points of the two fused kernels (one persistent launch each). The ops layer
// (src/ops) owns buffers and validation; these only build TMA descriptors and launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <utility>

#include "comet/team.hpp"
#include "comet/variant.hpp"
#include "tune/adaptive_split.hpp"
#include "kernels/layer_args.hpp"

namespace comet::kernels {

using Mode = LayerMode;

// Compiled GEMM tile shapes: TileM is always 128 (the plan's tile_m); the widths below, one
// fused_tile128xN.cu each. 192: in layer 0 for N that pads badly to 256 (Qwen2 TP 8's 352); in layer 1
// (N = H) for batches whose 256-wide tiles leave the last wave mostly idle; the combine's 256-column
// chunks then wait on the two column blocks each covers. 320: layer 0 only, for the TP 8 shards that
// 320 divides and 256 does not (Qwen2-57B's N = 640: 2 column blocks instead of 3; Phi-3.5's 1600: 5
// instead of 7), where the GEMM is bound by A's loads, once per column block (fused_tile128x320.cu).
inline constexpr int kTileM = 128;
using Layer0Tiles = std::integer_sequence<int, 128, 192, 256, 320>;
using Layer1Tiles = std::integer_sequence<int, 128, 192, 256>;
// Layer 0 in fp8 (Fp8GemmConfig): 128 x 128 only. Its mainloop keeps a second set of fp32 accumulators
// for the per-K-block promotion, so a 256-wide tile would hold 256 accumulator registers per thread.
using Fp8Layer0Tiles = std::integer_sequence<int, 128>;
// The backward's fused kernels (layer 0's and layer 1's with N-major weights): the two widths.
using GradTiles = std::integer_sequence<int, 128, 256>;

template <int... T>
constexpr bool has_tile(std::integer_sequence<int, T...>, int tile_n) {
  return ((tile_n == T) || ...);
}
// By launch id (comet/tune.hpp: 0, 1 the forward's layers, 2, 3 the backward's kernels).
inline bool is_supported_tile_n(int tile_n, int layer, DType dtype = DType::bf16) {
  if (layer >= 2) return has_tile(GradTiles{}, tile_n);
  if (layer == 0 && dtype == DType::e4m3) return has_tile(Fp8Layer0Tiles{}, tile_n);
  return layer == 0 ? has_tile(Layer0Tiles{}, tile_n) : has_tile(Layer1Tiles{}, tile_n);
}

// How a launch splits its persistent grid and whom it reports to, the same for both layers (the
// engine fills it from the planner's decision).
struct GridSplit {
  const Epoch* epoch = nullptr;    // the rank's generation: flags compare with it
  int n_comm = 0;                  // comm blocks (the host's; with adapt.enabled the kernel re-picks it)
  AdaptiveSplit adapt;             // fused mode with comm blocks only
  int m_group = 16;
  int n_group = 1;                 // layer 1: column blocks shipped together
  Mode mode = Mode::fused;
  // Layer 1's kernel, fused mode without comm blocks: every block of the resident grid computes its
  // tiles, then combines (LaunchDecision::one_launch).
  bool one_launch = false;
  // Layer 0, fused mode: compute tiles in m order, not arrival order (LaunchDecision::m_order).
  bool m_order = false;
  TeamDeviceView team;
};

struct Layer0Launch {
  int tile_n = 256;
  DType dtype = DType::bf16;
  int hidden = 0;            // H, the GEMM's K (fp8: dispatch.hidden is a record's length in 16-bit units)
  const void* w0 = nullptr;  // [experts][n0][hidden], bf16 or e4m3 codes
  const float* w0_scales = nullptr;  // e4m3: [experts][ceil(n0 / 128)][hidden / 128]
  int n0 = 0;                // W0 rows per expert (2 F_s for swiglu)
  int experts = 0;
  int rows_cap = 0;
  void* hid = nullptr;  // [rows_cap][hid_ld]
  int hid_ld = 0;
  void* pre = nullptr;  // training: [rows_cap][n0], the pre-activations; null: not kept
  EpilogueOp act = EpilogueOp::swiglu;
  DispatchArgs dispatch;  // dispatch.a is the GEMM's A
  GridSplit split;
};

struct Layer1Launch {
  int tile_n = 256;
  const void* hid = nullptr;  // A: [rows_cap][ffn_shard]
  int ffn_shard = 0;
  const void* w1 = nullptr;  // [experts][hidden][ffn_shard]
  int experts = 0;
  int rows_cap = 0;
  void* y = nullptr;  // [rows_cap][hidden]
  Epoch* tile_done = nullptr;
  CombineArgs combine;  // combine.y == y
  GridSplit split;
};

// Backward of layer 1 (layer 0's kernel): the comm blocks pull output-gradient rows into G
// (dispatch.a), the compute blocks run D = G W1_e (W1 [experts][H][F_s] read N-major) and either store
// D's rows as bf16, the activation's backward following as its own kernel (grad_rows.hpp:
// activation_grad), or, with fused_activation, make dPre, g h and the gate partials in the epilogue
// (activation_grad_epilogue.cuh) and store no D.
struct GradLayer1Launch {
  int tile_n = 256;
  const void* w1 = nullptr;  // [experts][hidden][ffn_shard]
  int ffn_shard = 0;
  int experts = 0;
  int rows_cap = 0;
  void* d = nullptr;  // [rows_cap][ffn_shard]: D out (two-pass path)
  DispatchArgs dispatch;
  GridSplit split;
  // fused_activation: the activation-backward epilogue's operands (the plan is dispatch.plan).
  bool fused_activation = false;
  EpilogueOp act = EpilogueOp::swiglu;
  void* pre = nullptr;  // [rows_cap][pre_ld]: z in, dPre out
  int pre_ld = 0;
  void* hid = nullptr;  // [rows_cap][ffn_shard]: h in, g h out
  float* gate_partials = nullptr;  // [rows_cap][gate_ld]: column n_block per tile
  int gate_ld = 0;
  int topk = 0;
};

// Backward of layer 0 (layer 1's kernel): dA = dPre W0_e (W0 [experts][n0][H] read N-major) into y,
// combined with unit weights into the tokens' owners (combine.unit_weights).
struct GradLayer0Launch {
  int tile_n = 256;
  const void* dpre = nullptr;  // A: [rows_cap][n0]
  int n0 = 0;
  const void* w0 = nullptr;  // [experts][n0][hidden]
  int experts = 0;
  int rows_cap = 0;
  void* y = nullptr;  // [rows_cap][hidden]
  Epoch* tile_done = nullptr;
  CombineArgs combine;
  GridSplit split;
};

// The order in which CUTLASS's grouped GEMMs (the weight gradients' and the standalone expert GEMM's)
// walk a group's tiles: down M (CUTLASS's own: every M-tile of a column block, then the next column
// block) or along N (every column block of an M-tile, then the next M-tile). Either gives the same bits:
// it moves whole tiles between blocks and times, never a K step.
enum class GroupRaster : uint8_t { along_m, along_n };

// Weight gradient of every local expert: out_e = P_e^T Q_e over the expert's rows of two gathered
// buffers (P [rows_cap][p_cols], Q [rows_cap][q_cols]); out [experts][p_cols][q_cols], fp32 or bf16.
// The rows of P and Q past each expert's valid rows, up to its padded segment end, must be zero.
struct WeightGradLaunch {
  const void* p = nullptr;
  int p_cols = 0;
  const void* q = nullptr;
  int q_cols = 0;
  int rows_cap = 0;
  int experts = 0;
  const int32_t* expert_offset = nullptr;  // the plan's [experts + 1]
  const int32_t* expert_rows = nullptr;    // the plan's [experts]
  void* out = nullptr;
  bool out_f32 = false;
  bool accumulate = false;
  // Which GEMM: the persistent kernel (weight_grad_kernel.cuh) or one of CUTLASS's grouped GEMMs
  // (weight_grad_grouped.cu), which need weight_grad_grouped_workspace_bytes(experts) of workspace.
  WeightGradKernel kernel = WeightGradKernel::persistent;
  // The grouped kernels' tile order: along N, as the expert GEMM's below. Measured on the H100 over the
  // weight gradients of five models (30 shapes x 2, bench/results/h100_gemm_order_d4cfb6d/): down M was
  // 8.7 % slower for ping-pong (geometric mean, up to 1.6x), even for the cooperative kernel (1.003;
  // 0.89-1.22). The persistent kernel ignores it.
  GroupRaster raster = GroupRaster::along_n;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// An expert GEMM with no comm blocks beside it, by CUTLASS's grouped GEMM (expert_gemm_grouped.cu):
// out rows of expert e = its real rows of A times W_e (the plan's expert_offset / expert_rows; padding
// rows of out are not written). bf16 throughout.
struct ExpertGemmLaunch {
  const void* a = nullptr;  // [rows_cap][k]
  int k = 0;
  const void* w = nullptr;  // [experts][k][n] (w_kn) or [experts][n][k]
  bool w_kn = true;
  int n = 0;
  void* out = nullptr;  // [rows_cap][n]
  int experts = 0;
  const int32_t* expert_offset = nullptr;  // the plan's [experts + 1]
  const int32_t* expert_rows = nullptr;    // the plan's [experts]
  StandaloneGemm kernel = StandaloneGemm::grouped;
  // Along N: every column block of one M-tile before the next M-tile. Measured on the H100 over the
  // expert GEMMs of five models (bench/results/h100_gemm_order_6eff8fd/): CUTLASS's down-M order was
  // 6 % slower (geometric mean over 90 shapes x 3 schedules), up to 1.6x where an expert has many rows,
  // since it streams the expert's rows once per column block; along N lost more than 3 % in 13 of the 270, by at most 10 %.
  GroupRaster raster = GroupRaster::along_n;
  void* workspace = nullptr;  // expert_gemm_grouped_workspace_bytes(experts), 256-byte aligned
  size_t workspace_bytes = 0;
};

// Multiprocessors and the largest grid of these kernels that is entirely resident at once.
struct LaunchLimits {
  int sms = 0;
  int max_blocks = 0;
};
// One compiled tile's entry points (fused_launch.cuh defines them, fused_tile128xN.cu instantiates).
template <int TileN>
LaunchLimits layer0_limits_tile();
template <int TileN>
void launch_layer0_tile(const Layer0Launch& l, cudaStream_t stream);
template <int TileN>
LaunchLimits layer0_fp8_limits_tile();
template <int TileN>
void launch_layer0_fp8_tile(const Layer0Launch& l, cudaStream_t stream);
template <int TileN>
LaunchLimits layer1_limits_tile();
template <int TileN>
void launch_layer1_tile(const Layer1Launch& l, cudaStream_t stream);

template <int TileN>
LaunchLimits grad_layer1_limits_tile();
template <int TileN>
void launch_grad_layer1_tile(const GradLayer1Launch& l, cudaStream_t stream);
template <int TileN>
LaunchLimits grad_layer0_limits_tile();
template <int TileN>
void launch_grad_layer0_tile(const GradLayer0Launch& l, cudaStream_t stream);

// The entry points by tile width (InvalidArgument for a width that is not compiled).
LaunchLimits layer0_limits(int tile_n, DType dtype = DType::bf16);
LaunchLimits layer1_limits(int tile_n);

void launch_layer0(const Layer0Launch& l, cudaStream_t stream);
void launch_layer1(const Layer1Launch& l, cudaStream_t stream);
LaunchLimits grad_layer_limits(int launch, int tile_n);  // launch 2: grad_layer1's kernel, 3: grad_layer0's
void launch_grad_layer1(const GradLayer1Launch& l, cudaStream_t stream);
void launch_grad_layer0(const GradLayer0Launch& l, cudaStream_t stream);
void launch_weight_grad(const WeightGradLaunch& l, cudaStream_t stream);  // the GEMM l.kernel names
void launch_weight_grad_grouped(const WeightGradLaunch& l, cudaStream_t stream);
void launch_weight_grad_grouped_320(const WeightGradLaunch& l, cudaStream_t stream);  // weight_grad_grouped_320.cu
size_t weight_grad_grouped_320_workspace_bytes(int experts);
// Workspace of one grouped launch over `experts` groups, on any GPU of up to 256 multiprocessors
// (weight_grad_grouped.cu: kMaxWorkspaceSms). A host computation: the footprint uses it without a GPU.
size_t weight_grad_grouped_workspace_bytes(int experts);
void launch_expert_gemm_grouped(const ExpertGemmLaunch& l, cudaStream_t stream);
// Its workspace, sized as weight_grad_grouped_workspace_bytes's (a host computation).
size_t expert_gemm_grouped_workspace_bytes(int experts);

}  // namespace comet::kernels
