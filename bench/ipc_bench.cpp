// comet-bench-ipc: the fused MoE layer with one process per rank (IpcTeam), once for each way the ranks
// reach each other's buffers, side by side in one run (issue 19's benchmark rows):
//   cuda_ipc      CUDA IPC memory handles; the comm blocks load and store through peer pointers
//   nvshmem_heap  NVSHMEM's symmetric heap; the same kernels, through nvshmem_ptr
//   nvshmem       NVSHMEM's heap and its device transport: the comm blocks get rows and put slices
// With at least --procs GPUs, rank r runs on GPU r (link "nvlink": DESIGN.md's benchmark over NVLink
// with IpcTeam); with fewer (or --same-gpu), every process shares GPU 0 (start the MPS daemon so that
// their kernels run concurrently) and the times compare the ways on the same cases; they are not one
// GPU's layer time (link "device"). Each case is timed on every rank (CUDA events, median of --reps
// after --warmup); the record holds the slowest rank's median, since the layer ends when its last rank
// does. --systems adds the sequential baseline (Megatron-style: dispatch, cuBLAS GEMMs, combine; its
// forward, on the same FusedMoe and transport) beside comet.
//
//   comet-bench-ipc [--procs 4] [--models mixtral,deepseek] [--layouts ep4] [--tokens 1024,4096]
//                   [--transports cuda_ipc,nvshmem_heap,nvshmem] [--n-comm tuned,8]
//                   [--layers l0,l1,fwd] [--systems comet,sequential] [--same-gpu] [--reps 20]
//                   [--warmup 3] [--out F.json] [--commit C]
//
// Run plainly it is the parent: it spawns --procs copies of itself (harness/pe_processes.hpp), which
// meet through a Unix-socket rendezvous (the teams' all-gather). Rank 0 writes the JSON records
// (bench/records.hpp, with their `transport`) and a markdown table beside them.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "baselines/baselines.hpp"
#include "bench_routing.hpp"
#include "comet/common.hpp"
#include "comet/fused_moe.hpp"
#include "comet/team.hpp"
#include "device_fill.hpp"
#include "event_timer.hpp"
#include "harness/device_buffer.hpp"
#include "harness/device_random.hpp"
#include "harness/pe_processes.hpp"
#include "harness/socket_rendezvous.hpp"
#include "models.hpp"
#include "records.hpp"

