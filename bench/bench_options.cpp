#include "bench_options.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include "comet/common.hpp"

namespace comet::bench {
namespace {

const char* kUsage = R"(comet-bench: per-layer, forward and backward latency of comet's fused MoE layer against cuBLAS
and the sequential / chunked baselines, rank 0 of W virtual ranks on one GPU (LocalTeam).

  --quick                  mixtral + qwen2, ep8, host link, uniform, tokens 1024,4096, n_comm 1,2,4,
                           chunks 2,4 (well under 2 minutes on an H200); later flags still apply
  --models LIST            mixtral,qwen2,phi35,qwen57,deepseek            (default: all)
  --layouts LIST           ep8,tp8,ep4tp2 (any ep<a>tp<b> with a*b = 8)   (default: ep8,tp8,ep4tp2)
  --links LIST             host,device                                    (default: host,device)
  --routings LIST          uniform,zipf1.2,one_expert                     (default: uniform,zipf1.2)
  --tokens LIST            tokens per rank                                (default: 1024,2048,4096,8192,16384)
  --n-comm LIST            comm blocks of comet's fused sweep (0: sequential mode) (default: 1,2,4,8,16,24,32)
  --layers LIST            l0,l1,l2,l3,fwd,bwd,fwd+bwd (l2 / l3: the backward's fused launches, of
                           layer 1 (pull of output gradients + G W1) and of layer 0 (dPre W0 +
                           combine), swept over n_comm like l0 / l1, for comet-tune; bwd: the
                           backward after a training forward; fwd+bwd: both; bwd or fwd+bwd also
                           time the weight-gradient GEMMs alone, layer wgrad; any of l2, l3, bwd,
                           fwd+bwd builds the layer for training)          (default: l0,l1,fwd)
  --systems LIST           cublas,comet,sequential,chunked                (default: all)
  --chunks LIST            chunked baseline's C values                    (default: 2,4,8)
  --chunk-comm-blocks N    blocks of each chunked pull / ship             (default: 16)
  --fused-activation-grad  also comet's backward with BackwardOptions::fused_activation (dPre, g h and
                           the gate partials in the GEMM's epilogue): bwd records of mode fused_act and
                           two_pass (an A/B pair of their own under --paired), a dgrad record with
                           picked_by fused_act
  --standalone-gemms       also time each GEMM that layers 1-3 may run alone (gemm_only, or the
                           sequential schedule's GEMM launch): records of modes gemm_comet, gemm_grouped,
                           gemm_grouped_cooperative, gemm_grouped_160 and gemm_grouped_320 (CUTLASS's) and
                           gemm_cublas (one cublasGemmEx per expert) beside gemm_only (the planner's pick,
                           named in picked_by), for l1-l3 and for dgrad
  --one-launch-ab          with --paired, where the tuned layer 1 takes the sequential schedule with our
                           GEMM: also that schedule the other way (one launch <-> a GEMM launch and a
                           combine launch, LayerRequest::one_launch), in the same rotation as the tuned
                           run and the baseline (l1, fwd): records of mode ab_one_launch_on / _off
  --wgrad-kernel NAME      the GEMM comet's backward makes its weight gradients with: auto (the
                           planner's pick), persistent, grouped, grouped_cooperative or grouped_320
                           (default: auto); either way "wgrad comet" records time each: the persistent
                           kernel (mode gemm_only) and CUTLASS's grouped GEMMs (modes grouped,
                           grouped_cooperative, grouped_320)
  --no-narrow-n-tiles      comet's planner keeps its CUTLASS picks' own tiles where N is narrow
                           (MoeOptions::narrow_n_tiles off: no 128 x 320 substitution), for an A/B run
  --cublas-backward        comet's backward runs its standalone GEMMs (the sequential schedule's) and its
                           weight gradients with cuBLAS (MoeOptions::cublas_backward true), for an A/B run;
  --no-cublas-backward     with comet's kernels (false); default: the planner's rule (<= 2 local experts)
  --check-schedule         comet's layer checks its fused picks against the sequential schedule
                           (MoeOptions::check_schedule); each case first runs the tuned launches until
                           the check has settled (30 untimed forwards, and backwards with bwd), so that
                           the tuned records time its verdicts (picked_by: +checked:pick|sequential)
  --tune-table FILE        comet's tuner table is FILE alone (MoeOptions::tune_table), not the shipped
                           one overlaid by COMET_TUNE_TABLE's; a file with no entries and no models: the
                           cost model's defaults, as on a GPU the table does not know
  --no-adaptive            comet's tuned runs keep the host's pick (MoeOptions::adaptive_split off; by
                           default they re-pick n_comm on the device from the plan and their records
                           give the n_comm the kernel chose; --adaptive: that default, said explicitly)
  --tile-n N               comet's tile 128xN, N in {128, 192, 256, 320}; 192 only with forward layers
                           (l0, l1, fwd: the backward's kernels have no 192), 320 only with --layers l0
                           (layer 0's kernel alone has it)                       (default: 256)
  --dtype T                layer 0's GEMM inputs, bf16 or e4m3 (fp8 tokens and W0 with block scales;
                           cublas / sequential then run cuBLASLt's block-scaled fp8; needs --tile-n 128
                           and no chunked system)                        (default: bf16)
  --m-group N              M-tiles per group in the forced launches' tile order (the sweeps, gemm_only,
                           comm_only; not the tuned runs)                 (default: the planner's rule)
  --tile-order O           wave or m: the order in which the forced fused layer-0 launches (the sweeps)
                           compute their tiles, arrival (wave by wave) or m (expert by expert,
                           LayerRequest::m_order); their records say tile_order m (default: wave)
  --wave-chunk N           an expert's tiles run in chunks of N in layer 0's wave order (MoeOptions::
                           wave_chunk); comet's records say wave_chunk N     (default: the library's:
                           a tuned launch the table's chunk for the case's load class, which its
                           records then say; a forced one the default order)
  --pull-order O           source or expert: the order layer 0's comm blocks pull remote tokens in
                           (MoeOptions::pull_order), for every comet record of the run, which then
                           say pull_order O          (default: the library's, expert; records say nothing)
  --expert-order O         index or size: pulled expert by expert, the experts in index order (the
                           library's) or smallest first (harness/plan_rewrite.hpp rewrites the plan
                           after each prepare); size needs --layers l0 --systems comet, its records say
                           pull_order expert-size      (default: index)
  --tuned-tile             the tuned records (per layer and fwd) let the tuner pick the tile width too
                           (the sweeps keep --tile-n); their records give the width picked
  --reps N                 timed repeats per measurement, median kept     (default: 10, at least 10 for results)
  --warmup N               untimed runs before them (1 for huge cases)    (default: 2)
  --comm-all               time comm_only at every n_comm (default: at the best fused n_comm only)
  --trace DIR              layer 0: after each case's sweep, one launch of each mode and swept n_comm
                           with its timeline stamped (kernels/launch_trace.hpp), as DIR/<case>.json
                           (bench/trace_timeline.py reads them); DIR must exist
  --paired                 at the end of each case, time the tuned comet run and the sequential baseline
                           of each layer (l0, l1, fwd) again, in rotation (reps rounds of one each), and
                           report those times (records marked "paired"): the ratio then does not depend
                           on what ran before each measurement; likewise comet's gemm_only and cuBLAS
                           (l0, l1), each pair in rotation, comet's fused n_comm sweep (all of its
                           points in rotation: the sweep's best is what comet-tune keeps), and comet's
                           bwd and fwd+bwd against the sequential ones (bwd: with the chunked
                           backward at its best C in the same rotation when it ran)
  --mem-limit-gib X        device memory to plan for (default: free memory less 6 GiB)
  --host-limit-gib X       pinned host memory to plan for                 (default: 96)
  --seed N                 routing and data seed                          (default: 1)
  --out PATH               JSON results (default: bench/results/comet_bench_<UTC time>.json); the
                           markdown table is written next to it with the extension .md
  --commit ID              commit id recorded in every result (default: $COMET_COMMIT, else "unknown")
  --estimate               print the cases, the skipped ones and a device-time estimate; run nothing
LISTs are comma-separated.
)";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  COMET_REQUIRE(!out.empty(), "empty list '", s, "'");
  return out;
}

int to_int(const std::string& s, const std::string& flag) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(s, &used);
  } catch (...) {
    used = 0;
  }
  COMET_REQUIRE(used == s.size() && !s.empty(), flag, ": '", s, "' is not an integer");
  return v;
}

