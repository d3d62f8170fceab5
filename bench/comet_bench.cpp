// comet-bench: comet's fused MoE layer against cuBLAS and the sequential / chunked baselines, per layer
// and for the whole forward, on rank 0 of 8 virtual ranks (LocalTeam) while ranks 1..7 have staged their
// tokens. Plans every (model, layout, link) group first (routing, capacity, memory, a device-time
// estimate), then builds each group's layer once and measures its cases. Results: JSON records (DESIGN.md
// section 5) and a markdown table, rewritten after every case so that an interrupted run keeps its data.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bench_options.hpp"
#include "comet/cuda_check.hpp"
#include "comet/tune.hpp"
#include "bench_routing.hpp"
#include "group_runner.hpp"
#include "memory_plan.hpp"
#include "models.hpp"
#include "records.hpp"
#include "time_estimate.hpp"

using namespace comet;
using namespace comet::bench;

namespace {

struct PlannedCase {
  std::string routing;
  int tokens = 0;
  RoutingStats stats;
  CaseCost cost;
};

struct PlannedGroup {
  Model model;
  Layout layout;
  Link link;
  int max_tokens = 0, max_rows = 0;
  MemoryNeed need;
  std::vector<PlannedCase> cases;
  double seconds = 0;  // estimate, setup included
};

// Every rank's routing for (routing kind, tokens, world) of one model, made once and shared by the
// model's layouts and links.
using RoutingCache = std::map<std::tuple<std::string, int, int>, std::vector<testing::RankRouting>>;

const std::vector<testing::RankRouting>& routing_for(RoutingCache& cache, const BenchOptions& o, const Model& m,
                                                     int world, const std::string& kind, int tokens) {
  auto key = std::make_tuple(kind, tokens, world);
  auto it = cache.find(key);
  if (it == cache.end()) {
    uint64_t seed = o.seed;
    for (char c : m.name + kind) seed = seed * 131 + uint64_t(c);
    it = cache.emplace(key, make_bench_routing(m.shape, world, tokens, kind, seed * 1000003ull + tokens)).first;
  }
  return it->second;
}

// The group's cases that fit in memory together: smallest first, each accepted while the layer built
// for the largest accepted one still fits.
PlannedGroup plan_group(const BenchOptions& o, const Model& m, const Layout& l, Link link, RoutingCache& cache,
                        double device_limit, double host_limit) {
  PlannedGroup g{m, l, link};
  std::vector<PlannedCase> all;
  for (const std::string& kind : o.routings)
    for (int t : o.tokens) {
      PlannedCase c{kind, t, routing_stats(m.shape, l.par, routing_for(cache, o, m, l.par.world(), kind, t)), {}};
      c.cost = estimate_case(o, m.shape, l.par, link, c.stats);
      all.push_back(c);
    }
  std::vector<size_t> order(all.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(all[a].stats.max_padded_rows, all[a].tokens) <
           std::make_pair(all[b].stats.max_padded_rows, all[b].tokens);
  });
  std::vector<bool> take(all.size(), false);
  for (size_t i : order) {
    const int t = std::max(g.max_tokens, all[i].tokens), r = std::max(g.max_rows, all[i].stats.max_padded_rows);
    const MemoryNeed need = memory_need(m.shape, l.par, link, t, r, o.has_backward());
    if (need.device_bytes > device_limit || need.host_pinned_bytes > host_limit) {
      std::fprintf(stderr, "skip %s %s %s %s T=%d: needs %.1f GiB device / %.1f GiB pinned host (limits %.1f / %.1f)\n",
                   m.name.c_str(), l.name.c_str(), to_string(link), all[i].routing.c_str(), all[i].tokens,
                   gib(need.device_bytes), gib(need.host_pinned_bytes), gib(device_limit), gib(host_limit));
      continue;
    }
    take[i] = true;
    g.max_tokens = t;
    g.max_rows = r;
    g.need = need;
  }
  for (size_t i = 0; i < all.size(); ++i)  // measured in the order asked for
    if (take[i]) {
      g.cases.push_back(all[i]);
      g.seconds += all[i].cost.seconds;
    }
  if (!g.cases.empty()) g.seconds += estimate_group_setup_seconds(g.need, m.shape, l.par);
  return g;
}

