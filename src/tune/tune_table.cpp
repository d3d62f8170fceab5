// The persisted table of measured picks and calibrated cost models (JSON, nlohmann-json).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "comet/common.hpp"
#include "comet/tune.hpp"
#include "tune/cost_model_eval.hpp"

namespace comet {

namespace {

using nlohmann::json;

std::string model_key(const std::string& gpu, Link link) { return gpu + '|' + to_string(link); }

json to_json(const LayerVariant& v) {
  json j{{"tile_n", v.tile_n}, {"n_comm", v.n_comm}, {"m_group", v.m_group}, {"n_group", v.n_group}};
  if (v.standalone_gemm != StandaloneGemm::comet) j["standalone_gemm"] = to_string(v.standalone_gemm);
  if (v.one_launch) j["one_launch"] = true;
  if (v.wave_chunk > 0) j["wave_chunk"] = v.wave_chunk;
  if (v.weight_grad != WeightGradKernel::automatic) j["weight_grad_kernel"] = to_string(v.weight_grad);
  return j;
}

LayerVariant variant_from(const json& j) {
  LayerVariant v;
  v.tile_n = j.at("tile_n").get<int>();
  v.n_comm = j.at("n_comm").get<int>();
  v.m_group = j.value("m_group", 0);
  v.n_group = j.value("n_group", 1);
  const std::string gemm = j.value("standalone_gemm", "comet");
  const std::optional<StandaloneGemm> g = standalone_gemm_named(gemm);
  if (!g) {
    throw InvalidArgument(detail::concat("standalone_gemm '", gemm, "' is not ", enum_names(kStandaloneGemms)));
  }
  v.standalone_gemm = *g;
  v.one_launch = j.value("one_launch", false);
  v.wave_chunk = j.value("wave_chunk", 0);
  if (v.wave_chunk < 0) throw InvalidArgument(detail::concat("wave_chunk must be >= 0 (0: the default), got ", v.wave_chunk));
  const std::string wgrad = j.value("weight_grad_kernel", "auto");
  const std::optional<WeightGradKernel> w = weight_grad_kernel_named(wgrad);
  if (!w) throw InvalidArgument(detail::concat("weight_grad_kernel '", wgrad, "' is not ", enum_names(kWeightGradKernels)));
  v.weight_grad = *w;
  return v;
}

std::string& shipped_path_storage() {
  static std::string path = COMET_SHIPPED_TUNE_TABLE;
  return path;
}

}  // namespace

std::string TuneTable::shipped_path() { return shipped_path_storage(); }
void TuneTable::set_shipped_path(const std::string& path) { shipped_path_storage() = path; }

TuneTable TuneTable::load_default() {
  TuneTable t = load(shipped_path());
  t.overlay(load(user_path()));
  return t;
}

void TuneTable::overlay(const TuneTable& over) {
  for (const auto& [key, e] : over.entries_) entries_[key] = e;
  for (const auto& [key, m] : over.models_) models_[key] = m;
}

std::string TuneTable::user_path() {
  if (const char* p = std::getenv("COMET_TUNE_TABLE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/comet/tune.json";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/comet/tune.json";
}

TuneTable TuneTable::load(const std::string& path) {
  TuneTable t;
  std::ifstream in(path);
  if (!in) return t;
  json j;
  try {
    in >> j;
    for (const auto& item : j.at("entries").items()) {
      const json& e = item.value();
      t.entries_[item.key()] = TuneEntry{variant_from(e), e.value("ms", 0.0)};
    }
    const json models = j.value("models", json::object());
    for (const auto& item : models.items()) {
      const json& m = item.value();
      CostModel c;
      c.gemm_tflops_per_sm = m.at("gemm_tflops_per_sm").get<double>();
      c.l0_unit_us = m.at("l0_unit_us").get<double>();
      c.l0_store_gbps = m.at("l0_store_gbps").get<double>();
      c.l1_slice_us = m.at("l1_slice_us").get<double>();
      c.link_gbps = m.at("link_gbps").get<double>();
      c.overlap_penalty = m.value("overlap_penalty", c.overlap_penalty);
      c.tile128_efficiency = m.value("tile128_efficiency", c.tile128_efficiency);
      c.tile192_efficiency = m.value("tile192_efficiency", c.tile192_efficiency);
      c.fp8_gemm_tflops_per_sm = m.value("fp8_gemm_tflops_per_sm", c.fp8_gemm_tflops_per_sm);
      t.models_[item.key()] = c;
    }
  } catch (const std::exception& e) {
    throw InvalidArgument(detail::concat("tune table ", path, " is not a comet tune table: ", e.what()));
  }
  return t;
}

void TuneTable::save(const std::string& path) const {
  json j;
  j["version"] = 1;
  j["entries"] = json::object();
  for (const auto& [key, e] : entries_) {
    json v = to_json(e.variant);
    v["ms"] = e.ms;
    j["entries"][key] = v;
  }
  j["models"] = json::object();
  for (const auto& [key, m] : models_) {
    j["models"][key] = json{{"gemm_tflops_per_sm", m.gemm_tflops_per_sm},
                            {"l0_unit_us", m.l0_unit_us},
                            {"l0_store_gbps", m.l0_store_gbps},
                            {"l1_slice_us", m.l1_slice_us},
                            {"link_gbps", m.link_gbps},
                            {"overlap_penalty", m.overlap_penalty},
                            {"tile128_efficiency", m.tile128_efficiency},
                            {"tile192_efficiency", m.tile192_efficiency},
                            {"fp8_gemm_tflops_per_sm", m.fp8_gemm_tflops_per_sm}};
  }
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream out(path);
  COMET_REQUIRE(bool(out), "tune table: cannot write ", path);
  out << j.dump(2) << '\n';
}

const TuneEntry* TuneTable::find(const TuneKey& key) const {
  const auto it = entries_.find(key.str());
  return it == entries_.end() ? nullptr : &it->second;
}

void TuneTable::put(const TuneKey& key, const TuneEntry& entry) { entries_[key.str()] = entry; }

CostModel TuneTable::model(const std::string& gpu, Link link) const {
  const auto it = models_.find(model_key(gpu, link));
  return it == models_.end() ? CostModel::defaults(link) : it->second;
}

void TuneTable::set_model(const std::string& gpu, Link link, const CostModel& m) { models_[model_key(gpu, link)] = m; }

TunedVariant pick_variant(const TuneTable& table, const TuneKey& key, const LayerWork& work,
                          const LayerRequest& request) {
  TunedVariant t;
  if (const TuneEntry* e = table.find(key)) {
    t = TunedVariant{e->variant, "table"};  // a forced shape keeps the table's n_comm
    // The table's sweeps ran one tile width. Where another width pads the layer's N far less (Qwen2-MoE
    // TP 8's layer 0: N 352 is 512 columns at 256, 384 at 192; 29 % faster on the H200), the model's
    // width wins and the table's n_comm stays (the comm blocks' work does not depend on the tile).
    // (Only for padding: a table's narrower tile where no width pads less was measured to be faster.)
    const CostModel model = table.model(key.gpu, key.link);
    const int best = model.best_tile_n(work);
    if (!request.tile_n && padded_columns(work.gemm_n, best) < padded_columns(work.gemm_n, t.variant.tile_n) &&
        model.tile_factor(work, best) < kNarrowTileGain * model.tile_factor(work, t.variant.tile_n)) {
      t.variant.tile_n = best;
      t.picked_by = "table+tile";
    }
  } else {
    const CostModel model = table.model(key.gpu, key.link);
    t.variant.tile_n = request.tile_n.value_or(model.best_tile_n(work));
    t.variant.n_comm = model.best_n_comm(work, key.sms, t.variant.tile_n);
    t.variant.m_group = 0;
    t.variant.n_group = 1;
    t.variant.standalone_gemm = StandaloneGemm::comet;  // the model has no rates for CUTLASS's GEMMs
    t.variant.one_launch = false;                       // nor for one launch: two, as measured most
    t.picked_by = "cost_model";
  }
  LayerVariant& v = t.variant;
  v.tile_n = request.tile_n.value_or(v.tile_n);
  v.n_comm = request.n_comm.value_or(v.n_comm);
  v.m_group = request.m_group.value_or(v.m_group);
  v.n_group = request.n_group.value_or(v.n_group);
  v.standalone_gemm = request.standalone_gemm.value_or(v.standalone_gemm);
  v.one_launch = request.one_launch.value_or(v.one_launch);
  return t;
}

}  // namespace comet
