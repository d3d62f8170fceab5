// The NVSHMEM transport's bf16 forward layers with 128x192 tiles (forward_tiles.hpp), for the tuner's
// picks of that width (fused_tile128x192.cu has the peer-pointer ones).
#include "kernels/nvshmem/forward_tile.cuh"

namespace comet::kernels::nvshmem::tiles {
const ForwardTile& forward_tile192() {
  static const ForwardTile f = make_forward_tile<192>();
  return f;
}
}  // namespace comet::kernels::nvshmem::tiles