namespace comet::bench {
namespace {

struct IpcOptions {
  int procs = 4;
  std::vector<std::string> models{"mixtral", "deepseek"};
  std::vector<std::string> layouts;  // default: ep<procs>
  std::vector<int> tokens{1024, 4096};
  std::vector<std::string> transports{"cuda_ipc", "nvshmem_heap", "nvshmem"};
  std::vector<std::optional<int>> n_comm{std::nullopt, 8};  // nullopt: the tuner's pick
  std::vector<std::string> layers{"l0", "l1", "fwd"};
  std::vector<std::string> systems{"comet", "sequential"};
  bool same_gpu = false;  // every rank on GPU 0 even where there are more
  int reps = 20, warmup = 3;
  unsigned alarm_s = 570;  // a rank still alive then is ended (the rendezvous and device waits are bounded too)
  std::string out = "bench/results/ipc_transports.json";
  std::string commit;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string p; std::getline(in, p, ',');)
    if (!p.empty()) parts.push_back(p);
  return parts;
}

int to_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const int x = std::stoi(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(detail::concat("comet-bench-ipc: ", flag, " takes integers, got '", v, "'"));
}

IpcOptions parse(int argc, char** argv) {
  IpcOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--same-gpu") {
      o.same_gpu = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "comet-bench-ipc [--procs 4] [--models mixtral,deepseek] [--layouts ep<procs>] [--tokens 1024,4096]\n"
          "                [--transports cuda_ipc,nvshmem_heap,nvshmem] [--n-comm tuned,8] [--layers l0,l1,fwd]\n"
          "                [--systems comet,sequential] [--same-gpu] [--reps 20] [--warmup 3] [--alarm 570]\n"
          "                [--out bench/results/ipc_transports.json] [--commit C]\n"
          "One process per rank (rank r on GPU r where there are enough, else all on GPU 0: start the MPS\n"
          "daemon); the fused layer per transport, and the sequential baseline's forward, side by side.\n");
      std::exit(0);
    }
    COMET_REQUIRE(i + 1 < argc, "comet-bench-ipc: ", flag, " needs a value");
    const std::string v = argv[++i];
    if (flag == "--procs") o.procs = to_int(flag, v);
    else if (flag == "--models") o.models = split(v);
    else if (flag == "--layouts") o.layouts = split(v);
    else if (flag == "--tokens") {
      o.tokens.clear();
      for (const std::string& t : split(v)) o.tokens.push_back(to_int(flag, t));
    } else if (flag == "--transports") o.transports = split(v);
    else if (flag == "--n-comm") {
      o.n_comm.clear();
      for (const std::string& n : split(v)) o.n_comm.push_back(n == "tuned" ? std::nullopt : std::optional<int>(to_int(flag, n)));
    } else if (flag == "--layers") o.layers = split(v);
    else if (flag == "--systems") o.systems = split(v);
    else if (flag == "--reps") o.reps = to_int(flag, v);
    else if (flag == "--warmup") o.warmup = to_int(flag, v);
    else if (flag == "--alarm") o.alarm_s = unsigned(to_int(flag, v));
    else if (flag == "--out") o.out = v;
    else if (flag == "--commit") o.commit = v;
    else throw InvalidArgument(detail::concat("comet-bench-ipc: unknown flag ", flag, " (see the header of bench/ipc_bench.cpp)"));
  }
  COMET_REQUIRE(o.procs >= 2 && o.procs <= 8, "comet-bench-ipc: --procs must be 2..8, got ", o.procs);
  COMET_REQUIRE(o.reps >= 1 && o.warmup >= 0, "comet-bench-ipc: --reps >= 1 and --warmup >= 0");
  if (o.layouts.empty()) o.layouts = {"ep" + std::to_string(o.procs)};
  for (const std::string& l : o.layouts)
    COMET_REQUIRE(parse_layout(l).par.world() == o.procs, "comet-bench-ipc: layout ", l, " is not ", o.procs, " ranks");
  for (const std::string& m : o.models) find_model(m);
  for (const std::string& t : o.transports)
    COMET_REQUIRE(t == "cuda_ipc" || t == "nvshmem_heap" || t == "nvshmem", "comet-bench-ipc: unknown transport ", t,
                  " (cuda_ipc, nvshmem_heap, nvshmem)");
  for (const std::string& l : o.layers)
    COMET_REQUIRE(l == "l0" || l == "l1" || l == "fwd", "comet-bench-ipc: unknown layer ", l, " (l0, l1, fwd)");
  for (const std::string& sys : o.systems)
    COMET_REQUIRE(sys == "comet" || sys == "sequential", "comet-bench-ipc: unknown system ", sys,
                  " (comet, sequential)");
  if (o.commit.empty()) o.commit = std::getenv("COMET_COMMIT") ? std::getenv("COMET_COMMIT") : "unknown";
  return o;
}

// One rank's part of a case: its tokens, routing and weight shard (random, on the device), the layer.
struct RankCase {
  testing::DeviceBuffer x, ids, gates, out, w0, w1;
  RankBatch batch;
  std::unique_ptr<FusedMoe> moe;
  std::unique_ptr<SequentialMoe> seq;  // the sequential baseline on the same layer (--systems sequential)
};