std::string gpu_name() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "unknown";
  return p.name;
}

}  // namespace

namespace comet::bench {

int run_sweep(int argc, char** argv) {
  const BenchOptions o = parse_options(argc, argv);
  RunInfo info{o.estimate_only ? "unknown" : "", o.commit};
  double device_limit = o.mem_limit_gib * (1ull << 30);
  if (!o.estimate_only) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::fprintf(stderr, "comet-bench: no CUDA device (use --estimate to plan without one)\n");
      return 2;
    }
    COMET_CUDA_CHECK(cudaSetDevice(0));
    info.gpu = gpu_name();
    COMET_CUDA_CHECK(cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, 0));
    size_t free_bytes = 0, total_bytes = 0;
    COMET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (device_limit <= 0) device_limit = double(free_bytes) - 6.0 * (1ull << 30);
  } else if (device_limit <= 0) {
    device_limit = (139.0 - 6.0) * (1ull << 30);  // an H200 as the lead's machine reports it
  }
  const double host_limit = o.host_limit_gib * (1ull << 30);
  {
    // Which tuner table the tuned runs read: the shipped path is the build tree's, which a copy of the
    // executables on another machine may not have (its picks then come from the cost model alone).
    const std::string shipped = TuneTable::shipped_path(), user = TuneTable::user_path();
    const size_t in_shipped = TuneTable::load(shipped).size(), in_user = TuneTable::load(user).size();
    std::fprintf(stderr, "comet-bench: tuner table %s (%zu entries), user table %s (%zu entries)%s\n", shipped.c_str(),
                 in_shipped, user.c_str(), in_user,
                 in_shipped + in_user == 0 ? ": NONE FOUND, tuned picks come from the cost model (set COMET_TUNE_TABLE)"
                                           : "");
  }

  // ---- plan: every group, what fits, what it costs -------------------------------------------------
  std::vector<PlannedGroup> groups;
  std::map<std::string, RoutingCache> caches;  // by model: made while planning, used while measuring
  double total_seconds = kStartupSeconds;
  for (const std::string& model_name : o.models) {
    const Model& m = find_model(model_name);
    RoutingCache& cache = caches[m.name];
    for (const std::string& layout_name : o.layouts) {
      const Layout l = parse_layout(layout_name);
      try {
        validate(m.shape, l.par);
      } catch (const InvalidArgument& e) {
        std::fprintf(stderr, "skip %s %s: %s\n", m.name.c_str(), l.name.c_str(), e.what());
        continue;
      }
      for (const std::string& link_name : o.links) {
        PlannedGroup g = plan_group(o, m, l, parse_link(link_name), cache, device_limit, host_limit);
        if (g.cases.empty()) continue;
        total_seconds += g.seconds;
        std::fprintf(stderr, "plan %-8s %-6s %-6s %2zu cases, T_cap %5d, rows_cap %7d, %6.1f GiB device, %5.1f GiB pinned, ~%5.1f s\n",
                     m.name.c_str(), l.name.c_str(), link_name.c_str(), g.cases.size(), g.max_tokens, g.max_rows,
                     gib(g.need.device_bytes), gib(g.need.host_pinned_bytes), g.seconds);
        if (o.estimate_only)
          for (const PlannedCase& c : g.cases)
            std::fprintf(stderr, "       %-10s T=%5d rank 0: %8lld rows, %7lld remote units; GEMM0 %7.2f ms, GEMM1 %7.2f ms, "
                         "link %7.2f ms; case ~%5.1f s (warm-up %d)\n",
                         c.routing.c_str(), c.tokens, c.stats.rank0_rows, c.stats.rank0_remote_units, c.cost.gemm0_ms,
                         c.cost.gemm1_ms, c.cost.comm0_ms, c.cost.seconds, c.cost.warmup);
        groups.push_back(std::move(g));
      }
    }
  }
  size_t n_cases = 0;
  for (const auto& g : groups) n_cases += g.cases.size();
  std::fprintf(stderr, "comet-bench: %zu cases in %zu groups, estimated device time %.0f s (%.1f min)\n", n_cases,
               groups.size(), total_seconds, total_seconds / 60);
  if (o.estimate_only) return 0;

  // ---- measure ------------------------------------------------------------------------------------------
  std::vector<Record> records;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  size_t done = 0;
  int failures_in_a_row = 0;
  for (PlannedGroup& g : groups) {
    RoutingCache& cache = caches[g.model.name];
    std::unique_ptr<GroupRunner> runner;
    // The memory plan is an estimate: if the layer does not fit after all, drop the largest case and
    // build again (an out-of-memory error leaves the context usable).
    while (!g.cases.empty() && !runner) {
      try {
        runner = std::make_unique<GroupRunner>(o, g.model, g.layout, g.link, g.max_tokens, g.max_rows);
      } catch (const CudaError& e) {
        auto largest = std::max_element(g.cases.begin(), g.cases.end(), [](const PlannedCase& a, const PlannedCase& b) {
          return std::make_pair(a.stats.max_padded_rows, a.tokens) < std::make_pair(b.stats.max_padded_rows, b.tokens);
        });
        std::fprintf(stderr, "could not build %s %s %s at T_cap %d, rows_cap %d (%s); skipping %s T=%d\n",
                     g.model.name.c_str(), g.layout.name.c_str(), to_string(g.link), g.max_tokens, g.max_rows, e.what(),
                     largest->routing.c_str(), largest->tokens);
        g.cases.erase(largest);
        ++done;
        g.max_tokens = g.max_rows = 0;
        for (const PlannedCase& c : g.cases) {
          g.max_tokens = std::max(g.max_tokens, c.tokens);
          g.max_rows = std::max(g.max_rows, c.stats.max_padded_rows);
        }
        cudaGetLastError();  // clear the (non-sticky) allocation error
      } catch (const std::exception& e) {
        std::fprintf(stderr, "FAILED to build %s %s %s: %s\n", g.model.name.c_str(), g.layout.name.c_str(),
                     to_string(g.link), e.what());
        done += g.cases.size();
        g.cases.clear();
      }
    }
    if (!runner) continue;
    for (const PlannedCase& c : g.cases) {
      ++done;
      std::fprintf(stderr, "[%zu/%zu %.0fs] %s %s %s %s T=%d (rows %lld, remote %lld)\n", done, n_cases, elapsed(),
                   g.model.name.c_str(), g.layout.name.c_str(), to_string(g.link), c.routing.c_str(), c.tokens,
                   c.stats.rank0_rows, c.stats.rank0_remote_units);
      CaseInput in{c.routing, c.tokens, &routing_for(cache, o, g.model, g.layout.par.world(), c.routing, c.tokens),
                   c.stats, c.cost.warmup};
      try {
        runner->run_case(in, records);
        failures_in_a_row = 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "   FAILED: %s\n", e.what());
        runner->recover();
        if (++failures_in_a_row >= 3) break;
      }
      write_results(o.out, records, info);
    }
    if (failures_in_a_row >= 3) {
      std::fprintf(stderr, "comet-bench: three failures in a row, stopping\n");
      break;
    }
  }
  write_results(o.out, records, info);
  std::fprintf(stderr, "comet-bench: %zu records in %s (and .md), %.0f s\n", records.size(), o.out.c_str(), elapsed());
  return failures_in_a_row >= 3 ? 1 : 0;
}

int run_sweep(const std::vector<std::string>& args) {
  std::vector<std::string> own{"comet-bench"};
  own.insert(own.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : own) argv.push_back(a.data());
  argv.push_back(nullptr);
  return run_sweep(int(own.size()), argv.data());
}

}  // namespace comet::bench
