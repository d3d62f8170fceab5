// DevicePlan: owns the plan's device arrays and the builder's scratch, and enqueues the build kernels
// (count -> scan -> scatter -> pull order -> tile order, see their headers) with no host
// synchronisation and no host knowledge of the counts: every grid is sized by capacity, so build() can
// be captured in a CUDA graph. Builds of one DevicePlan must be ordered (one stream, or events between streams).
#include <cstdlib>
#include <string_view>
#include <utility>

#include "comet/cuda_check.hpp"
#include "comet/device_plan.hpp"
#include "plan/device_build_layout.cuh"
#include "plan/plan_count_kernel.cuh"
#include "plan/plan_order_kernel.cuh"
#include "plan/plan_pull_kernel.cuh"
#include "plan/plan_scan_kernel.cuh"
#include "plan/plan_scatter_kernel.cuh"

namespace comet {

namespace {

using namespace plan_dev;

// COMET_CHECK=1: every build synchronises and checks at once (tests, debugging; not under capture).
bool checking_mode() {
  const char* value = std::getenv("COMET_CHECK");
  return value != nullptr && std::string_view(value) == "1";
}

int fill_blocks(const BuildGeometry& g) {
  const int64_t items = int64_t(g.max_units) * (1 + g.topk) + g.max_rows + g.max_tiles;
  const int64_t per_block = int64_t(kChunk) * kFillItemsPerThread;
  const int64_t blocks = (items + per_block - 1) / per_block;
  return int(blocks < 1 ? 1 : blocks > 4096 ? 4096 : blocks);
}

}  // namespace

size_t plan_scratch_bytes(const PlanConfig& cfg) { return carve_scratch(make_geometry(cfg), nullptr, nullptr); }

DevicePlan::DevicePlan(const PlanConfig& cfg) : cfg_(cfg) {
  validate(cfg_);
  try {
    const size_t bytes = plan_bytes(cfg_);
    COMET_CUDA_CHECK(cudaMalloc(&storage_, bytes));
    // The gaps between arrays are never written again: zero them once so whole-block copies compare.
    COMET_CUDA_CHECK(cudaMemset(storage_, 0, bytes));
    scratch_bytes_ = plan_scratch_bytes(cfg_);
    COMET_CUDA_CHECK(cudaMalloc(&scratch_, scratch_bytes_));
    // error_key sits at offset 0 and must read kNoError before the first build (the scan kernel
    // restores it after each build).
    COMET_CUDA_CHECK(cudaMemset(scratch_, 0xFF, sizeof(unsigned long long)));
    // Fixed (not per-plan) limits, so that plans of different sizes never lower each other's.
    COMET_CUDA_CHECK(cudaFuncSetAttribute(plan_count_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(kChunk * kMaxTopK * 4 + 2 * kChunkWarps * kMaxLocalExperts * 4)));
    COMET_CUDA_CHECK(cudaFuncSetAttribute(plan_order_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(kOrderSmemKeysMax)));
    // The memsets ran on the legacy stream, which a build on a non-blocking stream does not wait for:
    // without this, a first build could read error_key before it is kNoError (or have its status
    // zeroed under it). Seen once on the H200 with other processes on the GPU (PlanDevice test).
    COMET_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  } catch (...) {
    release();
    throw;
  }
  view_ = carve_plan(cfg_, storage_);
}

DevicePlan::~DevicePlan() { release(); }

DevicePlan::DevicePlan(DevicePlan&& other) noexcept
    : cfg_(other.cfg_),
      storage_(std::exchange(other.storage_, nullptr)),
      scratch_(std::exchange(other.scratch_, nullptr)),
      scratch_bytes_(std::exchange(other.scratch_bytes_, 0)),
      view_(std::exchange(other.view_, PlanView{})) {}

DevicePlan& DevicePlan::operator=(DevicePlan&& other) noexcept {
  if (this != &other) {
    release();
    cfg_ = other.cfg_;
    storage_ = std::exchange(other.storage_, nullptr);
    scratch_ = std::exchange(other.scratch_, nullptr);
    scratch_bytes_ = std::exchange(other.scratch_bytes_, 0);
    view_ = std::exchange(other.view_, PlanView{});
  }
  return *this;
}

void DevicePlan::release() noexcept {
  if (storage_) cudaFree(storage_);
  if (scratch_) cudaFree(scratch_);
  storage_ = scratch_ = nullptr;
  scratch_bytes_ = 0;
  view_ = PlanView{};
}

void DevicePlan::build(const void* const* peer_routing, cudaStream_t stream) {
  COMET_REQUIRE(storage_ != nullptr, "DevicePlan::build: the plan holds no storage (default-constructed or moved from)");
  COMET_REQUIRE(peer_routing != nullptr, "DevicePlan::build: peer_routing is null");
  const BuildGeometry g = make_geometry(cfg_);
  BuildScratch sc;
  carve_scratch(g, static_cast<char*>(scratch_), &sc);
  const int chunk_blocks = g.world * g.chunks;

  plan_count_kernel<<<chunk_blocks, kChunk, count_kernel_smem(g), stream>>>(peer_routing, g, sc);
  COMET_CUDA_CHECK_LAUNCH();
  plan_scan_kernel<<<1, kScanThreads, 0, stream>>>(peer_routing, g, sc, view_);
  COMET_CUDA_CHECK_LAUNCH();
  plan_scatter_kernel<<<chunk_blocks + fill_blocks(g), kChunk, 0, stream>>>(g, sc, view_, chunk_blocks);
  COMET_CUDA_CHECK_LAUNCH();
  if (g.pull_order == PullOrder::expert) {
    plan_pull_count_kernel<<<pull_tile_blocks(g), kPullWarps * 32, 0, stream>>>(g, view_, sc);
    COMET_CUDA_CHECK_LAUNCH();
    plan_pull_scan_kernel<<<1, kPullScanThreads, 0, stream>>>(view_, sc);
    COMET_CUDA_CHECK_LAUNCH();
  }
  plan_pull_place_kernel<<<pull_tile_blocks(g), kPullWarps * 32, 0, stream>>>(g, view_, sc);
  COMET_CUDA_CHECK_LAUNCH();
  launch_order(stream);

  if (checking_mode()) check(stream);
}

void DevicePlan::launch_order(cudaStream_t stream) {
  const BuildGeometry g = make_geometry(cfg_);
  const size_t order_smem = order_kernel_smem(g);
  const int order_blocks = (g.max_tiles + kOrderTilesPerBlock - 1) / kOrderTilesPerBlock;
  plan_order_kernel<<<order_blocks, kOrderWarps * 32, order_smem, stream>>>(g, view_, order_smem > 0);
  COMET_CUDA_CHECK_LAUNCH();
}

void DevicePlan::reorder(const WaveChunkRule& rule, cudaStream_t stream) {
  COMET_REQUIRE(storage_ != nullptr, "DevicePlan::reorder: the plan holds no storage");
  set_wave_chunk_rule(rule);
  launch_order(stream);
}

void DevicePlan::set_wave_chunk_rule(const WaveChunkRule& rule) {
  validate(rule);
  cfg_.chunk_rule = rule;
}

void DevicePlan::check(cudaStream_t stream) const {
  COMET_REQUIRE(storage_ != nullptr, "DevicePlan::check: the plan holds no storage");
  int32_t status[kPlanStatusWords] = {};
  COMET_CUDA_CHECK(cudaMemcpyAsync(status, view_.first_error, sizeof(status), cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (status[0] == 0) return;
  // Read: cleared, so that the next error is reported (on the stream, after every build enqueued so far).
  COMET_CUDA_CHECK(cudaMemsetAsync(view_.first_error, 0, sizeof(status), stream));
  throw DeviceReportedError(describe_plan_error(status, cfg_.shape.num_experts));
}

HostPlan DevicePlan::to_host(cudaStream_t stream) const {
  COMET_REQUIRE(storage_ != nullptr, "DevicePlan::to_host: the plan holds no storage");
  HostPlan host(cfg_);
  // carve_plan puts the status word at offset 0: it is the base of the host block.
  COMET_CUDA_CHECK(cudaMemcpyAsync(host.view().status, storage_, plan_bytes(cfg_), cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace comet
