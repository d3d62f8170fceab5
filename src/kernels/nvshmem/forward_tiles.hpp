// The NVSHMEM transport's bf16 forward layers per compiled tile width (internal to kernels/nvshmem):
// each width lives in a translation unit of its own (fused_nvshmem.cu: 256; fused_nvshmem_tile128.cu,
// fused_nvshmem_tile192.cu), so the CUTLASS builds compile side by side and each is a module with its
// own copy of NVSHMEM's device state, which `bind` fills.
#pragma once

#include <cuda_runtime.h>

#include "kernels/nvshmem/fused_nvshmem.hpp"

namespace comet::kernels::nvshmem::tiles {

struct ForwardTile {
  int tile_n;
  LaunchLimits (*layer0_limits)();
  LaunchLimits (*layer1_limits)();
  void (*layer0)(const Layer0Launch&, const TransportArgs&, cudaStream_t);
  void (*layer1)(const Layer1Launch&, const TransportArgs&, cudaStream_t);
  void (*bind)();
};

const ForwardTile& forward_tile128();
const ForwardTile& forward_tile192();
const ForwardTile& forward_tile256();

}  // namespace comet::kernels::nvshmem::tiles
