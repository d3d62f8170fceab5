#include "gemm_width_runs.hpp"

#include <algorithm>
#include <tuple>

namespace comet::tune_tool {

WidthRatios width_ratios(const std::vector<GemmRecord>& records,
                         const std::function<std::optional<std::string>(const nlohmann::json&)>& key_of) {
  // (run, key, width) -> our time and cuBLAS's, both from records timed in rotation.
  std::map<std::tuple<int, std::string, int>, std::pair<double, double>> pairs;
  for (const GemmRecord& g : records) {
    const nlohmann::json& r = g.record;
    if (!r.value("paired", false) || r.value("routing", "") != "uniform") continue;
    const std::string system = r.value("system", "");
    // gemm_only times the GEMM the planner would run alone: a table's standalone pick (picked_by names
    // it) is CUTLASS's, not our kernel at the run's width.
    const bool ours =
        system == "comet" && r.value("mode", "") == "gemm_only" && r.value("picked_by", "comet") == "comet";
    if (!ours && system != "cublas") continue;
    const auto key = key_of(r);
    if (!key) continue;
    auto& p = pairs[{g.file, *key, r.value("tile_n", 256)}];
    (ours ? p.first : p.second) = r.value("median_ms", 0.0);
  }
  std::map<std::string, std::map<int, std::vector<double>>> by_width;
  for (const auto& [id, p] : pairs)
    if (p.first > 0 && p.second > 0) by_width[std::get<1>(id)][std::get<2>(id)].push_back(p.first / p.second);
  WidthRatios out;
  for (auto& [key, widths] : by_width)
    for (auto& [w, v] : widths) {
      std::sort(v.begin(), v.end());
      out[key][w] = v[v.size() / 2];
    }
  return out;
}

std::optional<int> width_pick(const std::map<int, double>& ratios, double gain) {
  const auto wide = ratios.find(256);
  if (wide == ratios.end()) return std::nullopt;
  int pick = 256;
  double best = wide->second * gain;
  for (const auto& [w, ratio] : ratios)
    if (w != 256 && ratio < best) pick = w, best = ratio;
  return pick;
}

}  // namespace comet::tune_tool
