#include "one_launch_runs.hpp"

#include <algorithm>
#include <cstdio>

#include "tune_records.hpp"

namespace comet::tune_tool {

using nlohmann::json;

std::map<std::string, OneLaunchPair> one_launch_pairs(const std::vector<json>& records, int sms,
                                                      std::map<std::string, TuneKey>& keys) {
  // A case's records of one run: its tuned record, then the A/B record written right after it.
  std::map<std::string, const json*> tuned;  // by key
  std::map<std::string, OneLaunchPair> pairs;
  for (const json& r : records) {
    if (r.value("system", "") != "comet" || r.value("layer", "") != "l1" || r.value("routing", "") != "uniform" ||
        !r.value("paired", false))
      continue;
    const std::string mode = r.value("mode", "");
    const TuneKey k = uniform_key_of(r, sms_of(r, sms));
    if (r.value("tuned", false) && mode == "fused") {
      tuned[k.str()] = &r;
      continue;
    }
    if (mode != "ab_one_launch_off" && mode != "ab_one_launch_on") continue;
    const auto t = tuned.find(k.str());
    if (t == tuned.end() || t->second->value("n_comm", -1) != 0) continue;
    const bool tuned_was_one = mode == "ab_one_launch_off";  // the A/B record ran the other way
    const double one = (tuned_was_one ? *t->second : r).value("median_ms", 0.0);
    const double two = (tuned_was_one ? r : *t->second).value("median_ms", 0.0);
    const int tile_n = t->second->value("tile_n", 256);
    if (one <= 0 || two <= 0) continue;
    keys.emplace(k.str(), k);
    OneLaunchPair& p = pairs[k.str()];
    if (p.tile_n != tile_n) p = OneLaunchPair{{}, tile_n};  // runs at another tile say nothing about this one
    p.two_over_one.push_back(two / one);
  }
  return pairs;
}

void apply_one_launch(const std::map<std::string, OneLaunchPair>& pairs, const std::map<std::string, TuneKey>& keys,
                      double gain, TuneTable& table) {
  for (const auto& [s, p] : pairs) {
    const TuneKey& k = keys.at(s);
    const TuneEntry* e = table.find(k);
    if (!e || e->variant.n_comm != 0 || e->variant.standalone_gemm != StandaloneGemm::comet ||
        e->variant.tile_n != p.tile_n || p.two_over_one.empty())
      continue;
    const double ratio = middle(p.two_over_one);
    const bool one = ratio * gain > 1.0;
    std::printf("  %-78s two launches / one: %.3f (%zu runs)%s\n", s.c_str(), ratio, p.two_over_one.size(),
                one != e->variant.one_launch ? (one ? "  -> one launch" : "  -> two launches") : "");
    if (one == e->variant.one_launch) continue;
    TuneEntry changed = *e;
    changed.variant.one_launch = one;
    changed.ms = one ? e->ms / ratio : e->ms * ratio;  // the entry's time, scaled by the runs' ratio
    table.put(k, changed);
  }
}

}  // namespace comet::tune_tool
