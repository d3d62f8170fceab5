// How the comm roles reach another rank's memory: a transport policy, so that each role (the layer-0
// pull in dispatch_role.cuh, the layer-1 ship in combine_role.cuh) is written once and the transport is
// a template argument. Two policies exist:
//   PeerTransport     (here)                  a peer's buffer is an address this GPU can load from and
//                                             store to: a CUDA IPC mapping, NVSHMEM's nvshmem_ptr, or
//                                             mapped host memory (link=host). The default everywhere.
//   NvshmemTransport  (transport_nvshmem.cuh)  NVSHMEM device calls (get / put to a PE), for peers that
//                                             no pointer reaches (another node); NVSHMEM's device API
//                                             inlined, whole-program (that header says why).
// What a policy provides:
//   kWarpPulls        false: layer 0's issuer is one thread that moves a row with a bulk copy through
//                     shared memory (issue_pulls); true: the issuer is a whole warp that calls get_row
//                     straight into the gathered buffer and complete_gets per publish slot (issue_gets).
//   get_row(dst, src, bytes, rank)  (kWarpPulls only) start a warp's copy of a row of rank `rank`.
//   complete_gets()   (kWarpPulls only) every get this warp started has landed and is visible on the GPU.
//   kShipsByRank      ship needs the destination's rank (else the role does not fetch it per item: the
//                     combine is instruction-bound, and the peer pointer already names the rank).
//   begin_combine(warp)  a comm warp starts layer 1's combine (`warp`: its index among all comm warps).
//   ship(dst, rank, local, v, cols)  the warp's partial slice of `cols` columns (lane l holds columns
//                     [8l, 8l + 8)) goes to `dst` in rank `rank`'s receive buffer (`local`: dst is this
//                     rank's own memory).
//   end_combine()     every slice this warp shipped has landed.
//   put_float(dst, v, rank), put_int(dst, v, rank), complete_puts()  one fp32 / int32 into rank
//                     `rank`'s buffer at dst, by one thread (the backward's gate gradients,
//                     gate_grad_ship.cuh; a failed call's words, peer_failure.cuh); complete_puts: this
//                     thread's have landed.
// Buffer addresses in the role arguments (DispatchArgs::peer_x, CombineArgs::peer_recv) are what the
// policy needs: the peer's mapped address for PeerTransport, this rank's own symmetric address (the
// same offset in every PE's heap) for NvshmemTransport.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace comet::kernels {

struct PeerTransport {
  static constexpr bool kWarpPulls = false;  // issue_pulls: no get_row / complete_gets
  static constexpr bool kShipsByRank = false;

  __device__ void begin_combine(int) {}
  __device__ void ship(__nv_bfloat16* dst, int, bool, const uint4& v, int cols) {
    const int lane = threadIdx.x % 32;
    if (lane * 8 < cols) *reinterpret_cast<uint4*>(dst + lane * 8) = v;  // one 16-byte store a lane
  }
  __device__ void end_combine() {}
  __device__ void put_float(float* dst, float v, int) { *dst = v; }
  __device__ void put_int(int32_t* dst, int32_t v, int) { *reinterpret_cast<volatile int32_t*>(dst) = v; }
  __device__ void complete_puts() {}
};

}  // namespace comet::kernels
