// Launch of the fused kernels for one compiled tile shape (included by one .cu per shape).
#pragma once

#include "comet/cuda_check.hpp"
#include "kernels/fused_layers.hpp"
#include "kernels/layer0_kernel.cuh"
#include "kernels/layer1_kernel.cuh"

namespace comet::kernels {

// Resident blocks per SM with the kernel's dynamic shared memory; the persistent grid must fit in
// sms * that, or blocks that wait on each other could wait on a block that never starts.
template <class Kernel>
LaunchLimits resident_limits(Kernel kernel, int smem_bytes, int threads) {
  int device = 0, sms = 0, per_sm = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COMET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  COMET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  return LaunchLimits{sms, sms * per_sm};
}

template <class Cfg>
LaunchLimits layer0_limits_for() {
  return resident_limits(layer0_kernel<Cfg>, Cfg::kSharedBytes, Cfg::kThreads);
}
template <class Cfg>
LaunchLimits layer1_limits_for() {
  return resident_limits(layer1_kernel<Cfg>, Cfg::kSharedBytes, Cfg::kThreads);
}

template <class Cfg>
void launch_layer0_for(const Layer0Launch& l, cudaStream_t stream) {
  const LaunchLimits lim = layer0_limits_for<Cfg>();
  Layer0Params<Cfg> p{};
  p.ext = GemmExtents{l.rows_cap, l.n0, l.dispatch.hidden, l.experts};
  p.mainloop = Cfg::make_params(l.dispatch.a, l.rows_cap, l.dispatch.hidden, l.w0, l.n0, l.experts);
  p.dispatch = l.dispatch;
  p.act = l.act;
  p.hid = static_cast<__nv_bfloat16*>(l.hid);
  p.hid_ld = l.hid_ld;
  p.split = kernel_split(l.split, lim, Cfg::kSharedBytes);
  // The comm blocks stage rows in the GEMM's shared memory: enough stages for the store lag + 1 load.
  const int stages = (Cfg::kSharedBytes - dispatch::kRowsOffset) / (l.dispatch.hidden * 2);
  COMET_REQUIRE(p.split.n_comm == 0 || stages > l.dispatch.store_lag, "fused layer 0: rows of ", l.dispatch.hidden,
                " values leave ", stages, " bulk-copy stages, store lag ", l.dispatch.store_lag, " needs more");
  const int grid = p.split.n_comm + p.split.n_compute;
  if (grid == 0) return;
  layer0_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSharedBytes, stream>>>(p);
  COMET_CUDA_CHECK_LAUNCH();
}

template <class Cfg>
void launch_layer1_for(const Layer1Launch& l, cudaStream_t stream) {
  const LaunchLimits lim = layer1_limits_for<Cfg>();
  Layer1Params<Cfg> p{};
  p.ext = GemmExtents{l.rows_cap, l.combine.hidden, l.ffn_shard, l.experts};
  p.mainloop = Cfg::make_params(l.hid, l.rows_cap, l.ffn_shard, l.w1, l.combine.hidden, l.experts);
  p.combine = l.combine;
  p.y = static_cast<__nv_bfloat16*>(l.y);
  p.tile_done = l.tile_done;
  p.split = kernel_split(l.split, lim, Cfg::kSharedBytes);
  // The combine stages k row slices per warp, twice, in the GEMM's shared memory.
  COMET_REQUIRE(p.split.n_comm == 0 || Cfg::kSharedBytes >= Cfg::kThreads / 32 * 2 * kCombineSliceBytes * l.combine.topk,
                "fused layer 1: top-", l.combine.topk, " needs more shared memory for the combine than the tile leaves");
  const int grid = p.split.n_comm + p.split.n_compute;
  if (grid == 0) return;
  layer1_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSharedBytes, stream>>>(p);
  COMET_CUDA_CHECK_LAUNCH();
}

template <int TileN>
LaunchLimits layer0_limits_tile() {
  return layer0_limits_for<GemmConfig<kTileM, TileN>>();
}
template <int TileN>
void launch_layer0_tile(const Layer0Launch& l, cudaStream_t stream) {
  launch_layer0_for<GemmConfig<kTileM, TileN>>(l, stream);
}
template <int TileN>
LaunchLimits layer1_limits_tile() {
  return layer1_limits_for<GemmConfig<kTileM, TileN>>();
}
template <int TileN>
void launch_layer1_tile(const Layer1Launch& l, cudaStream_t stream) {
  launch_layer1_for<GemmConfig<kTileM, TileN>>(l, stream);
}

}  // namespace comet::kernels

