// comet-probe-grouped-gemm: CUTLASS's grouped GEMMs (the standalone expert GEMM, kernels/expert_gemm_grouped.cuh,
// and the weight gradients', kernels/weight_grad_grouped.cu) in each schedule and tile order against cuBLAS,
// on the expert GEMMs of the benchmark's models. Why a probe of its own: the tile order (GroupRaster) is a
// launch detail, not a tuner pick, so comet-bench never times it apart; this measures which order a shape
// wants, and checks on the way that both orders give the same bits.
//
// Beside the library's schedules it times tiles the library does not compile (probe_tiles.hpp), along N.
//
// Per case (model, layout, tokens per rank; rank 0's experts under uniform top-k routing of W ranks' tokens):
//   l1: Y = h W1_e^T    (K = F / tp, N = H; W1_e [H][F_s])    the forward's layer 1
//   l2: D = G W1_e      (K = H, N = F / tp; W1_e [H][F_s])    the backward's launch 2
//   l3: dA = dPre W0_e  (K = N0 / tp, N = H; W0_e [N0_s][H])  the backward's launch 3
//   w1: dW1_e = G_e^T (g h)_e   (M = H, N = F / tp, K = the expert's rows)   weight gradients, bf16 out
//   w0: dW0_e = dPre_e^T A_e    (M = N0 / tp, N = H, K = the expert's rows)
// Every variant and cuBLAS (grouped and per-expert loop, the faster kept; for w1 / w0 cuBLAS's loop and
// our persistent kernel) run in rotation; medians in ms.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "baselines/expert_gemm.hpp"
#include "comet/cuda_check.hpp"
#include "event_timer.hpp"
#include "harness/device_buffer.hpp"
#include "harness/device_random.hpp"
#include "harness/routing_gen.hpp"
#include "kernels/fused_layers.hpp"
#include "models.hpp"
#include "probe_tiles.hpp"

namespace comet::bench {
namespace {

using testing::DeviceBuffer;

constexpr int kTileM = 128;  // the plan's row segments start on a whole M-tile, as here

struct ProbeOptions {
  std::vector<std::string> models{"mixtral", "qwen2", "phi35", "qwen57", "deepseek"};
  std::vector<std::string> layouts{"ep8", "tp8"};
  std::vector<int> tokens{1024, 4096, 16384};
  std::vector<std::string> launches{"l1", "l2", "l3", "w1", "w0"};
  int reps = 8, warmup = 2;
  double mem_limit_gib = 60;
  std::string out = "grouped_gemm_probe.json";
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  COMET_REQUIRE(!out.empty(), "empty list '", s, "'");
  return out;
}

ProbeOptions parse(int argc, char** argv) {
  ProbeOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    COMET_REQUIRE(i + 1 < argc, a, " needs a value (flags: --models --layouts --tokens --launches --reps --mem-limit-gib --out)");
    const std::string v = argv[++i];
    if (a == "--models") o.models = split_list(v);
    else if (a == "--layouts") o.layouts = split_list(v);
    else if (a == "--tokens") {
      o.tokens.clear();
      for (const auto& t : split_list(v)) o.tokens.push_back(std::stoi(t));
    } else if (a == "--launches") o.launches = split_list(v);
    else if (a == "--reps") o.reps = std::stoi(v);
    else if (a == "--mem-limit-gib") o.mem_limit_gib = std::stod(v);
    else if (a == "--out") o.out = v;
    else throw InvalidArgument(detail::concat("unknown flag ", a));
  }
  return o;
}

// Rank 0's rows per local expert under the harness's uniform routing of W ranks' tokens (as comet-bench's).
std::vector<int> rows_per_expert(const MoeShape& s, const Parallel& par, int tokens, uint64_t seed) {
  const int first = par.first_local_expert(s, 0), local = par.local_experts(s);
  std::vector<int> rows(local, 0);
  const std::vector<int> tokens_per_rank(par.world(), tokens);
  for (const testing::RankRouting& r : testing::make_routing(s, par, tokens_per_rank, testing::RoutingKind::uniform, seed))
    for (int32_t e : r.ids)
      if (e >= first && e < first + local) ++rows[e - first];
  return rows;
}

__global__ void count_differing_words(const uint4* a, const uint4* b, size_t n, unsigned long long* out) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 x = a[i], y = b[i];
    mine += (x.x != y.x) + (x.y != y.y) + (x.z != y.z) + (x.w != y.w);
  }
  atomicAdd(out, mine);
}

