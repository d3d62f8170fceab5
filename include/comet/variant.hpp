// A compiled variant of a fused layer and the run-time knobs of one launch: what the tuner chooses.
#pragma once

namespace comet {

// fused:     comm and compute blocks in one persistent launch (the product).
// gemm_only: compute blocks only, no waits (layer 0 assumes its rows are present): T_gemm.
// comm_only: comm blocks only, no waits on compute (layer 1 ships whatever Y holds): T_comm.
enum class LayerMode : int { fused = 0, gemm_only = 1, comm_only = 2 };

struct LayerVariant {
  int tile_n = 256;  // compiled GEMM tiles 128 x tile_n: 128 or 256, and 192 in layer 0; 0 in MoeOptions: the tuner's pick
  int n_comm = 2;    // comm blocks; the rest of the resident grid computes. 0: sequential mode (the
                     // communication runs as its own launch on the whole GPU, before or after the GEMM)
  int m_group = 0;   // rasterisation: M-tiles per group (L2 reuse); 0: about one wave of the grid
  int n_group = 1;   // layer 1: column blocks per group shipped together
};

}  // namespace comet
