// NvshmemTransport (transport.cuh has the policy's contract): the comm roles' remote accesses as
// NVSHMEM device calls, for peers no pointer reaches.
//
// How it is built: team/nvshmem_device.cuh (NVSHMEM's device API inlined, whole-program, IBGDA off;
// that header says why).
//
// Layer 0: the issuer warp gets a unit's row from its owner's symmetric x straight into the unit's
//   first row of the gathered buffer (nvshmemx_getmem_nbi_warp); one quiet per publish slot (up to 8
//   units) completes them. Across nodes the gathered buffer must be symmetric or registered
//   (nvshmemx_buffer_register): the NIC writes it.
// Layer 1: a slice is summed in registers, so it has no address a put could read: each comm warp
//   stages its slices in a ring of kStagingSlices slices of 512 bytes (symmetric or registered memory,
//   `staging`), puts each one to the owner's receive buffer (nvshmemx_putmem_nbi_warp) and quiets
//   once per lap of the ring before it overwrites a slice. A slice for this rank's own tokens is a
//   plain store.
// The order of the sums, and so the bits of every output, is the role's, not the transport's.
#pragma once

#include <cuda_bf16.h>

#include "team/nvshmem_device.cuh"

#include <cstdint>

namespace comet::kernels {

struct NvshmemTransport {
  static constexpr bool kWarpPulls = true;
  static constexpr bool kShipsByRank = true;
  static constexpr int kStagingSlices = 8;  // per comm warp
  static constexpr int kSliceColumns = 256;

  int pe_base = 0;                    // the PE of team rank 0: rank r is PE pe_base + r
  __nv_bfloat16* staging = nullptr;   // [comm warps][kStagingSlices][kSliceColumns]
  // Per warp, set by begin_combine.
  __nv_bfloat16* ring = nullptr;
  int ring_next = 0;

  static size_t staging_bytes(int comm_warps) {
    return size_t(comm_warps) * kStagingSlices * kSliceColumns * sizeof(__nv_bfloat16);
  }

  __device__ void get_row(void* dst, const void* src, uint32_t bytes, int rank) {
    nvshmemx_getmem_nbi_warp(dst, src, bytes, pe_base + rank);
  }
  __device__ void complete_gets() { quiet_warp(); }

  __device__ void begin_combine(int warp) {
    ring = staging + size_t(warp) * kStagingSlices * kSliceColumns;
    ring_next = 0;
  }
  __device__ void ship(__nv_bfloat16* dst, int rank, bool local, const uint4& v, int cols) {
    const int lane = threadIdx.x % 32;
    if (local) {
      if (lane * 8 < cols) *reinterpret_cast<uint4*>(dst + lane * 8) = v;
      return;
    }
    if (ring_next == kStagingSlices) {  // a lap: the puts that read the ring's slices have completed
      quiet_warp();
      ring_next = 0;
    }
    __nv_bfloat16* slice = ring + ring_next * kSliceColumns;
    if (lane * 8 < cols) *reinterpret_cast<uint4*>(slice + lane * 8) = v;
    __syncwarp();  // the whole slice is written before any lane's part of the put reads it
    nvshmemx_putmem_nbi_warp(dst, slice, size_t(cols) * sizeof(__nv_bfloat16), pe_base + rank);
    ++ring_next;
  }
  __device__ void end_combine() { quiet_warp(); }

  // The backward's gate gradients and a failed call's words: one value a thread.
  __device__ void put_float(float* dst, float v, int rank) { nvshmem_float_p(dst, v, pe_base + rank); }
  __device__ void put_int(int32_t* dst, int32_t v, int rank) { nvshmem_int32_p(dst, v, pe_base + rank); }
  __device__ void complete_puts() { nvshmem_quiet(); }

 private:
  // One lane quiets for the warp (nvshmem_quiet covers the calling PE's operations); the fence then
  // makes what landed visible GPU-wide before the role publishes it.
  __device__ static void quiet_warp() {
    __syncwarp();
    if (threadIdx.x % 32 == 0) nvshmem_quiet();
    __syncwarp();
    __threadfence();
  }
};

}  // namespace comet::kernels