unsigned long long differing_words(const DeviceBuffer& a, const DeviceBuffer& b, cudaStream_t stream) {
  DeviceBuffer count(sizeof(unsigned long long));
  COMET_CUDA_CHECK(cudaMemsetAsync(count.get(), 0, count.bytes(), stream));
  count_differing_words<<<1024, 256, 0, stream>>>(a.as<uint4>(), b.as<uint4>(), a.bytes() / 16,
                                                  count.as<unsigned long long>());
  COMET_CUDA_CHECK(cudaGetLastError());
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  return count.download<unsigned long long>(1)[0];
}

// Ends a case's line where its buffers would exceed --mem-limit-gib (false), else flushes it.
bool fits(double gib, const ProbeOptions& o) {
  if (gib > o.mem_limit_gib) {
    std::printf("  skipped: over --mem-limit-gib\n");
    return false;
  }
  std::fflush(stdout);
  return true;
}

// A case's stream, synchronised and destroyed when the case ends.
struct ProbeStream {
  cudaStream_t stream = nullptr;
  ProbeStream() { COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~ProbeStream() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  ProbeStream(const ProbeStream&) = delete;
  ProbeStream& operator=(const ProbeStream&) = delete;
};

// One GEMM kernel (StandaloneGemm or WeightGradKernel) in one tile order, by the name the records give it.
template <class Kernel>
struct Ordered {
  Kernel kernel;
  kernels::GroupRaster raster;
  const char* name;
};
using Variant = Ordered<StandaloneGemm>;
using WgradVariant = Ordered<WeightGradKernel>;

const Variant kVariants[] = {
    {StandaloneGemm::grouped, kernels::GroupRaster::along_m, "pingpong128_m"},
    {StandaloneGemm::grouped, kernels::GroupRaster::along_n, "pingpong128_n"},
    {StandaloneGemm::grouped_cooperative, kernels::GroupRaster::along_m, "coop256_m"},
    {StandaloneGemm::grouped_cooperative, kernels::GroupRaster::along_n, "coop256_n"},
    {StandaloneGemm::grouped_160, kernels::GroupRaster::along_m, "coop160_m"},
    {StandaloneGemm::grouped_160, kernels::GroupRaster::along_n, "coop160_n"},
};

const WgradVariant kWgradVariants[] = {
    {WeightGradKernel::grouped, kernels::GroupRaster::along_m, "pingpong128_m"},
    {WeightGradKernel::grouped, kernels::GroupRaster::along_n, "pingpong128_n"},
    {WeightGradKernel::grouped_cooperative, kernels::GroupRaster::along_m, "coop256_m"},
    {WeightGradKernel::grouped_cooperative, kernels::GroupRaster::along_n, "coop256_n"},
};

// The prefix of a record: the case and the GEMM's shape.
std::string record_head(const Model& model, const Layout& layout, int tokens, const std::string& launch, int experts,
                        long rows, int m, int n, int k) {
  std::ostringstream r;
  r << "{\"model\": \"" << model.name << "\", \"layout\": \"" << layout.name << "\", \"tokens_per_rank\": " << tokens
    << ", \"launch\": \"" << launch << "\", \"experts\": " << experts << ", \"rows\": " << rows << ", \"m\": " << m
    << ", \"n\": " << n << ", \"k\": " << k;
  return r.str();
}

// Prints and records one launch's timings (the last `cublas_calls` are cuBLAS's; the best of them is the bar).
void report(const std::string& head, const std::vector<std::string>& names, const std::vector<Timing>& t, int cublas_calls,
            double flops, unsigned long long differing, std::vector<std::string>& json) {
  double cublas = t[t.size() - 1].median_ms;
  for (int i = 1; i < cublas_calls; ++i) cublas = std::min(cublas, t[t.size() - 1 - i].median_ms);
  std::printf("  cublas %.3f ms (%.0f TFLOP/s)", cublas, flops / cublas * 1e-9);
  for (size_t i = 0; i + cublas_calls < t.size(); ++i)
    std::printf(" | %s %.3f (%.2fx)", names[i].c_str(), t[i].median_ms, cublas / t[i].median_ms);
  std::printf(" | orders differ in %llu words\n", differing);
  for (size_t i = 0; i < t.size(); ++i) {
    std::ostringstream r;
    r << head << ", \"variant\": \"" << names[i] << "\", \"median_ms\": " << t[i].median_ms << ", \"min_ms\": " << t[i].min_ms
      << ", \"max_ms\": " << t[i].max_ms << ", \"tflops\": " << flops / t[i].median_ms * 1e-9
      << ", \"vs_cublas\": " << cublas / t[i].median_ms << ", \"orders_differing_words\": " << differing << "}";
    json.push_back(r.str());
  }
}

// The weight gradient out_e = P_e^T Q_e (P [rows][m], Q [rows][n], out [experts][m][n] bf16): our
// persistent kernel and CUTLASS's grouped GEMMs in both orders against cuBLAS's per-expert loop.
void probe_wgrad(const Model& model, const Layout& layout, int tokens, const std::string& launch, int m, int n,
                 const std::vector<int>& rows, const std::vector<int32_t>& offset, long total_rows,
                 const ProbeOptions& o, std::vector<std::string>& json) {
  const int experts = int(rows.size());
  const size_t cap = size_t(std::max(offset[experts], kTileM));
  const double gib = (2.0 * cap * (m + n) + 2 * 2.0 * experts * m * n) / (1u << 30);
  std::printf("%-8s %-5s T=%-6d %s  experts %d  rows %ld  M %d  N %d  K/expert ~%ld  (%.1f GiB)", model.name.c_str(),
              layout.name.c_str(), tokens, launch.c_str(), experts, total_rows, m, n, total_rows / experts, gib);
  if (!fits(gib, o)) return;
  const ProbeStream owned;
  const cudaStream_t stream = owned.stream;
  DeviceBuffer p(cap * m * 2), q(cap * n * 2), out_m(size_t(experts) * m * n * 2), out_n(size_t(experts) * m * n * 2);
  DeviceBuffer d_offset(offset), d_rows(rows);
  const std::vector<probe_tiles::WgradSchedule> extra = probe_tiles::wgrad_schedules();
  size_t workspace_bytes = kernels::weight_grad_grouped_workspace_bytes(experts);
  for (const auto& x : extra) workspace_bytes = std::max(workspace_bytes, x.workspace_bytes(experts));
  DeviceBuffer workspace(workspace_bytes);
  testing::fill_random_bf16(p.get(), cap * m, 1.0f, 13, stream);
  testing::fill_random_bf16(q.get(), cap * n, 1.0f, 14, stream);
  auto launch_of = [&](WeightGradKernel kernel, kernels::GroupRaster raster) {
    kernels::WeightGradLaunch l;
    l.p = p.get();
    l.p_cols = m;
    l.q = q.get();
    l.q_cols = n;
    l.rows_cap = int(cap);
    l.experts = experts;
    l.expert_offset = d_offset.as<int32_t>();
    l.expert_rows = d_rows.as<int32_t>();
    l.out = (raster == kernels::GroupRaster::along_n ? out_n : out_m).get();
    l.kernel = kernel;
    l.raster = raster;
    l.workspace = workspace.get();
    l.workspace_bytes = workspace.bytes();
    return l;
  };
  std::vector<TimedCall> calls;
  std::vector<std::string> names;
  const kernels::WeightGradLaunch ours = launch_of(WeightGradKernel::persistent, kernels::GroupRaster::along_m);
  calls.push_back({nullptr, [ours, stream] { kernels::launch_weight_grad(ours, stream); }});
  names.push_back("persistent");
  for (const WgradVariant& v : kWgradVariants) {
    const kernels::WeightGradLaunch l = launch_of(v.kernel, v.raster);
    calls.push_back({nullptr, [l, stream] { kernels::launch_weight_grad(l, stream); }});
    names.push_back(v.name);
  }
  for (const probe_tiles::WgradSchedule& x : extra) {
    const kernels::WeightGradLaunch l = launch_of(WeightGradKernel::grouped_cooperative, kernels::GroupRaster::along_n);
    calls.push_back({nullptr, [l, x, stream] { x.launch(l, stream); }});
    names.push_back(x.name);
  }
  baselines::CublasHandle handle(stream);
  std::vector<baselines::RowBlock> blocks;
  for (int e = 0; e < experts; ++e) blocks.push_back({e, offset[e], rows[e]});
  const baselines::WeightGradOperands op{p.get(), q.get(), out_m.get(), m, n, GradType::bf16};
  calls.push_back({nullptr, [&] { baselines::run_weight_grads(handle.get(), stream, op, blocks, false); }});
  names.push_back("cublas_loop");
  EventTimer timer(o.reps * int(calls.size()));
  const std::vector<Timing> t = timer.measure_rotation(stream, o.warmup, o.reps, calls, [] {});
  unsigned long long differing = 0;
  for (int i = 0; i < 2; ++i) {  // each grouped kernel in both orders, then compared
    kernels::launch_weight_grad(launch_of(kWgradVariants[2 * i].kernel, kernels::GroupRaster::along_m), stream);
    kernels::launch_weight_grad(launch_of(kWgradVariants[2 * i].kernel, kernels::GroupRaster::along_n), stream);
    differing += differing_words(out_m, out_n, stream);
  }
  for (const probe_tiles::WgradSchedule& x : extra) {  // each extra tile against the cooperative kernel's bits
    x.launch(launch_of(WeightGradKernel::grouped_cooperative, kernels::GroupRaster::along_n), stream);
    differing += differing_words(out_m, out_n, stream);
  }
  report(record_head(model, layout, tokens, launch, experts, total_rows, m, n, int(total_rows / experts)), names, t, 1,
         2.0 * total_rows * m * n, differing, json);
}

// One launch of one case: every variant and cuBLAS in rotation. Appends a JSON record per timing.
void probe_launch(const Model& model, const Layout& layout, int tokens, const std::string& launch,
                  const std::vector<int>& rows, const ProbeOptions& o, std::vector<std::string>& json) {
  const MoeShape& s = model.shape;
  const int H = s.hidden, fs = layout.par.ffn_shard(s), n0 = is_gated(s.act) ? 2 * fs : fs;
  const int experts = int(rows.size());
  std::vector<int32_t> offset(experts + 1, 0);
  long total_rows = 0;
  for (int e = 0; e < experts; ++e) {
    offset[e + 1] = offset[e] + (rows[e] + kTileM - 1) / kTileM * kTileM;
    total_rows += rows[e];
  }
  if (launch == "w1") return probe_wgrad(model, layout, tokens, launch, H, fs, rows, offset, total_rows, o, json);
  if (launch == "w0") return probe_wgrad(model, layout, tokens, launch, n0, H, rows, offset, total_rows, o, json);
  int k = 0, n = 0;
  bool w_kn = true;
  if (launch == "l1") k = fs, n = H, w_kn = false;
  else if (launch == "l2") k = H, n = fs;
  else if (launch == "l3") k = n0, n = H;
  else throw InvalidArgument(detail::concat("--launches: l1, l2, l3, w1 or w0, got '", launch, "'"));
  const size_t cap = size_t(std::max(offset[experts], kTileM));
  const double gib = (2.0 * cap * k + 2.0 * experts * k * n + 2 * 2.0 * cap * n) / (1u << 30);
  std::printf("%-8s %-5s T=%-6d %s  experts %d  rows %ld  M/expert ~%ld  N %d  K %d  (%.1f GiB)", model.name.c_str(),
              layout.name.c_str(), tokens, launch.c_str(), experts, total_rows, total_rows / experts, n, k, gib);
  if (!fits(gib, o)) return;
  const ProbeStream owned;
  const cudaStream_t stream = owned.stream;
  DeviceBuffer a(cap * k * 2), w(size_t(experts) * k * n * 2), out_m(cap * n * 2), out_n(cap * n * 2);
  DeviceBuffer d_offset(offset), d_rows(rows);
  const std::vector<probe_tiles::ExpertSchedule> extra{probe_tiles::expert_128x320(), probe_tiles::expert_256x160(),
                                                      probe_tiles::expert_256x128()};
  size_t workspace_bytes = kernels::expert_gemm_grouped_workspace_bytes(experts);
  for (const auto& x : extra) workspace_bytes = std::max(workspace_bytes, x.workspace_bytes(experts));
  DeviceBuffer workspace(workspace_bytes);
  testing::fill_random_bf16(a.get(), cap * k, 1.0f, 11, stream);
  testing::fill_random_bf16(w.get(), size_t(experts) * k * n, 1.0f / std::sqrt(float(k)), 12, stream);
  COMET_CUDA_CHECK(cudaMemsetAsync(out_m.get(), 0, out_m.bytes(), stream));
  COMET_CUDA_CHECK(cudaMemsetAsync(out_n.get(), 0, out_n.bytes(), stream));

  auto launch_of = [&](const Variant& v) {
    kernels::ExpertGemmLaunch l;
    l.a = a.get();
    l.k = k;
    l.w = w.get();
    l.w_kn = w_kn;
    l.n = n;
    l.out = (v.raster == kernels::GroupRaster::along_n ? out_n : out_m).get();
    l.experts = experts;
    l.expert_offset = d_offset.as<int32_t>();
    l.expert_rows = d_rows.as<int32_t>();
    l.kernel = v.kernel;
    l.raster = v.raster;
    l.workspace = workspace.get();
    l.workspace_bytes = workspace.bytes();
    return l;
  };

  baselines::CublasHandle handle(stream);
  baselines::GemmProblems problems(experts);
  std::vector<baselines::RowBlock> blocks;
  for (int e = 0; e < experts; ++e) blocks.push_back({e, offset[e], rows[e]});
  problems.assign({a.get(), w.get(), out_m.get(), n, k,
                   w_kn ? baselines::WeightLayout::k_by_n : baselines::WeightLayout::n_by_k},
                  blocks, stream);

  std::vector<TimedCall> calls;
  std::vector<std::string> names;
  for (const Variant& v : kVariants) {
    const kernels::ExpertGemmLaunch l = launch_of(v);
    calls.push_back({nullptr, [l, stream] { kernels::launch_expert_gemm_grouped(l, stream); }});
    names.push_back(v.name);
  }
  for (const probe_tiles::ExpertSchedule& x : extra) {
    const kernels::ExpertGemmLaunch l = launch_of(kVariants[5]);  // along N into out_n; x.launch ignores l.kernel
    calls.push_back({nullptr, [l, x, stream] { x.launch(l, stream); }});
    names.push_back(x.name);
  }
  for (GemmPath path : {GemmPath::grouped, GemmPath::loop}) {
    calls.push_back({nullptr, [&problems, &handle, path] { problems.run(handle.get(), path); }});
    names.push_back(std::string("cublas_") + to_string(path));
  }
  EventTimer timer(o.reps * int(calls.size()));
  const std::vector<Timing> t = timer.measure_rotation(stream, o.warmup, o.reps, calls, [] {});

  // Each schedule's two orders wrote out_m and out_n; the last writer of each was the schedule that ran
  // last in the final round, so re-run one schedule per order and compare.
  unsigned long long differing = 0;
  for (int i = 0; i < 3; ++i) {
    kernels::launch_expert_gemm_grouped(launch_of(kVariants[2 * i]), stream);
    kernels::launch_expert_gemm_grouped(launch_of(kVariants[2 * i + 1]), stream);
    differing += differing_words(out_m, out_n, stream);
  }
  for (const probe_tiles::ExpertSchedule& x : extra) {  // each extra tile against the library's down-M bits
    x.launch(launch_of(kVariants[5]), stream);
    differing += differing_words(out_m, out_n, stream);
  }
  report(record_head(model, layout, tokens, launch, experts, total_rows, int(total_rows / experts), n, k), names, t, 2,
         2.0 * total_rows * n * k, differing, json);
}

int run(int argc, char** argv) {
  const ProbeOptions o = parse(argc, argv);
  cudaDeviceProp prop{};
  COMET_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("comet-probe-grouped-gemm on %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  std::vector<std::string> json;
  for (const std::string& m : o.models) {
    const Model& model = find_model(m);
    for (const std::string& ln : o.layouts) {
      const Layout layout = parse_layout(ln);
      for (int tokens : o.tokens) {
        const std::vector<int> rows = rows_per_expert(model.shape, layout.par, tokens, 1000 + tokens);
        for (const std::string& launch : o.launches) probe_launch(model, layout, tokens, launch, rows, o, json);
      }
    }
  }
  std::ofstream f(o.out);
  f << "[\n";
  for (size_t i = 0; i < json.size(); ++i) f << "  " << json[i] << (i + 1 < json.size() ? ",\n" : "\n");
  f << "]\n";
  std::printf("wrote %s (%zu records)\n", o.out.c_str(), json.size());
  return 0;
}

}  // namespace
}  // namespace comet::bench

int main(int argc, char** argv) {
  try {
    return comet::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comet-probe-grouped-gemm: %s\n", e.what());
    return 1;
  }
}
