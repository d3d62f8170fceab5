// Launch of the fused kernels for one compiled tile shape (included by one .cu per shape).
#pragma once

#include <string>

#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"
#include "kernels/fp8_gemm_config.cuh"
#include "kernels/activation_grad_epilogue.cuh"
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
  if (per_sm <= 0) {  // a persistent grid of 0 blocks would do nothing, silently
    cudaFuncAttributes a{};
    COMET_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel));
    throw CudaError(detail::concat("a fused kernel cannot be resident on this GPU: ", threads, " threads, ", smem_bytes,
                           " B of dynamic shared memory, ", a.numRegs, " registers, ", a.sharedSizeBytes,
                           " B of static shared memory, ", a.localSizeBytes, " B of local memory, at most ",
                           a.maxThreadsPerBlock, " threads per block"));
  }
  const LaunchLimits lim{sms, sms * per_sm};
  if (device < kMaxDevices) cache[device] = lim;
  return lim;
}

// Transport (transport.cuh): how the comm blocks reach peers. The fused_tile*.cu entry points are
// PeerTransport's; src/kernels/nvshmem instantiates NvshmemTransport's.
template <class Cfg, class Epi = ActivationStore, class Transport = PeerTransport>
LaunchLimits layer0_limits_for() {
  return resident_limits(layer0_kernel<Cfg, Epi, Transport>, Cfg::kSharedBytes, Cfg::kThreads);
}
template <class Cfg, class Transport = PeerTransport>
LaunchLimits layer1_limits_for() {
  return resident_limits(layer1_kernel<Cfg, Transport>, Cfg::kSharedBytes, Cfg::kThreads);
}

// Whether a compiled kernel can run a launch: empty, or why not (checked before every launch, so a
// request no kernel can serve is an InvalidArgument, not a fault).
template <class Cfg, class Transport = PeerTransport>
std::string layer0_can_implement(const DispatchArgs& d, int n, int experts, const KernelSplit& split) {
  // The comm blocks stage rows in the GEMM's shared memory: a pipeline needs two stages (one row
  // loading while the other is stored). Warp issuers (NVSHMEM gets) stage nothing.
  const int stages = dispatch::row_stages(Cfg::kSharedBytes, d.hidden);
  if (!Transport::kWarpPulls && split.n_comm > 0 && stages < 2)
    return detail::concat("fused layer 0: rows of ", d.hidden, " values leave ", stages,
                          " bulk-copy stages in shared memory, the comm blocks need 2");
  if (d.store_lag != 1 && d.store_lag != 2 && d.store_lag != 4 && d.store_lag != dispatch::kMaxStoreLag)
    return detail::concat("fused layer 0: store lag ", d.store_lag, " is not 1, 2, 4 or 8");
  if (d.hidden % 8 != 0 || n <= 0 || n % 8 != 0 || experts <= 0)
    return detail::concat("fused layer 0: H (", d.hidden, ") and N (", n, ") must be multiples of 8, experts > 0");
  return {};
}
template <class Cfg, class Transport = PeerTransport>
std::string layer0_can_implement(const Layer0Launch& l, const KernelSplit& split) {
  // The epilogue stores 16-byte units of 8 output columns (epilogue.cuh: store_tile).
  if (l.hid_ld % 8 != 0 || (l.act == EpilogueOp::swiglu && l.n0 % 16 != 0))
    return detail::concat("fused layer 0: the hidden rows' stride (", l.hid_ld, ") must be a multiple of 8 and, for ",
                          "swiglu, N (", l.n0, ") a multiple of 16");
  return layer0_can_implement<Cfg, Transport>(l.dispatch, l.n0, l.experts, split);
}

template <class Cfg>
std::string layer1_can_implement(int topk, int k, int experts, const KernelSplit& split) {
  // The combine stages k row slices per warp, twice, in the GEMM's shared memory.
  if ((split.n_comm > 0 || split.one_launch) && Cfg::kSharedBytes < Cfg::kThreads / 32 * 2 * kCombineSliceBytes * topk)
    return detail::concat("fused layer 1: top-", topk, " needs more shared memory for the combine than the tile leaves");
  if (k % 8 != 0 || experts <= 0)
    return detail::concat("fused layer 1: K (", k, ") must be a multiple of 8, experts > 0");
  return {};
}
template <class Cfg>
std::string layer1_can_implement(const Layer1Launch& l, const KernelSplit& split) {
  return layer1_can_implement<Cfg>(l.combine.topk, l.ffn_shard, l.experts, split);
}

