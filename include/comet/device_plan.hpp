// The routing plan built on the GPU, with no host synchronisation, so that the whole MoE layer can be
// captured in a CUDA graph. It produces bitwise the plan that build_plan_host() does.
#pragma once

#include <cuda_runtime.h>

#include "comet/plan.hpp"

namespace comet {

// Bytes of the device builder's scratch for this configuration (besides plan_bytes' arrays).
size_t plan_scratch_bytes(const PlanConfig& cfg);

class DevicePlan {
 public:
  DevicePlan() = default;
  // Allocates the plan arrays and scratch for this configuration on the current device.
  explicit DevicePlan(const PlanConfig& cfg);
  ~DevicePlan();
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;
  DevicePlan(DevicePlan&&) noexcept;
  DevicePlan& operator=(DevicePlan&&) noexcept;

  const PlanConfig& config() const { return cfg_; }
  const PlanView& view() const { return view_; }  // device pointers
  size_t device_bytes() const { return storage_ ? plan_bytes(cfg_) + scratch_bytes_ : 0; }  // what it allocated

  // Enqueues the build on `stream`. `peer_routing` is a device array of W pointers, entry s pointing
  // at rank s's routing buffer (layout RoutingBufferLayout{cap.max_tokens_per_rank, k}), readable
  // from this GPU (peer memory, host-mapped memory or local memory). Bad routing never causes an
  // out-of-bounds access: the first error goes to the status word, and the plan is left empty
  // (num_units = num_tiles = 0) so that kernels that follow do nothing.
  void build(const void* const* peer_routing, cudaStream_t stream);

  // The chunk rule the next builds order their tiles with (PlanConfig::chunk_rule; checked by validate).
  void set_wave_chunk_rule(const WaveChunkRule& rule);
  // Sets the rule and re-runs only the build's last kernel (tile_order) on `stream`, after a build.
  void reorder(const WaveChunkRule& rule, cudaStream_t stream);

  // Copies the first error recorded since the last check to the host (synchronising `stream`); if
  // there is one, clears it and throws DeviceReportedError with describe_plan_error()'s message.
  // An error stays recorded through later good builds until a check reads it.
  void check(cudaStream_t stream) const;

  // Copies the whole plan to host memory (synchronises `stream`), for tests and debugging.
  HostPlan to_host(cudaStream_t stream) const;

 private:
  void release() noexcept;
  void launch_order(cudaStream_t stream);  // the build's kernel 4 (tile_order) with cfg_
  PlanConfig cfg_{};
  void* storage_ = nullptr;  // plan arrays (carve_plan)
  void* scratch_ = nullptr;  // builder scratch
  size_t scratch_bytes_ = 0;
  PlanView view_{};
};

}  // namespace comet
