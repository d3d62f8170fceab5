// fp8 (e4m3) layer 0 over NVSHMEM (fused_nvshmem.hpp): the comm blocks get token records (codes and
// 1 x 128 scales, comet/fp8.hpp) from their owners' symmetric buffers with NVSHMEM's gets; the GEMM is
// the block-scaled 128 x 128 one of fused_fp8_tile128x128.cu. Its own translation unit (and so its
// own module and copy of NVSHMEM's device state, bound by bind_fused_kernels) so that the two CUTLASS
// builds compile side by side.
#include "kernels/nvshmem/fused_nvshmem.hpp"

#include "kernels/nvshmem/forward_tile.cuh"  // fused_launch.cuh, the transport, transport_of

namespace comet::kernels::nvshmem {
namespace {

using Fp8Cfg = Fp8GemmConfig<kTileM, kFp8TileN>;

}  // namespace

void bind_fp8_kernels() {
  team_detail::NvshmemHeap::bind_module(reinterpret_cast<const void*>(layer0_kernel<Fp8Cfg, ActivationStore, NvshmemTransport>));
}

LaunchLimits layer0_fp8_limits() { return layer0_limits_for<Fp8Cfg, ActivationStore, NvshmemTransport>(); }

void launch_layer0_fp8(const Layer0Launch& l, const TransportArgs& t, cudaStream_t stream) {
  COMET_REQUIRE(l.tile_n == kFp8TileN && l.dtype == DType::e4m3, "fp8 layer 0 over NVSHMEM: e4m3 with tile 128x",
                kFp8TileN, " only (asked: ", to_string(l.dtype), ", 128x", l.tile_n, ")");
  launch_layer0_fp8_for<Fp8Cfg>(l, stream, tiles::transport_of(t));  // layer 0 gets; its staging stays unused
}

}  // namespace comet::kernels::nvshmem
