#include "weight_grad_runs.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "tune_records.hpp"

namespace comet::tune_tool {

using nlohmann::json;

namespace {

std::optional<WeightGradKernel> kernel_of_mode(const std::string& mode) {
  if (mode == "gemm_only") return WeightGradKernel::persistent;
  if (mode == "grouped") return WeightGradKernel::grouped;
  if (mode == "grouped_cooperative") return WeightGradKernel::grouped_cooperative;
  if (mode == "grouped_320") return WeightGradKernel::grouped_320;
  return std::nullopt;
}

}  // namespace

void add_weight_grad_runs(const std::vector<json>& records, int sms,
                          std::map<std::string, WeightGradRuns>& runs) {
  std::map<std::string, std::map<WeightGradKernel, double>> this_run;
  std::map<std::string, TuneKey> keys;
  for (const json& r : records) {
    if (r.value("system", "") != "comet" || r.value("layer", "") != "wgrad" || r.value("routing", "") != "uniform")
      continue;
    const auto kernel = kernel_of_mode(r.value("mode", ""));
    const double ms = r.value("median_ms", 0.0);
    if (!kernel || ms <= 0) continue;
    TuneKey k = uniform_key_of(r, sms_of(r, sms));
    k.layer = kWeightGradLaunch;
    keys.emplace(k.str(), k);
    this_run[k.str()][*kernel] = ms;
  }
  for (const auto& [s, times] : this_run) {
    const auto persistent = times.find(WeightGradKernel::persistent);
    if (persistent == times.end()) continue;  // no common bar in this run
    WeightGradRuns& w = runs.try_emplace(s, WeightGradRuns{keys.at(s), {}, {}}).first->second;
    for (const auto& [kernel, ms] : times) {
      w.over_persistent[kernel].push_back(ms / persistent->second);
      w.ms[kernel].push_back(ms);
    }
  }
}

void apply_weight_grad_runs(const std::map<std::string, WeightGradRuns>& runs, TuneTable& table) {
  for (const auto& [s, w] : runs) {
    WeightGradKernel best = WeightGradKernel::persistent;
    double best_ratio = 1.0;
    for (const auto& [kernel, ratios] : w.over_persistent)
      if (const double r = middle(ratios); r < best_ratio) best = kernel, best_ratio = r;
    const TuneEntry* e = table.find(w.key);
    const WeightGradKernel before = e ? e->variant.weight_grad : WeightGradKernel::automatic;
    std::printf("  %-78s %-19s %.3f of persistent (%zu runs)%s\n", s.c_str(), to_string(best), best_ratio,
                w.over_persistent.at(WeightGradKernel::persistent).size(), before == best ? "" : e ? "  (changed)" : "  (new)");
    TuneEntry entry;
    entry.variant.tile_n = 0;  // unused in these keys
    entry.variant.n_comm = 0;
    entry.variant.weight_grad = best;
    entry.ms = middle(w.ms.at(best));
    table.put(w.key, entry);
  }
}

}  // namespace comet::tune_tool
