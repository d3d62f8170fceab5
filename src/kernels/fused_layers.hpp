// Host-side entry points of the two fused kernels (one persistent launch each). The ops layer
// (src/ops) owns buffers and validation; these only build TMA descriptors and launch.
#pragma once

#include <cuda_runtime.h>

#include "comet/team.hpp"
#include "comet/variant.hpp"
#include "tune/adaptive_split.hpp"
#include "kernels/layer_args.hpp"

namespace comet::kernels {

using Mode = LayerMode;

// Compiled GEMM tile shapes (TileM is always 128, the plan's tile_m).
inline constexpr int kTileM = 128;
// Layer 0 also has 128x192 (N that pads badly to 256); layer 1 has 128 and 256.
inline bool is_supported_tile_n(int tile_n, int layer) {
  return tile_n == 128 || tile_n == 256 || (layer == 0 && tile_n == 192);
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
LaunchLimits layer0_limits(int tile_n);
LaunchLimits layer1_limits(int tile_n);

void launch_layer0(const Layer0Launch& l, cudaStream_t stream);
void launch_layer1(const Layer1Launch& l, cudaStream_t stream);

}  // namespace comet::kernels
