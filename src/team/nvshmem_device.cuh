// NVSHMEM's device API as comet's kernels use it: fully inlined, whole-program, IBGDA off. Every
// translation unit whose kernels call NVSHMEM includes this (and nothing else of NVSHMEM's), so that
// the build options are the same everywhere.
//
// Why inlined and not relocatable device code (measured with ptxas, docs/nvshmem.md): compiled with
// -rdc, ptxas drops setmaxnreg and serialises every wgmma of the fused kernels, even without a call in
// them. Inlined, each translation unit that includes this gets its own copy of NVSHMEM's device state,
// which the host binds once per module and NVSHMEM initialisation (NvshmemHeap::bind_module, through
// the host library's nvshmemx_culibrary_init). No NVSHMEM device library is linked.
//
// IBGDA off, whatever the build machine has: its inlined device code keeps calls (ptxas C7510 on both
// fused kernels: "wgmma.mma_async instructions are serialized due to wgmma pipeline crossing function
// boundary at a function call", NVSHMEM 3.8.0 with rdma-core's mlx5dv.h installed), and NVSHMEM 3.4.5
// declares its device state for relocatable code only. Across nodes the puts, gets and signals then go
// through NVSHMEM's proxy (its default; NVSHMEM_IB_ENABLE_IBGDA must stay unset). The build options
// header is `#pragma once`: its later inclusions do not define them again.
#pragma once

#ifndef NVSHMEM_ENABLE_ALL_DEVICE_INLINING
#define NVSHMEM_ENABLE_ALL_DEVICE_INLINING
#endif
#include <non_abi/nvshmem_build_options.h>
#undef NVSHMEM_IBGDA_SUPPORT
#undef NVSHMEM_IBGDA_SUPPORT_GPUMEM_ONLY
#undef NVSHMEM_GPUNETIO_SUPPORT
#include <nvshmem.h>
#include <nvshmemx.h>
// The module globals that the host library's nvshmemx_culibrary_init looks up by name (its
// cumodule_init): the version first, then the device state, then, where the host library was built
// with IBGDA, the IBGDA state. In this non-RDC build NVSHMEM 3.4.5's headers give the state only
// (static __constant__, unmangled in the PTX), so that lookup failed on the H100 ("named symbol not
// found", docs/nvshmem.md); the other two are defined here the same way, once per translation unit.
// The IBGDA state stays zero (IBGDA is off, above) and is bytes of its size: its header needs
// rdma-core's mlx5dv.h, and NVSHMEM 3.4.5 asserts sizeof(nvshmemi_ibgda_device_state_v1) == 8384.
inline constexpr int kNvshmemIbgdaStateBytes = 8384;
extern "C" {
static __constant__ __attribute__((used)) nvshmemi_version_t nvshmemi_device_lib_version_d = {
    NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION};
alignas(16) static __constant__ __attribute__((used)) unsigned char nvshmemi_ibgda_device_state_d[kNvshmemIbgdaStateBytes];
}
