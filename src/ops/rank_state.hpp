// What the engine keeps per local rank (moe_engine.cpp, moe_backward.cpp): its stream, plan, buffers,
// flags and the state of the last calls. Internal.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comet/common.hpp"
#include "comet/device_plan.hpp"
#include "kernels/layer_sync.hpp"
#include "ops/cublas_gemms.hpp"
#include "ops/launch_timer.hpp"
#include "tune/launch_planner.hpp"
#include "ops/moe_engine.hpp"

namespace comet {

struct MoeEngine::RankState {
  int rank = 0;
  bool computes = true;     // MoeOptions::compute_ranks: false, and it holds none of the buffers below
  size_t private_bytes = 0;  // allocated through MoeEngine::alloc
  cudaStream_t stream = nullptr;
  DevicePlan plan;
  kernels::LaunchTrace layer0_trace;  // MoeEngine::set_layer0_trace; off by default
  void* a = nullptr;             // [rows_cap][H]
  void* hid = nullptr;           // [rows_cap][F_s] the layer's own hidden rows
  void* hid_call = nullptr;      // the call's hidden rows (RankBatch::hidden), else hid
  void* y = nullptr;             // [rows_cap][H]
  void* self_partial = nullptr;  // [T_cap][H]
  kernels::LayerSync sync;           // the fused launches' flags (kernels/layer_sync.hpp)
  size_t sync_bytes = 0;             // their block (zeroed by MoeEngine::recover)
  int32_t* chosen_n_comm = nullptr;       // [kLaunchLayers] the adaptive split's pick of the last fused launch
  // MoeOptions::transport nvshmem: [W] device arrays holding, for every rank, this rank's own symmetric
  // address of x and of the receive buffer (NvshmemTransport adds the PE; peer pointers are not used).
  const void* const* own_x = nullptr;
  void* const* own_recv = nullptr;
  void* const* own_gate_recv = nullptr;  // training: the gate gradients' receive buffer, likewise
  int32_t* const* own_failed = nullptr;  // the failure words, likewise
  // Every rank's routing copied here before the plan is built ([W][RoutingBufferLayout bytes]), and the
  // device table [W] of its slots, which DevicePlan::build reads instead of the peers' buffers.
  void* routing_mirror = nullptr;
  const void* const* mirror_slots = nullptr;
  // Buffers registered with NVSHMEM for its NIC (NvshmemHeap::register_buffer; where it has a remote
  // transport): the local ends of gets. Unregistered before they are freed.
  std::vector<void*> registered;
  std::function<void(void*)> unregister;
  LaunchDecision last[kLaunchLayers];     // the planner's decision of the last launch per launch id
  // MoeOptions::check_schedule (tune/schedule_check.hpp): the check and its timed launches.
  std::unique_ptr<ScheduleCheck> schedule_check;
  LaunchTimer launch_timer;
  const void* w0 = nullptr;
  const void* w1 = nullptr;
  const float* w0_scales = nullptr;  // MoeOptions::dtype e4m3: W0's 128 x 128 block scales
  const void* x = nullptr;  // the staged batch's tokens (device)
  int tokens = 0;
  // Training (MoeOptions::training): what the backward reads besides A and hid.
  void* pre = nullptr;            // [rows_cap][N0_s] pre-activations (dPre after grad_layer1)
  void* grad_rows = nullptr;      // G [rows_cap][H] gathered output gradients
  float* gate_partials = nullptr; // [rows_cap][gate_blocks]
  int gate_partial_blocks = 1;    // columns of gate_partials the last backward of layer 1 wrote
  void* d_rows = nullptr;         // [rows_cap][F_s] D = G W1_e of the backward of layer 1 (Y when F_s <= H)
  void* gemm_workspace = nullptr;  // the standalone expert GEMM's (CUTLASS's grouped GEMM, on `stream`)
  size_t gemm_workspace_bytes = 0;
  void* wgrad_workspace = nullptr;  // two grouped weight-gradient launches' workspaces (dW1, dW0)
  size_t wgrad_workspace_bytes = 0;  // of each
  // cuBLAS's GEMMs (MoeOptions::cublas_backward, a table's StandaloneGemm::cublas pick): the plan's
  // per-expert rows on the host (read after each forward's plan build where a launch may want them),
  // cuBLAS's handles (loaded on first use; cublas_missing where that failed: our kernels run), whether
  // the backward runs its standalone GEMMs and weight gradients on cuBLAS, and the rows grad_steps runs
  // them with (empty: the device-shaped kernels, e.g. under graph capture).
  HostPlanCounts host_counts;
  std::unique_ptr<CublasExpertGemms> cublas;
  bool cublas_missing = false;
  bool cublas_backward = false;
  std::optional<ExpertRows> cublas_rows;
  // Loads cuBLAS's handles where they are not loaded and it can be; false where it cannot (cublas_missing,
  // remembered: our kernels run).
  bool load_cublas() {
    if (!cublas && !cublas_missing) {
      try {
        cublas = std::make_unique<CublasExpertGemms>();
      } catch (const InvalidArgument&) {
        cublas_missing = true;
      }
    }
    return cublas != nullptr;
  }
  bool saved = false;             // the last forward kept its activations and no backward used them yet
  const void* dout = nullptr;     // the backward's output gradients [tokens][H] (stage_grad)
  // The weight gradients run beside grad_layer0 on a low-priority stream: they take the SMs its
  // compute blocks leave while its comm blocks finish the combine.
  cudaStream_t side = nullptr;
  cudaEvent_t side_fork = nullptr, side_join = nullptr;
  cudaEvent_t joined = nullptr;  // forward_on: where this rank's stream has got to
  std::vector<void*> owned;
  std::function<void(void*)> release;

  ~RankState() {
    free_buffers();
    if (joined) cudaEventDestroy(joined);
    if (side_fork) cudaEventDestroy(side_fork);
    if (side_join) cudaEventDestroy(side_join);
    if (side) cudaStreamDestroy(side);
  }
  // Releases the private buffers and the plan (the destructor; MoeEngine::close). Idempotent.
  void free_buffers() {
    for (void* p : registered) unregister(p);
    registered.clear();
    for (void* p : owned) release(p);
    owned.clear();
    plan = DevicePlan();
    a = hid = hid_call = y = self_partial = pre = grad_rows = d_rows = wgrad_workspace = gemm_workspace = nullptr;
    gate_partials = nullptr;
    chosen_n_comm = nullptr;
    own_x = nullptr;
    own_recv = nullptr;
    own_gate_recv = nullptr;
    own_failed = nullptr;
    routing_mirror = nullptr;
    mirror_slots = nullptr;
    sync = kernels::LayerSync{};
    private_bytes = 0;
  }
};

}  // namespace comet
