// A quick look at one rank's fused kernels on a real model shape (developer tool; the benchmark
// proper is bench/). W = 8 virtual ranks; rank 0's layer 0 and layer 1 are timed in their three
// modes. Usage: comet_layer_probe [model] [tokens] [ep] [tp] [link] [n_comm...]
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comet/fused_moe.hpp"
#include "ops/moe_engine.hpp"
#include "comet/plan.hpp"
#include "harness/device_buffer.hpp"
#include "harness/device_random.hpp"
#include "harness/routing_gen.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

MoeShape model(const std::string& name) {
  if (name == "qwen2") return {2048, 1408, 64, 4, Activation::swiglu};
  if (name == "deepseek") return {7168, 2048, 256, 8, Activation::swiglu};
  return {4096, 14336, 8, 2, Activation::swiglu};  // mixtral
}

template <class F>
double median_ms(cudaStream_t s, int reps, F&& setup, F&& body) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < reps + 2; ++i) {
    setup();
    cudaEventRecord(a, s);
    body();
    cudaEventRecord(b, s);
    COMET_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 2) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "mixtral";
  const int tokens = argc > 2 ? std::atoi(argv[2]) : 4096;
  const Parallel par{argc > 3 ? std::atoi(argv[3]) : 8, argc > 4 ? std::atoi(argv[4]) : 1};
  const Link link = parse_link(argc > 5 ? argv[5] : "host");
  std::vector<int> sweep;
  for (int i = 6; i < argc; ++i) sweep.push_back(std::atoi(argv[i]));
  if (sweep.empty()) sweep = {1, 2, 4, 8, 16};
  const MoeShape shape = model(name);
  const int W = par.world(), H = shape.hidden, Fs = par.ffn_shard(shape), El = par.local_experts(shape);

  const auto routing = make_routing(shape, par, std::vector<int>(W, tokens), RoutingKind::uniform, 7);
  int rows = 0;
  for (int r = 0; r < W; ++r) {
    PlanConfig cfg{shape, par, r, 128, PlanCapacity{tokens, 1 << 30}};
    cfg.cap.max_rows = (W * tokens * std::min(shape.topk, El) + El * 127) / 128 * 128;
    const HostPlan p = build_plan_host(cfg, views(routing));
    rows = std::max(rows, p.view().expert_offset[El]);
  }
  LocalTeam team(W, link);
  FusedMoe layer(team, shape, par, MoeCapacity{tokens, rows});
  MoeEngine& moe = layer.engine();
  std::vector<DeviceBuffer> keep;
  std::vector<RankBatch> batches;
  for (int r = 0; r < W; ++r) {
    keep.emplace_back(size_t(tokens) * H * 2);
    fill_random_bf16(keep.back().get(), size_t(tokens) * H, 1.0f, 100 + r);
    void* x = keep.back().get();
    keep.emplace_back(routing[r].ids);
    void* ids = keep.back().get();
    keep.emplace_back(routing[r].gates);
    void* gates = keep.back().get();
    keep.emplace_back(size_t(tokens) * H * 2);
    void* out = keep.back().get();
    const size_t n0 = size_t(El) * 2 * Fs * H, n1 = size_t(El) * H * Fs;
    keep.emplace_back(n0 * 2);
    fill_random_bf16(keep.back().get(), n0, 1.5f / std::sqrt(float(H)), 200 + r);
    void* w0 = keep.back().get();
    keep.emplace_back(n1 * 2);
    fill_random_bf16(keep.back().get(), n1, 1.5f / std::sqrt(float(shape.ffn)), 300 + r);
    moe.set_weights(r, w0, keep.back().get());
    batches.push_back(RankBatch{tokens, x, static_cast<int32_t*>(ids), static_cast<float*>(gates), out});
  }
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  moe.forward(batches);
  moe.sync_and_check();

  const HostPlan p0 = moe.plan(0).to_host(team.stream(0));
  const int real_rows = [&] { int s = 0; for (int e = 0; e < El; ++e) s += p0.view().expert_rows[e]; return s; }();
  const int remote_units = *p0.view().num_units - *p0.view().num_local_units;
  const double f0 = 2.0 * real_rows * 2 * Fs * H, f1 = 2.0 * real_rows * H * Fs;
  std::printf("%s ep%d tp%d link=%s tokens/rank=%d: rank 0 rows %d (padded %d), remote units %d (%.1f MB over the link)\n",
              name.c_str(), par.ep, par.tp, to_string(link), tokens, real_rows, p0.view().expert_offset[El],
              remote_units, remote_units * H * 2 / 1e6);
  cudaStream_t s = team.stream(0);
  auto prep = [&] { moe.prepare(0); };
  auto none = [] {};
  LayerRequest base = LayerRequest::forced(256, 2);
  if (const char* m = std::getenv("COMET_M_GROUP"); m && std::atoi(m) > 0) base.m_group = std::atoi(m);
  base.n_group = std::getenv("COMET_N_GROUP") ? std::atoi(std::getenv("COMET_N_GROUP")) : 1;
  if (const char* lag = std::getenv("COMET_STORE_LAG")) moe.set_dispatch_store_lag(std::atoi(lag));
  cudaDeviceProp prop{};
  COMET_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: %d SMs, L2 %zu bytes; m_group %d (0: automatic), store lag %d\n", prop.name,
              prop.multiProcessorCount, size_t(prop.l2CacheSize), base.m_group.value_or(0),
              moe.options().dispatch_store_lag);
  {  // The forward's steps around the layers: the plan build + local rows, and the final reduce.
    std::function<void()> nothing = [] {};
    std::function<void()> prepare = [&] { moe.prepare(0); };
    std::function<void()> finish = [&] { moe.finish(0, batches[0]); };
    std::printf("prepare (plan build, local rows) %.3f ms  finish (final reduce) %.3f ms\n",
                median_ms(s, 10, nothing, prepare), median_ms(s, 10, nothing, finish));
  }
  if (std::getenv("COMET_PROBE_PROFILE")) {
    // One comm-only launch of each layer at the first n_comm, between cudaProfilerStart and Stop
    // (for `ncu --profile-from-start off`).
    LayerRequest v = base;
    v.n_comm = sweep[0];
    moe.prepare(0);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    COMET_CUDA_CHECK(cudaProfilerStart());
    moe.layer0(0, LayerMode::comm_only, v);
    moe.advance_epoch(0);
    moe.layer1(0, LayerMode::comm_only, v);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    COMET_CUDA_CHECK(cudaProfilerStop());
    moe.sync_and_check();
    return 0;
  }
  for (int layer = 0; layer < 2; ++layer) {
    auto run = [&](LayerMode m, int n_comm) {
      LayerRequest v = base;
      v.n_comm = n_comm;
      if (layer == 0) moe.layer0(0, m, v); else moe.layer1(0, m, v);
    };
    const double flops = layer == 0 ? f0 : f1;
    std::function<void()> setup = layer == 0 ? std::function<void()>(prep) : std::function<void()>([&] { moe.advance_epoch(0); });
    std::function<void()> g = [&] { run(LayerMode::gemm_only, 0); };
    const double t_gemm = median_ms(s, 10, setup, g);
    std::printf("layer %d  gemm_only %.3f ms  %.0f TFLOP/s\n", layer, t_gemm, flops / t_gemm * 1e-9);
    for (int n : sweep) {
      std::function<void()> c = [&] { run(LayerMode::comm_only, n); };
      std::function<void()> f = [&] { run(LayerMode::fused, n); };
      const double t_comm = median_ms(s, 10, setup, c);
      const double t_fused = median_ms(s, 10, setup, f);
      // Bytes a comm block moves: layer 0 pulls the remote units' rows; layer 1 reads every expert row
      // of this rank (its output slices) once.
      const double bytes = layer == 0 ? double(remote_units) * H * 2 : double(real_rows) * H * 2;
      std::printf("layer %d  n_comm %2d  comm_only %.3f ms (%.1f GB/s per block)  fused %.3f ms  seq %.3f  eff %.3f\n",
                  layer, n, t_comm, n > 0 ? bytes / (t_comm * 1e6) / n : 0.0, t_fused, t_comm + t_gemm,
                  t_fused / std::max(t_comm, t_gemm));
    }
  }
  moe.sync_and_check();
  (void)none;
  return 0;
}