RankCase make_case(IpcTeam& team, const Model& model, const Layout& layout, int tokens, const MoeOptions& options,
                   bool sequential) {
  const MoeShape& shape = model.shape;
  const Parallel& par = layout.par;
  const int rank = team.rank(), H = shape.hidden;
  // Every rank draws every rank's routing from the same seed, and takes its own.
  const testing::RankRouting mine = make_bench_routing(shape, par.world(), tokens, "uniform", 7)[rank];
  RankCase c;
  c.x = testing::DeviceBuffer(size_t(tokens) * H * 2);
  c.out = testing::DeviceBuffer(size_t(tokens) * H * 2);
  c.ids = testing::DeviceBuffer(mine.ids);
  c.gates = testing::DeviceBuffer(mine.gates);
  const size_t e_l = size_t(par.local_experts(shape)), f_s = size_t(par.ffn_shard(shape));
  const size_t n0 = (shape.act == Activation::swiglu ? 2 : 1) * f_s;
  c.w0 = testing::DeviceBuffer(e_l * n0 * H * 2);
  c.w1 = testing::DeviceBuffer(e_l * H * f_s * 2);
  testing::fill_random_bf16(c.x.get(), size_t(tokens) * H, 1.f, 100 + rank);
  testing::fill_random_bf16(c.w0.get(), e_l * n0 * H, 0.02f, 200 + rank);
  testing::fill_random_bf16(c.w1.get(), e_l * H * f_s, 0.02f, 300 + rank);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  c.batch.tokens = tokens;
  c.batch.x = c.x.get();
  c.batch.ids = c.ids.get();
  c.batch.gates = c.gates.as<float>();
  c.batch.out = c.out.get();
  c.moe = std::make_unique<FusedMoe>(team, shape, par, MoeCapacity{tokens, 0}, options);
  if (sequential) {
    c.seq = std::make_unique<SequentialMoe>(*c.moe);
    c.seq->set_weights(rank, c.w0.get(), c.w1.get());  // the FusedMoe's too
  } else {
    c.moe->set_weights(rank, c.w0.get(), c.w1.get());
  }
  return c;
}

struct Measured {
  double median_ms = 0, min_ms = 0, max_ms = 0;  // the slowest rank's median; rank 0's extremes
  int samples = 0;
  int n_comm = -1, n_comm_l1 = -1;  // what the launches used (rank 0)
};

// One layer of one system (comet: `layer` on `stream`; sequential: its forward, on the rank's team
// stream, which it runs on).
Measured time_layer(RankCase& c, const std::string& system, const std::string& layer, const IpcOptions& o,
                    testing::SocketRendezvous& rv, cudaStream_t stream) {
  FusedMoe& moe = *c.moe;
  const std::vector<RankBatch> batch{c.batch};
  std::function<void()> pre = [] {}, fn;
  const int rank = moe.team().local_ranks().front();
  if (system == "sequential") {
    stream = moe.team().stream(rank);
    fn = [&] { c.seq->forward(batch); };
  } else if (layer == "l0") {
    fn = [&] { moe.forward_layer0(batch, stream); };
  } else if (layer == "l1") {  // layer 1 reads what an untimed layer 0 staged
    pre = [&] { moe.forward_layer0(batch, stream); };
    fn = [&] { moe.forward_layer1(batch, stream); };
  } else {
    fn = [&] { moe.forward(batch, stream); };
  }
  EventTimer timer(o.warmup + o.reps);
  const Timing t = timer.measure(stream, o.warmup, o.reps, pre, fn, [&] { moe.sync_and_check(); });
  std::vector<double> medians(o.procs);
  rv.all_gather(&t.median_ms, medians.data(), sizeof(double));
  Measured m;
  m.median_ms = *std::max_element(medians.begin(), medians.end());
  m.min_ms = t.min_ms;
  m.max_ms = t.max_ms;
  m.samples = t.samples;
  if (system == "sequential") return m;
  if (layer != "l1") m.n_comm = moe.last_decision(rank, 0).n_comm;
  if (layer != "l0") (layer == "l1" ? m.n_comm : m.n_comm_l1) = moe.last_decision(rank, 1).n_comm;
  return m;
}

