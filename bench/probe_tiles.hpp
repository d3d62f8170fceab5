// Tile shapes comet does not compile into the library, for comet-probe-grouped-gemm to measure against the
// ones it does: CUTLASS's cooperative grouped GEMM on 128 x 320, 256 x 160 and 256 x 128 tiles (2 x 1
// clusters). A shape that wins here earns a StandaloneGemm / WeightGradKernel value; one that does not
// costs only the probe's build. Each schedule is a translation unit of its own (probe_tiles_*.cu), so
// that they compile side by side.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/fused_layers.hpp"

namespace comet::bench::probe_tiles {

struct ExpertSchedule {
  const char* name;  // as the records give it (along N, as the library's)
  void (*launch)(const kernels::ExpertGemmLaunch&, cudaStream_t);
  size_t (*workspace_bytes)(int experts);
};

struct WgradSchedule {
  const char* name;
  void (*launch)(const kernels::WeightGradLaunch&, cudaStream_t);  // bf16 out only
  size_t (*workspace_bytes)(int experts);
};

ExpertSchedule expert_128x320();
ExpertSchedule expert_256x160();
ExpertSchedule expert_256x128();
std::vector<WgradSchedule> wgrad_schedules();  // 128 x 320 and 256 x 160

}  // namespace comet::bench::probe_tiles
