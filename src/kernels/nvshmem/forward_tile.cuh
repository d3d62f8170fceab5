// One tile width of the NVSHMEM transport's bf16 forward layers (forward_tiles.hpp): included by the
// translation unit of that width.
#pragma once

#include "kernels/fused_launch.cuh"
#include "kernels/nvshmem/forward_tiles.hpp"
#include "kernels/transport_nvshmem.cuh"
#include "team/nvshmem_heap.hpp"

namespace comet::kernels::nvshmem::tiles {

inline NvshmemTransport transport_of(const TransportArgs& t) {
  NvshmemTransport tr;
  tr.pe_base = t.pe_base;
  tr.staging = static_cast<__nv_bfloat16*>(t.staging);
  return tr;
}

template <int TileN>
ForwardTile make_forward_tile() {
  using Cfg = GemmConfig<kTileM, TileN>;
  ForwardTile f;
  f.tile_n = TileN;
  f.layer0_limits = [] { return layer0_limits_for<Cfg, ActivationStore, NvshmemTransport>(); };
  f.layer1_limits = [] { return layer1_limits_for<Cfg, NvshmemTransport>(); };
  f.layer0 = [](const Layer0Launch& l, const TransportArgs& t, cudaStream_t stream) {
    launch_layer0_for<Cfg>(l, stream, transport_of(t));
  };
  f.layer1 = [](const Layer1Launch& l, const TransportArgs& t, cudaStream_t stream) {
    COMET_REQUIRE(t.staging != nullptr || l.split.n_comm == 0,
                  "fused layer 1 over NVSHMEM: comm blocks need the put staging (staging_bytes)");
    launch_layer1_for<Cfg>(l, stream, transport_of(t));
  };
  f.bind = [] {
    team_detail::NvshmemHeap::bind_module(reinterpret_cast<const void*>(layer0_kernel<Cfg, ActivationStore, NvshmemTransport>));
  };
  return f;
}

}  // namespace comet::kernels::nvshmem::tiles
