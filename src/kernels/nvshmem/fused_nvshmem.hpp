// The fused layers with NVSHMEM's device transport (NvshmemTransport, transport_nvshmem.cuh): the same
// kernels as fused_layers.hpp's, whose comm blocks get rows from and put slices to PEs instead of
// loading and storing through peer pointers. Built into comet where NVSHMEM's headers are
// (COMET_HAVE_NVSHMEM_KERNELS); FusedMoe launches them with MoeOptions::transport = nvshmem. This header
// keeps NVSHMEM's own headers out of its users. One tile width for now (kTileN), bf16: the forward's two
// layers, the backward's two fused kernels and its gate-gradient ship.
//
// The arguments are those of launch_layer0 / launch_layer1, with one difference: every entry of
// dispatch.peer_x and combine.peer_recv holds this rank's own symmetric address of the buffer (the
// transport adds the PE). Before the first launch, NVSHMEM must be initialised (the host library is
// enough: nvshmemx_hostlib_init_attr, as SymmetricHeap::nvshmem does) and bind_fused_kernels called
// with the host library's nvshmemx_culibrary_init, which fills this module's copy of NVSHMEM's device
// state.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/fused_layers.hpp"
#include "kernels/grad_rows.hpp"

namespace comet::kernels::nvshmem {

inline constexpr int kTileN = 256;

struct TransportArgs {
  int pe_base = 0;          // the PE of team rank 0: rank r is PE pe_base + r
  void* staging = nullptr;  // layer 1: staging_bytes(comm blocks) of symmetric (or registered) memory
};

// nvshmemx_culibrary_init, as the host library exports it (resolved by the caller, e.g. with dlsym).
using CulibraryInit = int (*)(CUlibrary);

// Fills the NVSHMEM device state of the module (CUDA library) that holds `kernel`. Every module whose
// kernels call NVSHMEM (each translation unit that includes transport_nvshmem.cuh) needs it once per
// process after NVSHMEM's initialisation. Throws CudaError / InvalidArgument with the failing step.
void bind_device_state(const void* kernel, CulibraryInit init);
// bind_device_state for the fused kernels below.
void bind_fused_kernels(CulibraryInit init);

// Bytes of layer 1's put staging for a launch with up to `comm_blocks` comm blocks (with the adaptive
// split: the most it may pick).
size_t staging_bytes(int comm_blocks);

LaunchLimits layer0_limits();
LaunchLimits layer1_limits();
void launch_layer0(const Layer0Launch& l, const TransportArgs& t, cudaStream_t stream);
void launch_layer1(const Layer1Launch& l, const TransportArgs& t, cudaStream_t stream);
void launch_grad_layer1(const GradLayer1Launch& l, const TransportArgs& t, cudaStream_t stream);
void launch_grad_layer0(const GradLayer0Launch& l, const TransportArgs& t, cudaStream_t stream);
void ship_gate_grads(const ShipGateGradsArgs& a, const TransportArgs& t, cudaStream_t stream);

}  // namespace comet::kernels::nvshmem