// Layer 0's kernel: dispatch into A (d.a) + A B_e (the mainloop's operands, over ext) + the epilogue.
template <class Cfg, class Epi, class Transport = PeerTransport>
void launch_layer0_kernel(const DispatchArgs& d, const typename Cfg::MainloopParams& mainloop, const GemmExtents& ext,
                          const Epi& epi, const GridSplit& split, cudaStream_t stream, const Transport& tr = {}) {
  const LaunchLimits lim = layer0_limits_for<Cfg, Epi, Transport>();
  Layer0Params<Cfg, Epi, Transport> p{};
  p.ext = ext;
  p.mainloop = mainloop;
  p.dispatch = d;
  p.epi = epi;
  p.split = kernel_split(split, lim, Cfg::kSharedBytes);
  p.transport = tr;
  const std::string why = layer0_can_implement<Cfg, Transport>(d, ext.n, ext.experts, p.split);
  COMET_REQUIRE(why.empty(), why);
  const int grid = p.split.n_comm + p.split.n_compute;
  if (grid == 0) return;
  layer0_kernel<Cfg, Epi, Transport><<<grid, Cfg::kThreads, Cfg::kSharedBytes, stream>>>(p);
  COMET_CUDA_CHECK_LAUNCH();
}

// bf16 A [rows_cap][H] and B [experts] x (n0, H).
template <class Cfg, class Transport = PeerTransport>
void launch_layer0_for(const Layer0Launch& l, cudaStream_t stream, const Transport& tr = {}) {
  const ActivationStore epi{l.act, static_cast<__nv_bfloat16*>(l.hid), l.hid_ld, l.n0, static_cast<__nv_bfloat16*>(l.pre)};
  const DispatchArgs& d = l.dispatch;
  launch_layer0_kernel<Cfg>(d, Cfg::make_params(d.a, l.rows_cap, d.hidden, l.w0, l.n0, l.experts),
                            GemmExtents{l.rows_cap, l.n0, d.hidden, l.experts}, epi, l.split, stream, tr);
}

// fp8: A holds token records (comet/fp8.hpp; the dispatch moves them as rows of record_bytes / 2
// 16-bit units), B the e4m3 codes of W0 with their 128 x 128 scales.
template <class Cfg, class Transport = PeerTransport>
void launch_layer0_fp8_for(const Layer0Launch& l, cudaStream_t stream, const Transport& tr = {}) {
  const DispatchArgs& d = l.dispatch;
  const int row_bytes = fp8::record_bytes(l.hidden);
  COMET_REQUIRE(l.hidden > 0 && l.hidden % Cfg::kScaleBlock == 0, "fp8 layer 0: H (", l.hidden,
                ") must be a positive multiple of ", Cfg::kScaleBlock);
  COMET_REQUIRE(d.hidden * 2 == row_bytes, "fp8 layer 0: the dispatch moves rows of ", d.hidden * 2,
                " bytes, a record of H = ", l.hidden, " has ", row_bytes);
  COMET_REQUIRE(l.w0_scales != nullptr, "fp8 layer 0: W0's block scales are missing");
  // The scales' layout indexes in int32: the last record's last scale must be addressable.
  COMET_REQUIRE(int64_t(l.rows_cap) * (row_bytes / 4) < (int64_t(1) << 31), "fp8 layer 0: ", l.rows_cap,
                " records of ", row_bytes, " bytes exceed the scale view's 32-bit index");
  const ActivationStore epi{l.act, static_cast<__nv_bfloat16*>(l.hid), l.hid_ld, l.n0, static_cast<__nv_bfloat16*>(l.pre)};
  launch_layer0_kernel<Cfg>(d, Cfg::make_params(d.a, l.rows_cap, l.hidden, row_bytes, l.w0, l.w0_scales, l.n0, l.experts),
                            GemmExtents{l.rows_cap, l.n0, l.hidden, l.experts}, epi, l.split, stream, tr);
}

// Layer 1's kernel: y = A B_e with A [rows_cap][k], B [experts] x (H, k), + the combine of y.
template <class Cfg, class Transport = PeerTransport>
void launch_layer1_kernel(const void* a, int k, const void* b, int experts, int rows_cap, void* y, Epoch* tile_done,
                          const CombineArgs& combine, const GridSplit& split, cudaStream_t stream,
                          const Transport& tr = {}) {
  const LaunchLimits lim = layer1_limits_for<Cfg, Transport>();
  Layer1Params<Cfg, Transport> p{};
  p.ext = GemmExtents{rows_cap, combine.hidden, k, experts};
  p.mainloop = Cfg::make_params(a, rows_cap, k, b, combine.hidden, experts);
  // One set of flags for both roles: the compute blocks release tile_done, the comm blocks wait on it
  // (a combine left without it would wait on address 0: the transport test's first GPU run did).
  COMET_REQUIRE(combine.tile_done == nullptr || combine.tile_done == tile_done,
                "fused layer 1: the combine waits on other tile flags than the GEMM releases");
  p.combine = combine;
  p.combine.tile_done = tile_done;
  p.y = static_cast<__nv_bfloat16*>(y);
  p.tile_done = tile_done;
  p.split = kernel_split(split, lim, Cfg::kSharedBytes);
  p.transport = tr;
  const std::string why = layer1_can_implement<Cfg>(combine.topk, k, experts, p.split);
  COMET_REQUIRE(why.empty(), why);
  const int grid = p.split.n_comm + p.split.n_compute;
  if (grid == 0) return;
  layer1_kernel<Cfg, Transport><<<grid, Cfg::kThreads, Cfg::kSharedBytes, stream>>>(p);
  COMET_CUDA_CHECK_LAUNCH();
}

