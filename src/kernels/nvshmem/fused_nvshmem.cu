// The fused layers over NVSHMEM (fused_nvshmem.hpp): the forward's bf16 layers per tile width (this
// file compiles 256; forward_tiles.hpp has the others), the backward's fused launchers, the gate-gradient
// ship and the failure words with NvshmemTransport; the routing gather; and the binding of every
// module's NVSHMEM device state.
#include "kernels/nvshmem/fused_nvshmem.hpp"

#include "comet/plan.hpp"
#include "kernels/gate_grad_ship.cuh"
#include "kernels/nvshmem/forward_tile.cuh"
#include "kernels/peer_failure.cuh"

namespace comet::kernels::nvshmem {

const tiles::ForwardTile& tiles::forward_tile256() {
  static const ForwardTile f = make_forward_tile<256>();
  return f;
}

namespace {

using Cfg = GemmConfig<kTileM, kTileN>;
using tiles::transport_of;

// The forward's bf16 layers of a tile width; InvalidArgument for one not compiled.
const tiles::ForwardTile& forward_tile(int tile_n, const char* what) {
  for (const tiles::ForwardTile* f : {&tiles::forward_tile128(), &tiles::forward_tile192(), &tiles::forward_tile256()})
    if (f->tile_n == tile_n) return *f;
  throw InvalidArgument(comet::detail::concat(what, " over NVSHMEM: no 128x", tile_n, " tile (128, 192 and 256 are compiled)"));
}

// Block p copies rank p's routing: its token count, then the ids and gates of those tokens (blocking
// block-wide gets: they have landed when the call returns). The count is read once, by one thread.
__global__ void gather_routing_kernel(GatherRoutingArgs a, int pe_base) {
  const RoutingBufferLayout layout{a.max_tokens, a.topk};
  const int rank = blockIdx.x, pe = pe_base + rank;
  const char* src = static_cast<const char*>(a.routing);
  char* dst = static_cast<char*>(a.mirror) + size_t(rank) * layout.bytes();
  __shared__ int32_t tokens;
  if (threadIdx.x == 0) {
    tokens = nvshmem_int32_g(reinterpret_cast<const int32_t*>(src), pe);
    // A count the owner checked (stage) cannot exceed the capacity; clamp all the same: the copy must
    // stay inside this rank's slot of the mirror whatever the peer wrote.
    tokens = min(max(tokens, 0), a.max_tokens);
    *reinterpret_cast<int32_t*>(dst) = tokens;
  }
  __syncthreads();
  const size_t bytes = size_t(tokens) * a.topk * 4;
  if (bytes == 0) return;
  nvshmemx_getmem_block(dst + layout.ids_offset(), src + layout.ids_offset(), bytes, pe);
  nvshmemx_getmem_block(dst + layout.gates_offset(), src + layout.gates_offset(), bytes, pe);
  __threadfence();  // the plan's kernels, next on the stream, read the mirror
}

}  // namespace

void bind_fused_kernels() {
  // This module (the 256 tile, the backward, the small kernels), then each of its own.
  team_detail::NvshmemHeap::bind_module(reinterpret_cast<const void*>(layer0_kernel<Cfg, ActivationStore, NvshmemTransport>));
  tiles::forward_tile128().bind();
  tiles::forward_tile192().bind();
  bind_fp8_kernels();
}

size_t staging_bytes(int comm_blocks) { return NvshmemTransport::staging_bytes(comm_blocks * (Cfg::kThreads / 32)); }

LaunchLimits layer0_limits(int tile_n) { return forward_tile(tile_n, "fused layer 0").layer0_limits(); }
LaunchLimits layer1_limits(int tile_n) { return forward_tile(tile_n, "fused layer 1").layer1_limits(); }
int max_layer1_blocks() {
  int most = 0;
  for (int tile_n : {128, 192, 256}) most = std::max(most, layer1_limits(tile_n).max_blocks);
  return most;
}

void launch_layer0(const Layer0Launch& l, const TransportArgs& t, cudaStream_t stream) {
  if (l.dtype == DType::e4m3) return launch_layer0_fp8(l, t, stream);
  COMET_REQUIRE(l.dtype == DType::bf16, "fused layer 0 over NVSHMEM: bf16 or e4m3 (asked: ", to_string(l.dtype), ")");
  forward_tile(l.tile_n, "fused layer 0").layer0(l, t, stream);
}

void launch_layer1(const Layer1Launch& l, const TransportArgs& t, cudaStream_t stream) {
  forward_tile(l.tile_n, "fused layer 1").layer1(l, t, stream);
}

void launch_grad_layer1(const GradLayer1Launch& l, const TransportArgs& t, cudaStream_t stream) {
  COMET_REQUIRE(l.tile_n == kTileN, "backward of layer 1 over NVSHMEM: tile 128x", kTileN, " only (asked: 128x",
                l.tile_n, ")");
  launch_grad_layer1_via<kTileN>(l, stream, transport_of(t));
}

void launch_grad_layer0(const GradLayer0Launch& l, const TransportArgs& t, cudaStream_t stream) {
  COMET_REQUIRE(l.tile_n == kTileN, "backward of layer 0 over NVSHMEM: tile 128x", kTileN, " only (asked: 128x",
                l.tile_n, ")");
  COMET_REQUIRE(t.staging != nullptr || l.split.n_comm == 0,
                "backward of layer 0 over NVSHMEM: comm blocks need the put staging (staging_bytes)");
  launch_grad_layer0_via<kTileN>(l, stream, transport_of(t));
}

void ship_gate_grads(const ShipGateGradsArgs& a, const TransportArgs& t, cudaStream_t stream) {
  launch_ship_gate_grads(a, stream, transport_of(t));
}

void publish_failure(const PublishFailureArgs& args, const TransportArgs& t, cudaStream_t stream) {
  launch_publish_failure(args, stream, transport_of(t));
}

void gather_routing(const GatherRoutingArgs& a, const TransportArgs& t, cudaStream_t stream) {
  COMET_REQUIRE(a.routing && a.mirror && a.world >= 1 && a.max_tokens >= 0 && a.topk >= 1,
                "gather_routing: bad arguments");
  gather_routing_kernel<<<a.world, 256, 0, stream>>>(a, t.pe_base);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::kernels::nvshmem