// Rows: case, layer and system (comet with the n_comm asked, or sequential); columns: each transport's
// slowest-rank median (comet: the n_comm used), and its ratio to the first transport's.
std::string markdown(const std::vector<Record>& records, const std::vector<std::string>& transports,
                     const RunInfo& info, int procs, bool shared_gpu) {
  std::ostringstream os;
  os << "# comet-bench-ipc: " << procs << " processes, " << (shared_gpu ? "all on one " : "one per ") << info.gpu
     << " (commit " << info.commit << ")\n\n"
     << "The MoE layer with one process per rank, per way the ranks reach each other's buffers. "
     << (shared_gpu ? "Every process shares the one GPU: the times compare the transports; they are not a "
                      "layer's time on one GPU. "
                    : "")
     << "Slowest rank's median, ms (comet: n_comm used; layer 0 / layer 1 for fwd).\n\n| model | layout | "
        "tokens | layer | system |";
  for (const std::string& t : transports) os << " " << t << " |";
  for (size_t i = 1; i < transports.size(); ++i) os << " " << transports[i] << " / " << transports[0] << " |";
  os << "\n|---|---|---|---|---|";
  for (size_t i = 0; i < 2 * transports.size() - 1; ++i) os << "---|";
  os << "\n";
  std::vector<std::string> order;
  std::map<std::string, std::map<std::string, const Record*>> rows;
  for (const Record& r : records) {
    const std::string system =
        r.system != "comet" ? r.system : r.tuned ? "comet, tuned" : "comet, n_comm " + std::to_string(r.n_comm.value_or(-1));
    const std::string key = r.key.model + " | " + r.key.layout + " | " + std::to_string(r.key.tokens_per_rank) +
                            " | " + r.layer + " | " + system;
    if (!rows.count(key)) order.push_back(key);
    rows[key][r.transport] = &r;
  }
  char buf[64];
  for (const std::string& key : order) {
    os << "| " << key << " |";
    for (const std::string& t : transports) {
      const auto it = rows[key].find(t);
      if (it == rows[key].end()) {
        os << " - |";
        continue;
      }
      const Record& r = *it->second;
      if (r.system == "comet")
        std::snprintf(buf, sizeof(buf), " %.3f (%d%s) |", r.median_ms, r.n_comm.value_or(-1),
                      r.n_comm_l1 ? (" / " + std::to_string(*r.n_comm_l1)).c_str() : "");
      else
        std::snprintf(buf, sizeof(buf), " %.3f |", r.median_ms);
      os << buf;
    }
    const auto base = rows[key].find(transports[0]);
    for (size_t i = 1; i < transports.size(); ++i) {
      const auto it = rows[key].find(transports[i]);
      if (base == rows[key].end() || it == rows[key].end()) {
        os << " - |";
        continue;
      }
      std::snprintf(buf, sizeof(buf), " %.3fx |", it->second->median_ms / base->second->median_ms);
      os << buf;
    }
    os << "\n";
  }
  return os.str();
}

