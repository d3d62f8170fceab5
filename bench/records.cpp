#include "records.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "comet/common.hpp"

namespace comet::bench {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;  // names never hold control characters
    out += c;
  }
  return out + "\"";
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// Appends `"name": value` items to one JSON object.
struct JsonObject {
  std::ostringstream os;
  bool first = true;
  void raw(const char* name, const std::string& value) {
    os << (first ? "" : ", ") << quote(name) << ": " << value;
    first = false;
  }
  void str(const char* name, const std::string& v) { raw(name, quote(v)); }
  void number(const char* name, double v) { raw(name, num(v)); }
  void integer(const char* name, long long v) { raw(name, std::to_string(v)); }
  template <class T>
  void optional(const char* name, const std::optional<T>& v) {
    if (v) raw(name, num(double(*v)));
  }
  std::string done() { return "{" + os.str() + "}"; }
};

std::string key_of(const CaseKey& k) {
  return k.model + "|" + k.layout + "|" + k.link + "|" + k.routing + "|" + std::to_string(k.tokens_per_rank);
}

std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

std::string fixed2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

std::string ratio(double num_ms, double den_ms) {
  if (!(num_ms > 0 && den_ms > 0)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx", num_ms / den_ms);
  return buf;
}

}  // namespace

std::string to_json(const std::vector<Record>& records, const RunInfo& info) {
  std::ostringstream os;
  os << "[\n";
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    JsonObject o;
    o.str("model", r.key.model);
    o.str("layer", r.layer);
    o.str("system", r.system);
    o.integer("world", r.key.world);
    o.integer("ep", r.key.ep);
    o.integer("tp", r.key.tp);
    o.str("link", r.key.link);
    o.integer("tokens_per_rank", r.key.tokens_per_rank);
    o.str("routing", r.key.routing);
    o.number("median_ms", r.median_ms);
    o.raw("tflops", r.tflops ? num(*r.tflops) : "null");
    o.str("gpu", info.gpu);
    if (info.sms > 0) o.integer("sms", info.sms);
    o.str("commit", info.commit);
    if (r.system == "comet") {
      o.raw("n_comm", r.n_comm ? std::to_string(*r.n_comm) : "null");
      o.str("mode", r.mode);
    }
    o.str("layout", r.key.layout);
    o.str("dtype", r.dtype);
    o.optional("n_comm_l1", r.n_comm_l1);
    o.optional("gb_s", r.gb_s);
    o.optional("overlap_efficiency", r.overlap_efficiency);
    o.optional("t_seq_ms", r.t_seq_ms);
    o.optional("chunks", r.chunks);
    o.optional("chunks_requested", r.chunks_requested);
    if (!r.cublas_path.empty()) o.str("cublas_path", r.cublas_path);
    o.optional("other_path_ms", r.other_path_ms);
    if (r.best) o.raw("best", "true");
    if (r.tuned) o.raw("tuned", "true");
    if (r.paired) o.raw("paired", "true");
    if (!r.picked_by.empty()) o.str("picked_by", r.picked_by);
    if (!r.tile_order.empty()) o.str("tile_order", r.tile_order);
    if (r.wave_chunk > 0) o.integer("wave_chunk", r.wave_chunk);
    if (!r.pull_order.empty()) o.str("pull_order", r.pull_order);
    o.integer("tile_n", r.tile_n);
    o.integer("samples", r.samples);
    o.number("min_ms", r.min_ms);
    o.number("max_ms", r.max_ms);
    o.integer("rows", r.rows);
    o.integer("link_rows", r.link_rows);
    o.integer("layer_bytes_per_rank", r.layer_bytes_per_rank);
    o.integer("tokens_cap", r.tokens_cap);
    o.integer("rows_cap", r.rows_cap);
    if (!r.transport.empty()) o.str("transport", r.transport);
    os << "  " << o.done() << (i + 1 < records.size() ? ",\n" : "\n");
  }
  os << "]\n";
  return os.str();
}

