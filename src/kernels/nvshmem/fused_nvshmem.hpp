// The fused layers with NVSHMEM's device transport (NvshmemTransport, transport_nvshmem.cuh): the same
// kernels as fused_layers.hpp's, whose comm blocks get rows from and put slices to PEs instead of
// loading and storing through peer pointers. Built into comet where NVSHMEM's headers are
// (COMET_HAVE_NVSHMEM_KERNELS); FusedMoe launches them with MoeOptions::transport = nvshmem. This header
// keeps NVSHMEM's own headers out of its users. Tile widths: 128, 192 and 256 for the forward's bf16
// layers (as with peer pointers), 256 (kTileN) for the backward's two fused kernels, kFp8TileN for the
// fp8 layer 0; the backward's gate-gradient ship; and the layer's other remote
// accesses, so that a layer on this transport uses no peer pointer: the routing of every rank copied
// into a local mirror for the plan (gather_routing) and a failed call's words (publish_failure).
//
// The arguments are those of launch_layer0 / launch_layer1, with one difference: every entry of
// dispatch.peer_x and combine.peer_recv holds this rank's own symmetric address of the buffer (the
// transport adds the PE). Before the first launch, NVSHMEM must be initialised (the host library is
// enough: nvshmemx_hostlib_init_attr, as SymmetricHeap::nvshmem does) and bind_fused_kernels called,
// which fills this module's copy of NVSHMEM's device state (NvshmemHeap::bind_module).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/fused_layers.hpp"
#include "kernels/grad_rows.hpp"
#include "kernels/peer_failure.hpp"

namespace comet::kernels::nvshmem {

inline constexpr int kTileN = 256;     // the backward's fused launches (the forward's bf16 layers: 128, 192, 256)
inline constexpr int kFp8TileN = 128;  // the fp8 (e4m3) layer 0 (its one compiled tile)

struct TransportArgs {
  int pe_base = 0;          // the PE of team rank 0: rank r is PE pe_base + r
  void* staging = nullptr;  // layer 1: staging_bytes(comm blocks) of symmetric (or registered) memory
};

// Binds the NVSHMEM device state of the modules below (team_detail::NvshmemHeap::bind_module), once
// per NVSHMEM initialisation, before the first launch.
void bind_fused_kernels();

// Bytes of layer 1's put staging for a launch with up to `comm_blocks` comm blocks (with the adaptive
// split: the most it may pick).
size_t staging_bytes(int comm_blocks);

// The forward's bf16 layers: tile widths 128, 192 and 256, like the peer-pointer kernels'.
LaunchLimits layer0_limits(int tile_n);
LaunchLimits layer1_limits(int tile_n);
int max_layer1_blocks();  // the most resident blocks of any layer-1 width (sizes the put staging)
// Layer 0 in bf16 (tile 128 x l.tile_n) or, with l.dtype e4m3, in fp8 (tile 128 x kFp8TileN: the
// records of comet/fp8.hpp are what the gets move; fused_fp8_nvshmem.cu).
void launch_layer0(const Layer0Launch& l, const TransportArgs& t, cudaStream_t stream);
LaunchLimits layer0_fp8_limits();
void launch_layer0_fp8(const Layer0Launch& l, const TransportArgs& t, cudaStream_t stream);
void bind_fp8_kernels();  // bind_fused_kernels calls it
void launch_layer1(const Layer1Launch& l, const TransportArgs& t, cudaStream_t stream);
void launch_grad_layer1(const GradLayer1Launch& l, const TransportArgs& t, cudaStream_t stream);
void launch_grad_layer0(const GradLayer0Launch& l, const TransportArgs& t, cudaStream_t stream);
void ship_gate_grads(const ShipGateGradsArgs& a, const TransportArgs& t, cudaStream_t stream);
// peer_failure.hpp's publish with NVSHMEM puts: args.peer_words[q] is this rank's own symmetric address
// of the failure area.
void publish_failure(const PublishFailureArgs& args, const TransportArgs& t, cudaStream_t stream);

// Every rank's routing buffer (RoutingBufferLayout{max_tokens, topk}; `routing` is this rank's own
// symmetric address of it) copied into `mirror` [world][layout.bytes()] (registered where NVSHMEM has a
// NIC), as far as each rank's token count reaches, so that DevicePlan::build reads local memory only.
struct GatherRoutingArgs {
  const void* routing = nullptr;
  void* mirror = nullptr;
  int max_tokens = 0, topk = 0, world = 1;
};
void gather_routing(const GatherRoutingArgs& a, const TransportArgs& t, cudaStream_t stream);

}  // namespace comet::kernels::nvshmem
