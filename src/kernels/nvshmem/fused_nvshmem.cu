// The fused layers over NVSHMEM (fused_nvshmem.hpp): fused_launch.cuh's launchers (forward and
// backward), the gate-gradient ship and the failure words with NvshmemTransport, one tile width; the
// routing gather; and the binding of this module's NVSHMEM device state.
#include "kernels/nvshmem/fused_nvshmem.hpp"

#include "comet/plan.hpp"
#include "kernels/fused_launch.cuh"
#include "kernels/gate_grad_ship.cuh"
#include "kernels/peer_failure.cuh"
#include "kernels/transport_nvshmem.cuh"
#include "team/nvshmem_heap.hpp"

namespace comet::kernels::nvshmem {
namespace {

using Cfg = GemmConfig<kTileM, kTileN>;

NvshmemTransport transport_of(const TransportArgs& t) {
  NvshmemTransport tr;
  tr.pe_base = t.pe_base;
  tr.staging = static_cast<__nv_bfloat16*>(t.staging);
  return tr;
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
  team_detail::NvshmemHeap::bind_module(reinterpret_cast<const void*>(layer0_kernel<Cfg, ActivationStore, NvshmemTransport>));
  bind_fp8_kernels();  // fused_fp8_nvshmem.cu: a module of its own
}

size_t staging_bytes(int comm_blocks) { return NvshmemTransport::staging_bytes(comm_blocks * (Cfg::kThreads / 32)); }

LaunchLimits layer0_limits() { return layer0_limits_for<Cfg, ActivationStore, NvshmemTransport>(); }
LaunchLimits layer1_limits() { return layer1_limits_for<Cfg, NvshmemTransport>(); }

void launch_layer0(const Layer0Launch& l, const TransportArgs& t, cudaStream_t stream) {
  if (l.dtype == DType::e4m3) return launch_layer0_fp8(l, t, stream);
  COMET_REQUIRE(l.tile_n == kTileN && l.dtype == DType::bf16, "fused layer 0 over NVSHMEM: bf16 with tile 128x",
                kTileN, " only (asked: ", to_string(l.dtype), ", 128x", l.tile_n, ")");
  launch_layer0_for<Cfg>(l, stream, transport_of(t));
}

void launch_layer1(const Layer1Launch& l, const TransportArgs& t, cudaStream_t stream) {
  COMET_REQUIRE(l.tile_n == kTileN, "fused layer 1 over NVSHMEM: tile 128x", kTileN, " only (asked: 128x", l.tile_n, ")");
  COMET_REQUIRE(t.staging != nullptr || l.split.n_comm == 0,
                "fused layer 1 over NVSHMEM: comm blocks need the put staging (staging_bytes)");
  launch_layer1_for<Cfg>(l, stream, transport_of(t));
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