std::string gpu_name(int device) {
  cudaDeviceProp prop{};
  COMET_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

// The record of one measurement; n_comm: what comet was asked (nullopt: the tuner's pick).
Record make_record(const Model& model, const Layout& layout, const std::string& link, int tokens,
                   const std::string& layer, const std::string& system, const std::optional<int>& n_comm,
                   const Measured& m, const RankCase& c, const std::string& transport) {
  Record r;
  r.key = CaseKey{model.name, layout.name, layout.par.world(), layout.par.ep, layout.par.tp, link, tokens, "uniform"};
  r.layer = layer;
  r.system = system;
  r.median_ms = m.median_ms;
  r.min_ms = m.min_ms;
  r.max_ms = m.max_ms;
  r.samples = m.samples;
  if (system == "comet") {
    r.mode = "fused";
    r.n_comm = m.n_comm;
    if (m.n_comm_l1 >= 0) r.n_comm_l1 = m.n_comm_l1;
    r.tuned = !n_comm.has_value();
  }
  r.tile_n = 256;
  r.tokens_cap = tokens;
  r.layer_bytes_per_rank = (long long)c.moe->device_bytes_per_rank();
  r.transport = transport;
  return r;
}

int run_rank(const IpcOptions& o, int rank) {
  int devices = 0;
  COMET_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const bool shared_gpu = o.same_gpu || devices < o.procs;
  const int device = shared_gpu ? 0 : rank;  // rank r on GPU r where there are enough
  const std::string link = shared_gpu ? "device" : "nvlink";
  COMET_CUDA_CHECK(cudaSetDevice(device));
  testing::SocketRendezvous rv(harness::id_path_from_env() + ".sock", rank, o.procs, 120.0);
  cudaStream_t stream = nullptr;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const bool sequential = std::count(o.systems.begin(), o.systems.end(), "sequential") > 0;
  const bool comet = std::count(o.systems.begin(), o.systems.end(), "comet") > 0;
  std::vector<Record> records;
  // One team per heap: CUDA IPC's for cuda_ipc, one NVSHMEM team for both of NVSHMEM's ways.
  for (const SymmetricHeap heap : {SymmetricHeap::cuda_ipc, SymmetricHeap::nvshmem}) {
    std::vector<std::string> here;
    for (const std::string& t : o.transports)
      if ((t == "cuda_ipc") == (heap == SymmetricHeap::cuda_ipc)) here.push_back(t);
    if (here.empty()) continue;
    if (heap == SymmetricHeap::nvshmem && !nvshmem_available()) {
      if (rank == 0) std::printf("NVSHMEM's host library does not load (COMET_NVSHMEM_LIB): its rows are not run\n");
      continue;
    }
    IpcTeam team(rank, o.procs, rv.all_gather_fn(), device, heap);
    team.set_timeout(30.0);
    for (const std::string& transport : here) {
      for (const std::string& model_name : o.models) {
        const Model& model = find_model(model_name);
        for (const std::string& layout_name : o.layouts) {
          const Layout layout = parse_layout(layout_name);
          for (const int tokens : o.tokens) {
            for (size_t ni = 0; ni < o.n_comm.size(); ++ni) {
              const std::optional<int>& n_comm = o.n_comm[ni];
              MoeOptions options;
              options.transport = transport == "nvshmem" ? DeviceTransport::nvshmem : DeviceTransport::peer;
              for (LayerRequest* r : {&options.layer0, &options.layer1}) {
                r->tile_n = 256;  // the NVSHMEM transport's one tile, for every row alike
                r->n_comm = n_comm;
              }
              options.adaptive_split = !n_comm.has_value();
              // The sequential baseline does not depend on n_comm: once per case, beside the first.
              const bool with_seq = sequential && ni == 0;
              RankCase c = make_case(team, model, layout, tokens, options, with_seq);
              std::vector<std::pair<std::string, std::string>> runs;  // (system, layer)
              if (comet)
                for (const std::string& layer : o.layers) runs.push_back({"comet", layer});
              if (with_seq) runs.push_back({"sequential", "fwd"});
              for (const auto& [system, layer] : runs) {
                const Measured m = time_layer(c, system, layer, o, rv, stream);
                records.push_back(make_record(model, layout, link, tokens, layer, system, n_comm, m, c, transport));
                if (rank == 0)
                  std::printf("%-12s %-8s %-6s %5d %-4s %-10s n_comm %-6s %8.3f ms\n", transport.c_str(),
                              model.name.c_str(), layout.name.c_str(), tokens, layer.c_str(), system.c_str(),
                              system != "comet" ? "-" : n_comm ? std::to_string(*n_comm).c_str() : "tuned",
                              m.median_ms);
                std::fflush(stdout);
              }
              c.seq.reset();
              c.moe->close();  // collective: every rank is done with the case's buffers
            }
          }
        }
      }
    }
    team.close();
  }
  COMET_CUDA_CHECK(cudaStreamDestroy(stream));
  if (rank == 0) {
    RunInfo info{gpu_name(device), o.commit};
    COMET_CUDA_CHECK(cudaDeviceGetAttribute(&info.sms, cudaDevAttrMultiProcessorCount, device));
    write_results(o.out, records, info);
    std::string md = o.out;
    const size_t dot = md.rfind(".json");
    md = (dot == std::string::npos ? md : md.substr(0, dot)) + ".md";
    std::ofstream(md) << markdown(records, o.transports, info, o.procs, shared_gpu);
    std::printf("wrote %s and %s\n", o.out.c_str(), md.c_str());
  }
  rv.barrier();
  return 0;
}

}  // namespace
}  // namespace comet::bench

int main(int argc, char** argv) {
  using namespace comet;
  try {
    const bench::IpcOptions o = bench::parse(argc, argv);
    if (const int rank = harness::pe_from_env(); rank >= 0) return bench::run_rank(o, rank);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      std::printf("comet-bench-ipc: no GPU\n");
      return 77;
    }
    // NVSHMEM's heap holds each rank's exported buffers (the receive slots grow with W x tokens); its
    // default of 1 GiB is too small for the larger cases.
    setenv("NVSHMEM_SYMMETRIC_SIZE", "8G", 0);
    const int failed = harness::spawn_pes(o.procs, argv, o.alarm_s);
    if (failed) std::printf("comet-bench-ipc: %d of %d rank processes failed\n", failed, o.procs);
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());  // the messages name the tool
    return 1;
  }
}
