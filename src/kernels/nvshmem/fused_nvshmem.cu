// The fused layers over NVSHMEM (fused_nvshmem.hpp): fused_launch.cuh's launchers (forward and
// backward) and the gate-gradient ship with NvshmemTransport, one tile width, and the binding of this
// module's NVSHMEM device state.
#include "kernels/nvshmem/fused_nvshmem.hpp"

#include "kernels/fused_launch.cuh"
#include "kernels/gate_grad_ship.cuh"
#include "kernels/transport_nvshmem.cuh"

namespace comet::kernels::nvshmem {
namespace {

using Cfg = GemmConfig<kTileM, kTileN>;

NvshmemTransport transport_of(const TransportArgs& t) {
  NvshmemTransport tr;
  tr.pe_base = t.pe_base;
  tr.staging = static_cast<__nv_bfloat16*>(t.staging);
  return tr;
}

}  // namespace

void bind_device_state(const void* kernel, CulibraryInit init) {
  COMET_REQUIRE(kernel != nullptr && init != nullptr, "NVSHMEM: bind_device_state needs a kernel and nvshmemx_culibrary_init");
  cudaKernel_t handle = nullptr;
  COMET_CUDA_CHECK(cudaGetKernel(&handle, kernel));
  // The driver call through the runtime's entry point: comet links no libcuda (binaries load where no
  // driver is installed).
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  COMET_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuKernelGetLibrary", &fn, 12050, cudaEnableDefault, &found));
  COMET_REQUIRE(fn != nullptr && found == cudaDriverEntryPointSuccess,
                "NVSHMEM: the driver has no cuKernelGetLibrary (needs CUDA 12.5 or later)");
  CUlibrary library = nullptr;
  const CUresult got = reinterpret_cast<CUresult (*)(CUlibrary*, CUkernel)>(fn)(&library, reinterpret_cast<CUkernel>(handle));
  COMET_REQUIRE(got == CUDA_SUCCESS, "NVSHMEM: cuKernelGetLibrary failed (CUresult ", int(got), ")");
  const int rc = init(library);
  COMET_REQUIRE(rc == 0, "NVSHMEM: nvshmemx_culibrary_init failed (", rc, "); is NVSHMEM initialised?");
}

void bind_fused_kernels(CulibraryInit init) {
  bind_device_state(reinterpret_cast<const void*>(layer0_kernel<Cfg, ActivationStore, NvshmemTransport>), init);
}

size_t staging_bytes(int comm_blocks) { return NvshmemTransport::staging_bytes(comm_blocks * (Cfg::kThreads / 32)); }

LaunchLimits layer0_limits() { return layer0_limits_for<Cfg, ActivationStore, NvshmemTransport>(); }
LaunchLimits layer1_limits() { return layer1_limits_for<Cfg, NvshmemTransport>(); }

void launch_layer0(const Layer0Launch& l, const TransportArgs& t, cudaStream_t stream) {
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

}  // namespace comet::kernels::nvshmem