std::vector<int> split_ints(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  for (const std::string& item : split(s)) out.push_back(to_int(item, flag));
  return out;
}

void require_subset(const std::vector<std::string>& got, const std::vector<std::string>& allowed, const char* flag) {
  for (const std::string& g : got)
    COMET_REQUIRE(std::find(allowed.begin(), allowed.end(), g) != allowed.end(), flag, ": unknown value '", g, "'");
}

std::string default_out() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  return std::string("bench/results/comet_bench_") + stamp + ".json";
}

}  // namespace

bool BenchOptions::has_layer(const std::string& l) const {
  return std::find(layers.begin(), layers.end(), l) != layers.end();
}
bool BenchOptions::has_system(const std::string& s) const {
  return std::find(systems.begin(), systems.end(), s) != systems.end();
}

BenchOptions parse_options(int argc, char** argv) {
  BenchOptions o;
  std::vector<std::string> args(argv + 1, argv + argc);
  // --quick first, so that the flags given with it refine it.
  if (std::find(args.begin(), args.end(), "--quick") != args.end()) {
    o.quick = true;
    o.models = {"mixtral", "qwen2"};
    o.layouts = {"ep8"};
    o.links = {"host"};
    o.routings = {"uniform"};
    o.tokens = {1024, 4096};
    o.n_comm = {2, 4, 8, 16};
    o.chunks = {2, 4};
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      COMET_REQUIRE(i + 1 < args.size(), a, " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--quick") {
    } else if (a == "--models") {
      o.models = split(value());
    } else if (a == "--layouts") {
      o.layouts = split(value());
    } else if (a == "--links") {
      o.links = split(value());
      require_subset(o.links, {"host", "device"}, "--links");
    } else if (a == "--routings") {
      o.routings = split(value());
      require_subset(o.routings, {"uniform", "zipf1.2", "one_expert"}, "--routings");
    } else if (a == "--tokens") {
      o.tokens = split_ints(value(), a);
    } else if (a == "--n-comm") {
      o.n_comm = split_ints(value(), a);
    } else if (a == "--layers") {
      o.layers = split(value());
      require_subset(o.layers, {"l0", "l1", "l2", "l3", "fwd", "bwd", "fwd+bwd"}, "--layers");
    } else if (a == "--systems") {
      o.systems = split(value());
      require_subset(o.systems, {"cublas", "comet", "sequential", "chunked"}, "--systems");
    } else if (a == "--chunks") {
      o.chunks = split_ints(value(), a);
    } else if (a == "--chunk-comm-blocks") {
      o.chunk_comm_blocks = to_int(value(), a);
    } else if (a == "--dtype") {
      o.dtype = value();
    } else if (a == "--tuned-tile") {
      o.tuned_tile = true;
    } else if (a == "--m-group") {
      o.m_group = to_int(value(), a);
    } else if (a == "--tile-order") {
      const std::string order = value();
      COMET_REQUIRE(order == "wave" || order == "m", "--tile-order must be wave or m, got '", order, "'");
      o.m_order = order == "m";
    } else if (a == "--wave-chunk") {
      o.wave_chunk = to_int(value(), a);
      COMET_REQUIRE(o.wave_chunk >= 1, "--wave-chunk must be >= 1, got ", o.wave_chunk);
    } else if (a == "--pull-order") {
      const std::string order = value();
      COMET_REQUIRE(order == "source" || order == "expert", "--pull-order must be source or expert, got '", order, "'");
      o.pull_order = order == "expert" ? PullOrder::expert : PullOrder::source;
    } else if (a == "--expert-order") {
      const std::string order = value();
      COMET_REQUIRE(order == "index" || order == "size", "--expert-order must be index or size, got '", order, "'");
      o.expert_by_size = order == "size";
    } else if (a == "--tile-n") {
      o.tile_n = to_int(value(), a);
    } else if (a == "--reps") {
      o.reps = to_int(value(), a);
    } else if (a == "--warmup") {
      o.warmup = to_int(value(), a);
    } else if (a == "--comm-all") {
      o.comm_all = true;
    } else if (a == "--trace") {
      o.trace_dir = value();
    } else if (a == "--paired") {
      o.paired = true;
    } else if (a == "--mem-limit-gib") {
      o.mem_limit_gib = std::stod(value());
    } else if (a == "--host-limit-gib") {
      o.host_limit_gib = std::stod(value());
    } else if (a == "--seed") {
      o.seed = std::stoull(value());
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--commit") {
      o.commit = value();
    } else if (a == "--adaptive") {
      o.adaptive = true;
    } else if (a == "--no-narrow-n-tiles") {
      o.narrow_n_tiles = false;
    } else if (a == "--cublas-backward") {
      o.cublas_backward = true;
    } else if (a == "--no-cublas-backward") {
      o.cublas_backward = false;
    } else if (a == "--no-adaptive") {
      o.adaptive = false;
    } else if (a == "--check-schedule") {
      o.check_schedule = true;
    } else if (a == "--tune-table") {
      o.tune_table = value();
    } else if (a == "--fused-activation-grad") {
      o.fused_activation_grad = true;
    } else if (a == "--standalone-gemms") {
      o.standalone_gemms = true;
    } else if (a == "--one-launch-ab") {
      o.one_launch_ab = true;
    } else if (a == "--wgrad-kernel") {
      const std::string name = value();
      const std::optional<WeightGradKernel> k = weight_grad_kernel_named(name);
      if (!k) throw InvalidArgument(detail::concat("--wgrad-kernel: ", enum_names(kWeightGradKernels), ", got '", name, "'"));
      o.wgrad_kernel = *k;
    } else if (a == "--estimate") {
      o.estimate_only = true;
    } else {
      throw InvalidArgument(detail::concat("unknown flag '", a, "' (see --help)"));
    }
  }
  for (int t : o.tokens) COMET_REQUIRE(t >= 1, "--tokens: values must be >= 1");
  for (int n : o.n_comm) COMET_REQUIRE(n >= 0, "--n-comm: values must be >= 0 (0: FusedMoe's sequential mode)");
  for (int c : o.chunks) COMET_REQUIRE(c >= 1, "--chunks: values must be >= 1");
  COMET_REQUIRE(o.tile_n == 128 || o.tile_n == 192 || o.tile_n == 256 || o.tile_n == 320,
                "--tile-n must be 128, 192, 256 or 320");
  COMET_REQUIRE(o.tile_n != 192 || !o.has_backward(), "--tile-n 192 is a forward shape: give --layers from l0,l1,fwd");
  COMET_REQUIRE(o.tile_n != 320 || (o.layers.size() == 1 && o.has_layer("l0") && o.dtype == "bf16"),
                "--tile-n 320 is layer 0's only (bf16): give --layers l0");
  COMET_REQUIRE(o.dtype == "bf16" || o.dtype == "e4m3", "--dtype must be bf16 or e4m3, got '", o.dtype, "'");
  COMET_REQUIRE(o.dtype == "bf16" || (o.tile_n == 128 && !o.has_system("chunked") && !o.has_backward()),
                "--dtype e4m3 needs --tile-n 128 (the fp8 kernel's one tile), --systems without chunked and a "
                "forward only (no l2, l3, bwd)");
  COMET_REQUIRE(o.m_group >= 0, "--m-group must be >= 0 (0: the planner's rule)");
  COMET_REQUIRE(o.reps >= 1 && o.warmup >= 0, "--reps must be >= 1 and --warmup >= 0");
  COMET_REQUIRE(!o.check_schedule || o.adaptive, "--check-schedule checks the tuner's requests: not with --no-adaptive "
                "(which forces each decision's n_comm, and a forced n_comm is not checked)");
  COMET_REQUIRE(o.chunk_comm_blocks >= 1, "--chunk-comm-blocks must be >= 1");
  if (o.expert_by_size) {  // an experiment on the layer-0 sweep: the rewrite follows its prepares only
    COMET_REQUIRE(o.layers == std::vector<std::string>{"l0"} && o.systems == std::vector<std::string>{"comet"} &&
                      !o.pull_order && o.wave_chunk == 0,
                  "--expert-order size needs --layers l0 --systems comet, and no --pull-order or --wave-chunk");
    o.pull_order = PullOrder::expert;
    o.wave_chunk = 1;  // no chunk rule: a launch never re-orders the rewritten plan (MoeEngine::layer0)
  }
  std::sort(o.tokens.begin(), o.tokens.end());
  o.tokens.erase(std::unique(o.tokens.begin(), o.tokens.end()), o.tokens.end());
  if (o.out.empty()) o.out = default_out();
  if (o.commit.empty()) {
    const char* env = std::getenv("COMET_COMMIT");
    o.commit = env && *env ? env : "unknown";
  }
  return o;
}

}  // namespace comet::bench