template <class Cfg, class Transport = PeerTransport>
void launch_layer1_for(const Layer1Launch& l, cudaStream_t stream, const Transport& tr = {}) {
  launch_layer1_kernel<Cfg>(l.hid, l.ffn_shard, l.w1, l.experts, l.rows_cap, l.y, l.tile_done, l.combine, l.split,
                            stream, tr);
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
LaunchLimits layer0_fp8_limits_tile() {
  return layer0_limits_for<Fp8GemmConfig<kTileM, TileN>>();
}
template <int TileN>
void launch_layer0_fp8_tile(const Layer0Launch& l, cudaStream_t stream) {
  launch_layer0_fp8_for<Fp8GemmConfig<kTileM, TileN>>(l, stream);
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
// The backward of layer 1 through a transport (launch_grad_layer1_tile: peer pointers).
template <int TileN, class Transport>
void launch_grad_layer1_via(const GradLayer1Launch& l, cudaStream_t stream, const Transport& tr) {
  using Cfg = GradConfig<TileN>;
  const DispatchArgs& d = l.dispatch;
  const auto mainloop = Cfg::make_params(d.a, l.rows_cap, d.hidden, l.w1, l.ffn_shard, l.experts);
  const GemmExtents ext{l.rows_cap, l.ffn_shard, d.hidden, l.experts};
  if (l.fused_activation) {
    const int n_blocks = (l.ffn_shard + TileN - 1) / TileN;
    COMET_REQUIRE(l.pre && l.hid && l.gate_partials && l.gate_ld >= n_blocks && l.topk > 0,
                  "backward of layer 1: the activation-backward epilogue needs pre, hid and ", n_blocks,
                  " gate-partial columns (has ", l.gate_ld, ")");
    COMET_REQUIRE(l.ffn_shard % 8 == 0 && l.pre_ld == (l.act == EpilogueOp::swiglu ? 2 : 1) * l.ffn_shard,
                  "backward of layer 1: F/tp (", l.ffn_shard, ") must be a multiple of 8 and the pre-activations ",
                  (l.act == EpilogueOp::swiglu ? 2 : 1), " x F/tp wide (", l.pre_ld, ")");
    const ActivationGradStore epi{l.act, static_cast<__nv_bfloat16*>(l.pre), l.pre_ld,
                                  static_cast<__nv_bfloat16*>(l.hid), l.ffn_shard, l.gate_partials, l.gate_ld,
                                  l.topk, d.plan.row_unit, d.plan.row_slot, d.plan.unit_gates};
    launch_layer0_kernel<Cfg>(d, mainloop, ext, epi, l.split, stream, tr);
    return;
  }
  const ActivationStore epi{EpilogueOp::none, static_cast<__nv_bfloat16*>(l.d), l.ffn_shard, l.ffn_shard, nullptr};
  launch_layer0_kernel<Cfg>(d, mainloop, ext, epi, l.split, stream, tr);
}
template <int TileN>
void launch_grad_layer1_tile(const GradLayer1Launch& l, cudaStream_t stream) {
  launch_grad_layer1_via<TileN>(l, stream, PeerTransport{});
}
template <int TileN>
LaunchLimits grad_layer0_limits_tile() {
  return layer1_limits_for<GradConfig<TileN>>();
}
// The backward of layer 0 through a transport (launch_grad_layer0_tile: peer pointers).
template <int TileN, class Transport>
void launch_grad_layer0_via(const GradLayer0Launch& l, cudaStream_t stream, const Transport& tr) {
  launch_layer1_kernel<GradConfig<TileN>>(l.dpre, l.n0, l.w0, l.experts, l.rows_cap, l.y, l.tile_done, l.combine,
                                          l.split, stream, tr);
}
template <int TileN>
void launch_grad_layer0_tile(const GradLayer0Launch& l, cudaStream_t stream) {
  launch_grad_layer0_via<TileN>(l, stream, PeerTransport{});
}

}  // namespace comet::kernels
