// The fused layers' entry points by tile width: a dispatch over the compiled widths (fused_layers.hpp).
#include "kernels/fused_layers.hpp"

#include <type_traits>

#include "comet/common.hpp"

namespace comet::kernels {
namespace {

// Calls fn(std::integral_constant<int, W>) for the compiled width W == tile_n.
template <class Tiles, class Fn>
void with_tile(int tile_n, const char* layer, Fn&& fn) {
  bool found = false;
  [&]<int... W>(std::integer_sequence<int, W...>) {
    ((tile_n == W ? (fn(std::integral_constant<int, W>{}), found = true) : false), ...);
  }(Tiles{});
  COMET_REQUIRE(found, "fused ", layer, ": no compiled tile 128x", tile_n);
}

}  // namespace

LaunchLimits layer0_limits(int tile_n, DType dtype) {
  LaunchLimits lim;
  if (dtype == DType::e4m3) {
    with_tile<Fp8Layer0Tiles>(tile_n, "fp8 layer 0", [&](auto w) { lim = layer0_fp8_limits_tile<decltype(w)::value>(); });
  } else {
    with_tile<Layer0Tiles>(tile_n, "layer 0", [&](auto w) { lim = layer0_limits_tile<decltype(w)::value>(); });
  }
  return lim;
}
LaunchLimits layer1_limits(int tile_n) {
  LaunchLimits lim;
  with_tile<Layer1Tiles>(tile_n, "layer 1", [&](auto w) { lim = layer1_limits_tile<decltype(w)::value>(); });
  return lim;
}
void launch_layer0(const Layer0Launch& l, cudaStream_t stream) {
  if (l.dtype == DType::e4m3) {
    with_tile<Fp8Layer0Tiles>(l.tile_n, "fp8 layer 0",
                              [&](auto w) { launch_layer0_fp8_tile<decltype(w)::value>(l, stream); });
  } else {
    with_tile<Layer0Tiles>(l.tile_n, "layer 0", [&](auto w) { launch_layer0_tile<decltype(w)::value>(l, stream); });
  }
}
void launch_layer1(const Layer1Launch& l, cudaStream_t stream) {
  with_tile<Layer1Tiles>(l.tile_n, "layer 1", [&](auto w) { launch_layer1_tile<decltype(w)::value>(l, stream); });
}

LaunchLimits grad_layer_limits(int launch, int tile_n) {
  COMET_REQUIRE(launch == 2 || launch == 3, "backward launch must be 2 or 3, got ", launch);
  LaunchLimits lim;
  with_tile<GradTiles>(tile_n, "backward", [&](auto w) {
    lim = launch == 3 ? grad_layer0_limits_tile<decltype(w)::value>() : grad_layer1_limits_tile<decltype(w)::value>();
  });
  return lim;
}
void launch_grad_layer1(const GradLayer1Launch& l, cudaStream_t stream) {
  with_tile<GradTiles>(l.tile_n, "backward of layer 1",
                       [&](auto w) { launch_grad_layer1_tile<decltype(w)::value>(l, stream); });
}
void launch_grad_layer0(const GradLayer0Launch& l, cudaStream_t stream) {
  with_tile<GradTiles>(l.tile_n, "backward of layer 0",
                       [&](auto w) { launch_grad_layer0_tile<decltype(w)::value>(l, stream); });
}

}  // namespace comet::kernels
