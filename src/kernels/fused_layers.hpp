// Host-side entry points of the two fused kernels (one persistent launch each). The ops layer
// (src/ops) owns buffers and validation; these only build TMA descriptors and launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "comet/team.hpp"
#include "comet/variant.hpp"
#include "tune/adaptive_split.hpp"
#include "kernels/layer_args.hpp"

namespace comet::kernels {

using Mode = LayerMode;

// Compiled GEMM tile shapes: TileM is always 128 (the plan's tile_m); the widths below, one
// fused_tile128xN.cu each. Layer 0 also has 192 (N that pads badly to 256: Qwen2 TP 8's 352); layer 1's N
// is the hidden size, a multiple of 256 in every model we know, and its combine ships 256-column chunks.
inline constexpr int kTileM = 128;
using Layer0Tiles = std::integer_sequence<int, 128, 192, 256>;
using Layer1Tiles = std::integer_sequence<int, 128, 256>;

template <int... T>
constexpr bool has_tile(std::integer_sequence<int, T...>, int tile_n) {
  return ((tile_n == T) || ...);
}
inline bool is_supported_tile_n(int tile_n, int layer) {
  return layer == 0 ? has_tile(Layer0Tiles{}, tile_n) : has_tile(Layer1Tiles{}, tile_n);
}

// How a launch splits its persistent grid and whom it reports to, the same for both layers (the
// engine fills it from the planner's decision).
struct GridSplit {
  const int32_t* epoch = nullptr;  // the rank's generation: flags compare with it
  int n_comm = 0;                  // comm blocks (the host's; with adapt.enabled the kernel re-picks it)
  AdaptiveSplit adapt;             // fused mode with comm blocks only
  int m_group = 16;
  int n_group = 1;                 // layer 1: column blocks shipped together
  Mode mode = Mode::fused;
  TeamDeviceView team;
};

struct Layer0Launch {
  int tile_n = 256;
  const void* w0 = nullptr;  // [experts][n0][hidden]
  int n0 = 0;                // W0 rows per expert (2 F_s for swiglu)
  int experts = 0;
  int rows_cap = 0;
  void* hid = nullptr;  // [rows_cap][hid_ld]
  int hid_ld = 0;
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
  int32_t* tile_done = nullptr;
  CombineArgs combine;  // combine.y == y
  GridSplit split;
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
LaunchLimits layer1_limits_tile();
template <int TileN>
void launch_layer1_tile(const Layer1Launch& l, cudaStream_t stream);

// The entry points by tile width (InvalidArgument for a width that is not compiled).
LaunchLimits layer0_limits(int tile_n);
LaunchLimits layer1_limits(int tile_n);

void launch_layer0(const Layer0Launch& l, cudaStream_t stream);
void launch_layer1(const Layer1Launch& l, cudaStream_t stream);

}  // namespace comet::kernels
