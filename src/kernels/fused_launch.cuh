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

template <class Cfg, class Epi = ActivationStore>
LaunchLimits layer0_limits_for() {
  return resident_limits(layer0_kernel<Cfg, Epi>, Cfg::kSharedBytes, Cfg::kThreads);
}
template <class Cfg>
LaunchLimits layer1_limits_for() {
  return resident_limits(layer1_kernel<Cfg>, Cfg::kSharedBytes, Cfg::kThreads);
}

// Whether a compiled kernel can run a launch: empty, or why not (checked before every launch, so a
// request no kernel can serve is an InvalidArgument, not a fault).
template <class Cfg>
std::string layer0_can_implement(const DispatchArgs& d, int n, int experts, const KernelSplit& split) {
  // The comm blocks stage rows in the GEMM's shared memory: a pipeline needs two stages (one row
  // loading while the other is stored).
  const int stages = dispatch::row_stages(Cfg::kSharedBytes, d.hidden);
  if (split.n_comm > 0 && stages < 2)
    return detail::concat("fused layer 0: rows of ", d.hidden, " values leave ", stages,
                          " bulk-copy stages in shared memory, the comm blocks need 2");
  if (d.store_lag != 1 && d.store_lag != 2 && d.store_lag != 4 && d.store_lag != dispatch::kMaxStoreLag)
    return detail::concat("fused layer 0: store lag ", d.store_lag, " is not 1, 2, 4 or 8");
  if (d.hidden % 8 != 0 || n <= 0 || n % 8 != 0 || experts <= 0)
    return detail::concat("fused layer 0: H (", d.hidden, ") and N (", n, ") must be multiples of 8, experts > 0");
  return {};
}
template <class Cfg>
std::string layer0_can_implement(const Layer0Launch& l, const KernelSplit& split) {
  // The epilogue stores 16-byte units of 8 output columns (epilogue.cuh: store_tile).
  if (l.hid_ld % 8 != 0 || (l.act == EpilogueOp::swiglu && l.n0 % 16 != 0))
    return detail::concat("fused layer 0: the hidden rows' stride (", l.hid_ld, ") must be a multiple of 8 and, for ",
                          "swiglu, N (", l.n0, ") a multiple of 16");
  return layer0_can_implement<Cfg>(l.dispatch, l.n0, l.experts, split);
}

template <class Cfg>
std::string layer1_can_implement(int topk, int k, int experts, const KernelSplit& split) {
  // The combine stages k row slices per warp, twice, in the GEMM's shared memory.
  if (split.n_comm > 0 && Cfg::kSharedBytes < Cfg::kThreads / 32 * 2 * kCombineSliceBytes * topk)
    return detail::concat("fused layer 1: top-", topk, " needs more shared memory for the combine than the tile leaves");
  if (k % 8 != 0 || experts <= 0)
    return detail::concat("fused layer 1: K (", k, ") must be a multiple of 8, experts > 0");
  return {};
}
template <class Cfg>
std::string layer1_can_implement(const Layer1Launch& l, const KernelSplit& split) {
  return layer1_can_implement<Cfg>(l.combine.topk, l.ffn_shard, l.experts, split);
}

// Layer 0's kernel: dispatch into A (d.a) + A B_e with B [experts] x (n, H) + the epilogue `epi`.
template <class Cfg, class Epi>
void launch_layer0_kernel(const DispatchArgs& d, const void* b, int n, int experts, int rows_cap, const Epi& epi,
                          const GridSplit& split, cudaStream_t stream) {
  const LaunchLimits lim = layer0_limits_for<Cfg, Epi>();
  Layer0Params<Cfg, Epi> p{};
  p.ext = GemmExtents{rows_cap, n, d.hidden, experts};
  p.mainloop = Cfg::make_params(d.a, rows_cap, d.hidden, b, n, experts);
  p.dispatch = d;
  p.epi = epi;
  p.split = kernel_split(split, lim, Cfg::kSharedBytes);
  const std::string why = layer0_can_implement<Cfg>(d, n, experts, p.split);
  COMET_REQUIRE(why.empty(), why);
  const int grid = p.split.n_comm + p.split.n_compute;
  if (grid == 0) return;
  layer0_kernel<Cfg, Epi><<<grid, Cfg::kThreads, Cfg::kSharedBytes, stream>>>(p);
  COMET_CUDA_CHECK_LAUNCH();
}

template <class Cfg>
void launch_layer0_for(const Layer0Launch& l, cudaStream_t stream) {
  const ActivationStore epi{l.act, static_cast<__nv_bfloat16*>(l.hid), l.hid_ld, l.n0, static_cast<__nv_bfloat16*>(l.pre)};
  launch_layer0_kernel<Cfg>(l.dispatch, l.w0, l.n0, l.experts, l.rows_cap, epi, l.split, stream);
}

// Layer 1's kernel: y = A B_e with A [rows_cap][k], B [experts] x (H, k), + the combine of y.
template <class Cfg>
void launch_layer1_kernel(const void* a, int k, const void* b, int experts, int rows_cap, void* y, Epoch* tile_done,
                          const CombineArgs& combine, const GridSplit& split, cudaStream_t stream) {
  const LaunchLimits lim = layer1_limits_for<Cfg>();
  Layer1Params<Cfg> p{};
  p.ext = GemmExtents{rows_cap, combine.hidden, k, experts};
  p.mainloop = Cfg::make_params(a, rows_cap, k, b, combine.hidden, experts);
  p.combine = combine;
  p.y = static_cast<__nv_bfloat16*>(y);
  p.tile_done = tile_done;
  p.split = kernel_split(split, lim, Cfg::kSharedBytes);
  const std::string why = layer1_can_implement<Cfg>(combine.topk, k, experts, p.split);
  COMET_REQUIRE(why.empty(), why);
  const int grid = p.split.n_comm + p.split.n_compute;
  if (grid == 0) return;
  layer1_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSharedBytes, stream>>>(p);
  COMET_CUDA_CHECK_LAUNCH();
}

template <class Cfg>
void launch_layer1_for(const Layer1Launch& l, cudaStream_t stream) {
  launch_layer1_kernel<Cfg>(l.hid, l.ffn_shard, l.w1, l.experts, l.rows_cap, l.y, l.tile_done, l.combine, l.split,
                            stream);
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


namespace comet::kernels {

// ---- the backward's fused kernels: the forward's with N-major weights ------------------------------------
template <int TileN>
using GradConfig = GemmConfig<kTileM, TileN, Major::k, Major::mn>;

template <int TileN>
LaunchLimits grad_layer1_limits_tile() {
  return layer0_limits_for<GradConfig<TileN>, ActivationStore>();
}
template <int TileN>
void launch_grad_layer1_tile(const GradLayer1Launch& l, cudaStream_t stream) {
  const ActivationStore epi{EpilogueOp::none, static_cast<__nv_bfloat16*>(l.d), l.ffn_shard, l.ffn_shard, nullptr};
  launch_layer0_kernel<GradConfig<TileN>>(l.dispatch, l.w1, l.ffn_shard, l.experts, l.rows_cap, epi, l.split, stream);
}
template <int TileN>
LaunchLimits grad_layer0_limits_tile() {
  return layer1_limits_for<GradConfig<TileN>>();
}
template <int TileN>
void launch_grad_layer0_tile(const GradLayer0Launch& l, cudaStream_t stream) {
  launch_layer1_kernel<GradConfig<TileN>>(l.dpre, l.n0, l.w0, l.experts, l.rows_cap, l.y, l.tile_done, l.combine,
                                          l.split, stream);
}

}  // namespace comet::kernels
