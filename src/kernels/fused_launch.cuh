// Launch of the fused kernels for one compiled tile shape (included by one .cu per shape).
#pragma once

#include <string>

#include "comet/cuda_check.hpp"
#include "kernels/fused_layers.hpp"
#include "kernels/layer0_kernel.cuh"
#include "kernels/layer1_kernel.cuh"

namespace comet::kernels {

// Resident blocks per SM with the kernel's dynamic shared memory; the persistent grid must fit in
// sms * that, or blocks that wait on each other could wait on a block that never starts.
// Queried once per kernel and device (the attribute is set there too), then read from the cache: a
// launch's host path makes no attribute or occupancy calls.
template <class Kernel>
LaunchLimits resident_limits(Kernel kernel, int smem_bytes, int threads) {
  constexpr int kMaxDevices = 64;
  static LaunchLimits cache[kMaxDevices] = {};
  int device = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices && cache[device].max_blocks > 0) return cache[device];
  int sms = 0, per_sm = 0;
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COMET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  COMET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes));
  const LaunchLimits lim{sms, sms * per_sm};
  if (device < kMaxDevices) cache[device] = lim;
  return lim;
}

template <class Cfg>
LaunchLimits layer0_limits_for() {
  return resident_limits(layer0_kernel<Cfg>, Cfg::kSharedBytes, Cfg::kThreads);
}
template <class Cfg>
LaunchLimits layer1_limits_for() {
  return resident_limits(layer1_kernel<Cfg>, Cfg::kSharedBytes, Cfg::kThreads);
}

// Whether a compiled kernel can run a launch: empty, or why not (checked before every launch, so a
// request no kernel can serve is an InvalidArgument, not a fault).
template <class Cfg>
std::string layer0_can_implement(const Layer0Launch& l, const KernelSplit& split) {
  // The comm blocks stage rows in the GEMM's shared memory: enough stages for the store lag + 1 load.
  const int stages = (Cfg::kSharedBytes - dispatch::kRowsOffset) / (l.dispatch.hidden * 2);
  if (split.n_comm > 0 && stages <= l.dispatch.store_lag)
    return detail::concat("fused layer 0: rows of ", l.dispatch.hidden, " values leave ", stages,
                          " bulk-copy stages, store lag ", l.dispatch.store_lag, " needs more");
  if (l.dispatch.hidden % 8 != 0 || l.n0 <= 0 || l.experts <= 0)
    return detail::concat("fused layer 0: H (", l.dispatch.hidden, ") must be a multiple of 8, N and experts > 0");
  return {};
}

template <class Cfg>
std::string layer1_can_implement(const Layer1Launch& l, const KernelSplit& split) {
  // The combine stages k row slices per warp, twice, in the GEMM's shared memory.
  if (split.n_comm > 0 && Cfg::kSharedBytes < Cfg::kThreads / 32 * 2 * kCombineSliceBytes * l.combine.topk)
    return detail::concat("fused layer 1: top-", l.combine.topk,
                          " needs more shared memory for the combine than the tile leaves");
  if (l.ffn_shard % 8 != 0 || l.experts <= 0)
    return detail::concat("fused layer 1: F/tp (", l.ffn_shard, ") must be a multiple of 8, experts > 0");
  return {};
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
  const std::string why = layer0_can_implement<Cfg>(l, p.split);
  COMET_REQUIRE(why.empty(), why);
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
  const std::string why = layer1_can_implement<Cfg>(l, p.split);
  COMET_REQUIRE(why.empty(), why);
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

