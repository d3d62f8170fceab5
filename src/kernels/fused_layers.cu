// Picks the compiled tile shape for a launch.
#include "kernels/fused_layers.hpp"

#include "comet/common.hpp"

namespace comet::kernels {

LaunchLimits layer0_limits_128x256();
LaunchLimits layer0_limits_128x192();
LaunchLimits layer0_limits_128x128();
LaunchLimits layer1_limits_128x256();
LaunchLimits layer1_limits_128x128();
void launch_layer0_128x256(const Layer0Launch&, cudaStream_t);
void launch_layer0_128x192(const Layer0Launch&, cudaStream_t);
void launch_layer0_128x128(const Layer0Launch&, cudaStream_t);
void launch_layer1_128x256(const Layer1Launch&, cudaStream_t);
void launch_layer1_128x128(const Layer1Launch&, cudaStream_t);

LaunchLimits layer0_limits(int tile_n) {
  COMET_REQUIRE(is_supported_tile_n(tile_n, 0), "fused layer 0: no compiled tile 128x", tile_n);
  return tile_n == 256 ? layer0_limits_128x256() : tile_n == 192 ? layer0_limits_128x192() : layer0_limits_128x128();
}
LaunchLimits layer1_limits(int tile_n) {
  COMET_REQUIRE(is_supported_tile_n(tile_n, 1), "fused layer 1: no compiled tile 128x", tile_n);
  return tile_n == 256 ? layer1_limits_128x256() : layer1_limits_128x128();
}
void launch_layer0(const Layer0Launch& l, cudaStream_t stream) {
  COMET_REQUIRE(is_supported_tile_n(l.tile_n, 0), "fused layer 0: no compiled tile 128x", l.tile_n);
  if (l.tile_n == 256) launch_layer0_128x256(l, stream);
  else if (l.tile_n == 192) launch_layer0_128x192(l, stream);
  else launch_layer0_128x128(l, stream);
}
void launch_layer1(const Layer1Launch& l, cudaStream_t stream) {
  COMET_REQUIRE(is_supported_tile_n(l.tile_n, 1), "fused layer 1: no compiled tile 128x", l.tile_n);
  l.tile_n == 256 ? launch_layer1_128x256(l, stream) : launch_layer1_128x128(l, stream);
}

}  // namespace comet::kernels
