#include "one_launch_runs.hpp"

#include <cstdio>

#include "tune_records.hpp"

namespace comet::tune_tool {

using nlohmann::json;

std::map<std::string, OneLaunchPair> one_launch_pairs(const std::vector<json>& records, int sms,
                                                      std::map<std::string, TuneKey>& keys) {
  // A case's records of one run: its tuned record, then the A/B record written right after it.
  std::map<std::string, const json*> tuned;  // by case
  std::map<std::string, OneLaunchPair> pairs;
  auto case_of = [](const json& r) {
    return r.value("gpu", "?") + '|' + r.value("model", "") + '|' + r.value("layout", "") + '|' +
           r.value("link", "") + '|' + std::to_string(r.value("tokens_per_rank", 0));
  };
  for (const json& r : records) {
    if (r.value("system", "") != "comet" || r.value("layer", "") != "l1" || r.value("routing", "") != "uniform" ||
        !r.value("paired", false))
      continue;
    const std::string mode = r.value("mode", "");
    if (r.value("tuned", false) && mode == "fused") {
      tuned[case_of(r)] = &r;
      continue;
    }
    if (mode != "ab_one_launch_off" && mode != "ab_one_launch_on") continue;
    const auto t = tuned.find(case_of(r));
    if (t == tuned.end() || t->second->value("n_comm", -1) != 0) continue;
    const bool tuned_was_one = mode == "ab_one_launch_off";  // the A/B record ran the other way
    OneLaunchPair p;
    p.one_ms = (tuned_was_one ? *t->second : r).value("median_ms", 0.0);
    p.two_ms = (tuned_was_one ? r : *t->second).value("median_ms", 0.0);
    p.tile_n = t->second->value("tile_n", 256);
    const TuneKey k = uniform_key_of(r, sms_of(r, sms));
    keys.emplace(k.str(), k);
    pairs[k.str()] = p;  // a later run replaces an earlier one
  }
  return pairs;
}

void apply_one_launch(const std::map<std::string, OneLaunchPair>& pairs, const std::map<std::string, TuneKey>& keys,
                      double gain, TuneTable& table) {
  for (const auto& [s, p] : pairs) {
    const TuneKey& k = keys.at(s);
    const TuneEntry* e = table.find(k);
    if (!e || e->variant.n_comm != 0 || e->variant.standalone_gemm != StandaloneGemm::comet ||
        e->variant.tile_n != p.tile_n || p.one_ms <= 0 || p.two_ms <= 0)
      continue;
    const bool one = p.one_ms < gain * p.two_ms;
    std::printf("  %-78s one launch %.3f ms, two %.3f ms (%.3fx)%s\n", s.c_str(), p.one_ms, p.two_ms,
                p.two_ms / p.one_ms, one != e->variant.one_launch ? (one ? "  -> one launch" : "  -> two launches") : "");
    if (one == e->variant.one_launch) continue;
    TuneEntry changed = *e;
    changed.variant.one_launch = one;
    if (one) changed.ms = p.one_ms * e->ms / p.two_ms;  // the entry's time, scaled by the pair's ratio
    else changed.ms = p.two_ms * e->ms / p.one_ms;
    table.put(k, changed);
  }
}

}  // namespace comet::tune_tool
