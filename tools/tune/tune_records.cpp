#include "tune_records.hpp"

#include <algorithm>
#include <fstream>

#include "models.hpp"
#include "tune/cost_model_eval.hpp"

namespace comet::tune_tool {

using nlohmann::json;

std::vector<json> read_records(const std::string& path) {
  std::ifstream in(path);
  COMET_REQUIRE(bool(in), "comet-tune: cannot read ", path);
  json j;
  in >> j;
  COMET_REQUIRE(j.is_array(), "comet-tune: ", path, " is not a list of benchmark records");
  return j.get<std::vector<json>>();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double middle(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A record's SM count: --sms, else the one the benchmark wrote ("sms"), else 132 (H100 SXM, H200:
// records written before the benchmark kept the count).
int sms_of(const json& r, int forced) {
  if (forced > 0) return forced;
  return r.contains("sms") && r["sms"].is_number_integer() ? r["sms"].get<int>() : 132;
}

// The link a record's key has: the team's. comet-bench-ipc with one GPU per rank writes "nvlink" (its
// IpcTeam's buffers are device memory, so the layer keys them as the device link), on one GPU "device".
Link link_of(const json& r) {
  const std::string l = r.value("link", "host");
  return l == "nvlink" ? Link::device : parse_link(l);
}

// Whether a record counts for the table: comet-bench-ipc's records name the way the ranks reached each
// other, and the table has one row per key for the kernels --transport names; comet-bench's records
// name none and always count.
bool of_transport(const json& r, const std::string& transport) {
  return !r.contains("transport") || r.value("transport", "") == transport;
}

// A record's launch id (comet/tune.hpp: "l0".."l3"), -1 for the whole-layer records (fwd, bwd, ...).
int launch_of(const json& r) {
  const std::string l = r.value("layer", "");
  return l.size() == 2 && l[0] == 'l' && l[1] >= '0' && l[1] < char('0' + kLaunchLayers) ? l[1] - '0' : -1;
}

// A record's table key (its load class from the rows it counted; uniform records: class 1).
TuneKey key_of(const json& r, int sms) {
  const bench::Model& m = bench::find_model(r.value("model", ""));
  TuneKey k;
  k.gpu = r.value("gpu", "?");
  k.sms = sms;
  k.layer = launch_of(r);
  k.hidden = m.shape.hidden;
  k.ffn = m.shape.ffn;
  k.experts = m.shape.num_experts;
  k.topk = m.shape.topk;
  k.world = r.value("world", 8);
  k.ep = r.value("ep", 8);
  k.tp = r.value("tp", 1);
  k.link = link_of(r);
  k.tokens_bucket = tokens_bucket(r.value("tokens_per_rank", 0));
  // Layer 0's inputs (comet-bench --dtype): e4m3 entries are keys of their own; layer 1 is bf16 either way.
  if (k.layer == 0) k.dtype = r.value("dtype", "bf16");
  // The load class of the rows rank 0 counted (records without them: uniform).
  const int tokens = r.value("tokens_per_rank", 0);
  if (r.contains("rows") && r["rows"].is_number() && tokens > 0)
    k.load = load_class(r["rows"].get<double>(), expected_rows(m.shape, Parallel{k.ep, k.tp}, tokens));
  return k;
}

TuneKey uniform_key_of(const json& r, int sms) {
  TuneKey k = key_of(r, sms);
  k.load = 1;  // uniform routing is class 1 by definition
  return k;
}

// The work the cost model sees for a record: expected from the key (uniform routing), or, with
// `measured`, from the rows and link rows the record counted on rank 0 (what a pick made on the device
// from the plan would see; local units taken as an even 1/(W-1) of the remote ones).
LayerWork work_of(const json& r, bool measured) {
  const bench::Model& m = bench::find_model(r.value("model", ""));
  const Parallel par{r.value("ep", 8), r.value("tp", 1)};
  const DType dtype = r.value("dtype", "bf16") == "e4m3" ? DType::e4m3 : DType::bf16;
  LayerWork w = expected_work(m.shape, par, launch_of(r), r.value("tokens_per_rank", 0), 256, dtype);
  if (measured && r.contains("rows") && r.contains("link_rows")) {
    const double remote = r.value("link_rows", 0), W = par.world();
    const double units = remote * W / std::max(1.0, W - 1);
    w = measured_work(row_work(m.shape, par, launch_of(r), dtype), r.value("rows", 0), units, units - remote);
  }
  return w;
}

}  // namespace comet::tune_tool