std::string to_markdown(const std::vector<Record>& records, const RunInfo& info) {
  // Cases in the order they were measured; per case and layer, the records that the table needs.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Record*>> by_case;
  for (const Record& r : records) {
    const std::string k = key_of(r.key);
    if (!by_case.count(k)) order.push_back(k);
    by_case[k].push_back(&r);
  }
  std::ostringstream os;
  os << "# comet-bench (" << info.gpu << ", commit " << info.commit << ")\n\n"
     << "Rank 0 of 8 virtual ranks on one GPU; medians in ms. T_gemm: comet's kernel with every row local; "
        "T_comm: its comm blocks alone at the best fused n_comm; T_seq = T_gemm + T_comm; efficiency = "
        "T_fused / max(T_gemm, T_comm) (1.0 is perfect overlap). Speedup = baseline time / comet time. "
        "bwd: the backward after a training forward; wgrad / dgrad: the weight- / data-gradient GEMMs "
        "alone (cublas: cuBLAS, T_gemm: comet's kernels).\n\n"
     << "| model | layout | link | routing | tokens | layer | cublas (path) | T_gemm | T_comm | T_seq | "
        "T_fused (n_comm) | efficiency | tuned (n_comm) | sequential | chunked (C) | speedup vs sequential | "
        "speedup vs chunked |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const std::string& k : order) {
    const auto& rs = by_case[k];
    for (const char* layer : {"l0", "l1", "fwd", "bwd", "fwd+bwd", "wgrad", "dgrad"}) {
      auto find = [&](const std::string& system, const std::string& mode, bool best) -> const Record* {
        for (const Record* r : rs)
          if (r->layer == layer && r->system == system && (mode.empty() || r->mode == mode) && (!best || r->best))
            return r;
        return nullptr;
      };
      const Record* cublas = find("cublas", "", false);
      const Record* gemm = find("comet", "gemm_only", false);
      const Record* fused = find("comet", "fused", true);
      const Record* seq = find("sequential", "", false);
      const Record* tuned = nullptr;
      for (const Record* r : rs)
        if (r->layer == std::string(layer) && r->system == "comet" && r->tuned) tuned = r;
      const Record* chunked = find("chunked", "", false);
      const Record* comm = nullptr;
      if (fused)
        for (const Record* r : rs)
          if (r->layer == std::string(layer) && r->system == "comet" && r->mode == "comm_only" && r->n_comm == fused->n_comm)
            comm = r;
      if (!cublas && !gemm && !fused && !tuned && !seq && !chunked) continue;
      const CaseKey& c = rs.front()->key;
      // Speedups of the sweep's best variant, or of the tuned pick where no sweep ran (fwd-only runs).
      const double comet_ms = fused ? fused->median_ms : tuned ? tuned->median_ms : 0;
      os << "| " << c.model << " | " << c.layout << " | " << c.link << " | " << c.routing << " | " << c.tokens_per_rank
         << " | " << layer << " | " << (cublas ? ms(cublas->median_ms) + " (" + cublas->cublas_path + ")" : "-")
         << " | " << (gemm ? ms(gemm->median_ms) : "-") << " | " << (comm ? ms(comm->median_ms) : "-") << " | "
         << (fused && fused->t_seq_ms ? ms(*fused->t_seq_ms) : "-") << " | ";
      if (fused) {
        os << ms(fused->median_ms) << " (" << (fused->n_comm ? std::to_string(*fused->n_comm) : "?");
        if (fused->n_comm_l1) os << "/" << *fused->n_comm_l1;
        os << ")";
      } else {
        os << "-";
      }
      os << " | " << (fused && fused->overlap_efficiency ? fixed2(*fused->overlap_efficiency) : "-") << " | ";
      if (tuned) {
        os << ms(tuned->median_ms) << " (" << tuned->n_comm.value_or(-1);
        if (tuned->n_comm_l1) os << "/" << *tuned->n_comm_l1;
        os << ")";
      } else {
        os << "-";
      }
      os << " | " << (seq ? ms(seq->median_ms) : "-") << " | "
         << (chunked ? ms(chunked->median_ms) + " (" + std::to_string(chunked->chunks.value_or(0)) + ")" : "-") << " | "
         << (seq ? ratio(seq->median_ms, comet_ms) : "-") << " | " << (chunked ? ratio(chunked->median_ms, comet_ms) : "-")
         << " |\n";
    }
  }
  return os.str();
}

void write_results(const std::string& json_path, const std::vector<Record>& records, const RunInfo& info) {
  const std::filesystem::path path(json_path);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::filesystem::path md = path;
  md.replace_extension(".md");
  for (const auto& [p, text] : {std::pair{path, to_json(records, info)}, std::pair{md, to_markdown(records, info)}}) {
    std::ofstream f(p);
    COMET_REQUIRE(f.good(), "cannot write ", p.string());
    f << text;
  }
}

}  // namespace comet::bench
