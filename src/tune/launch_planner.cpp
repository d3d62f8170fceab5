// The launch planner (launch_planner.hpp): every rule that shapes a fused launch, in one place.
#include "tune/launch_planner.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "comet/common.hpp"
#include "kernels/fused_layers.hpp"  // the compiled tile widths

namespace comet {

namespace {

constexpr int kTileM = 128;     // every compiled tile is 128 rows (the plan's tile_m)
constexpr int kMaxGroup = 1024;  // m_group / n_group: far above any useful value, far below int overflow

// Whether a width is compiled for the launch and the transport (layer 0's 320 is not over NVSHMEM).
bool is_compiled_tile(int layer, int tile_n, DType dtype, const PlannerPolicy& policy) {
  return (tile_n != 320 || policy.layer0_tile_320) && kernels::is_supported_tile_n(tile_n, layer, dtype);
}

// "128, 192 or 256": the widths is_compiled_tile accepts, for the message that refuses another one.
std::string compiled_tiles(int layer, DType dtype, const PlannerPolicy& policy) {
  std::vector<int> widths;
  for (int t : {128, 192, 256, 320})
    if (is_compiled_tile(layer, t, dtype, policy)) widths.push_back(t);
  std::string s;
  for (size_t i = 0; i < widths.size(); ++i)
    s += (i == 0 ? "" : i + 1 < widths.size() ? ", " : " or ") + std::to_string(widths[i]);
  return s;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace

LaunchPlanner::LaunchPlanner(const MoeShape& shape, const Parallel& par, Link link, DeviceCaps caps, TuneTable table,
                             PlannerPolicy policy)
    : shape_(shape), par_(par), link_(link), caps_(std::move(caps)), table_(std::move(table)), policy_(policy) {}

TuneKey LaunchPlanner::key(int layer, int tokens, int load) const {
  TuneKey k;
  k.gpu = caps_.gpu;
  k.sms = caps_.sms;
  k.layer = layer;
  k.hidden = shape_.hidden;
  k.ffn = shape_.ffn;
  k.experts = shape_.num_experts;
  k.topk = shape_.topk;
  k.world = par_.world();
  k.ep = par_.ep;
  k.tp = par_.tp;
  k.link = link_;
  k.tokens_bucket = tokens_bucket(tokens);
  k.load = load;
  k.dtype = to_string(launch_dtype(layer));
  return k;
}

int LaunchPlanner::resident_blocks(int layer, int tile_n) const {
  const auto id = std::make_pair(layer, tile_n);
  if (const auto it = resident_.find(id); it != resident_.end()) return it->second;
  return resident_[id] = caps_.resident_blocks(layer, tile_n);
}

const PlannedLaunch& LaunchPlanner::plan(int layer, LayerMode mode, int tokens, const LayerRequest& request) const {
  const Key id{layer, int(mode), tokens, request.tile_n.value_or(-1), request.n_comm.value_or(-1),
               request.m_group.value_or(-1), request.n_group.value_or(-1),
               request.standalone_gemm ? int(*request.standalone_gemm) : -1,
               request.one_launch ? int(*request.one_launch) : -1, request.m_order ? int(*request.m_order) : -1};
  if (const auto it = memo_.find(id); it != memo_.end()) return it->second;
  // A bound on the memo for callers whose token count changes every step (a few kB per entry).
  if (memo_.size() >= 4096) memo_.clear();
  return memo_.emplace(id, decide(layer, mode, tokens, request)).first->second;
}

PlannedLaunch LaunchPlanner::decide(int layer, LayerMode mode, int tokens, const LayerRequest& request) const {
  static const char* const names[kLaunchLayers] = {"layer 0", "layer 1", "backward of layer 1", "backward of layer 0"};
  COMET_REQUIRE(layer >= 0 && layer < kLaunchLayers, "launch planner: layer must be 0..3, got ", layer);
  const char* name = names[layer];
  const DType dtype = launch_dtype(layer);
  COMET_REQUIRE(!request.tile_n || is_compiled_tile(layer, *request.tile_n, dtype, policy_), "FusedMoe ", name,
                dtype == DType::e4m3 ? " in fp8" : "", ": tile_n must be ", compiled_tiles(layer, dtype, policy_),
                ", got ", request.tile_n.value_or(0));
  COMET_REQUIRE(!request.n_comm || *request.n_comm >= 0, "FusedMoe ", name, ": n_comm must be >= 0, got ",
                request.n_comm.value_or(0));
  COMET_REQUIRE(!request.m_group || (*request.m_group >= 1 && *request.m_group <= kMaxGroup), "FusedMoe ", name,
                ": m_group must be in [1, ", kMaxGroup, "], got ", request.m_group.value_or(0));
  COMET_REQUIRE(!request.n_group || (*request.n_group >= 1 && *request.n_group <= kMaxGroup), "FusedMoe ", name,
                ": n_group must be in [1, ", kMaxGroup, "], got ", request.n_group.value_or(0));
  COMET_REQUIRE(!request.m_order.value_or(false) || layer == 0, "FusedMoe ", name,
                ": m_order applies to layer 0's fused launch only");

  const int picked_tokens = std::max(1, tokens);
  LayerVariant v;
  LaunchDecision d;
  d.layer = layer;
  d.mode = mode;
  if (request.tile_n && request.n_comm) {
    v = LayerVariant{*request.tile_n, *request.n_comm, request.m_group.value_or(0), request.n_group.value_or(1),
                     request.standalone_gemm.value_or(StandaloneGemm::comet), request.one_launch.value_or(false)};
    d.picked_by = "forced";
  } else {
    const LayerWork work = expected_work(shape_, par_, layer, picked_tokens, request.tile_n.value_or(256), dtype);
    LayerRequest r = request;
    // Batch-invariant results: the table may pick a different tile per token bucket, and a tile shape
    // can change a row's rounding; the cost model's shape depends on the layer's N alone.
    if (policy_.batch_invariant && !r.tile_n) r.tile_n = model().best_tile_n(work);
    if (dtype == DType::e4m3) r.tile_n = 128;  // the one fp8 tile (kernels::Fp8Layer0Tiles)
    const TunedVariant t = pick_variant(table_, key(layer, picked_tokens), work, r);
    v = t.variant;
    d.picked_by = t.picked_by;
    // cuBLAS picks its kernel by the rows it is given, so a token's bits would follow its expert's load.
    if (policy_.batch_invariant && !r.standalone_gemm && v.standalone_gemm == StandaloneGemm::cublas)
      v.standalone_gemm = StandaloneGemm::comet;
    // A transport without layer 0's 320-wide kernel runs a table's 320 pick on the widest one it has.
    if (v.tile_n == 320 && !policy_.layer0_tile_320 && !r.tile_n) v.tile_n = 256;
    COMET_REQUIRE(is_compiled_tile(layer, v.tile_n, dtype, policy_), "FusedMoe ", name,
                  ": the tuner's table asks for tile_n ", v.tile_n, ", which is not compiled");
    if (!request.n_comm) {
      // The pick must leave compute blocks on this device (a table from another GPU could ask for more);
      // with one rank a pull (layer 0, the backward of layer 1) has nothing to pull.
      v.n_comm = std::min(v.n_comm, resident_blocks(layer, v.tile_n) - 1);
      if (par_.world() == 1 && comm_kind(layer) == 0) v.n_comm = 0;
    }
  }
  d.tile_n = v.tile_n;
  d.resident_blocks = resident_blocks(layer, v.tile_n);
  COMET_REQUIRE(v.n_comm >= 0, "FusedMoe ", name, ": n_comm must be >= 0, got ", v.n_comm, " (", d.picked_by, ")");
  COMET_REQUIRE(mode == LayerMode::gemm_only || v.n_comm < d.resident_blocks, "FusedMoe ", name, ": n_comm ",
                v.n_comm, " leaves no compute block (", d.resident_blocks, " resident blocks)");
  COMET_REQUIRE(v.m_group >= 0 && v.m_group <= kMaxGroup && v.n_group >= 1 && v.n_group <= kMaxGroup, "FusedMoe ",
                name, ": m_group ", v.m_group, " / n_group ", v.n_group, " out of range (", d.picked_by, ")");
  d.n_comm = v.n_comm;
  d.schedule = mode == LayerMode::fused && v.n_comm == 0 ? Schedule::sequential : Schedule::fused;
  d.n_group = v.n_group;
  // A combine layer's GEMM with no comm blocks beside it (gemm_only, or the sequential schedule's GEMM)
  // has no column order to keep: half the column blocks per group, so that a wave is a block of about
  // 16 M-tiles x 8 column blocks and reads A and B about equally often from HBM. One column block at a
  // time (n_group 1, what a combine in flight wants) reads all of A once per column block: Phi-3.5 TP 8
  // layer 1 at 16384 tokens ran at 72 % of cuBLAS that way.
  if (comm_kind(layer) == 1 && !request.n_group && (mode == LayerMode::gemm_only || d.schedule == Schedule::sequential))
    d.n_group = std::max(1, ceil_div(ceil_div(row_work(shape_, par_, layer).gemm_n, d.tile_n), 2));
  d.m_group = v.m_group > 0 ? v.m_group : m_group_rule(layer, mode, tokens, d);
  // Layer 0's GEMM applies the activation in its epilogue: always ours (the request's field is for the
  // launches that have a plain product, as the fused schedule's is for the comm blocks beside it).
  if (layer != 0 && (mode == LayerMode::gemm_only || d.schedule == Schedule::sequential))
    d.standalone_gemm = v.standalone_gemm;  // the request's, else the table entry's, else ours
  // A table's 128 x 160 pick runs as it is: on CuTe's 160-wide wgmma atoms it leads 128 x 320 at both
  // narrow N (Qwen2-57B TP 8's 320: 1.06-1.07x; Phi-3.5 TP 8's 800: 1.18-1.24x; H100,
  // bench/results/h100_integ_6ecc67c/probe.json), so narrow_n_tiles no longer widens it.
  // A combine launch's sequential schedule with our GEMM may run as one launch (the GEMM, then the
  // combine, in the same blocks): the request's choice, else the table entry's. CUTLASS's GEMMs are
  // launches of their own.
  d.one_launch = comm_kind(layer) == 1 && mode == LayerMode::fused && d.schedule == Schedule::sequential &&
                 d.standalone_gemm == StandaloneGemm::comet && v.one_launch;
  // Only a launch whose compute blocks wait for rows has an arrival order to leave.
  d.m_order = request.m_order.value_or(false) && mode == LayerMode::fused && d.schedule == Schedule::fused;

  PlannedLaunch p;
  p.decision = d;
  // The kernel re-picks n_comm only where the tuner chose it and the launch has comm blocks inside the
  // GEMM (the sequential schedule is a host-side choice).
  if (policy_.adaptive_split && mode == LayerMode::fused && !request.n_comm && d.n_comm > 0) {
    p.adapt = adaptive_split(layer, picked_tokens, d);
    p.decision.adaptive = true;
  }
  return p;
}

// m_group, when nobody set it: about one wave of work items (m_group x column blocks ~ compute blocks),
// and more where the layer has many M-tiles, so that B crosses HBM (M-tiles / m_group) times rather than
// once per wave (docs/design-changes.md has the measurements).
//  * Without waits (gemm_only, comm_only, layer 0's GEMM in the sequential schedule): at least as many
//    M-tiles as a quarter of L2 holds of A.
//  * Fused layer 0 (groups follow arrival): the L2 rule made blocks wait on tiles that had not arrived,
//    so the group also stays under 1/16 of the expected M-tiles. Fused layer 1: one wave (its comm
//    blocks ship column groups as they finish).
int LaunchPlanner::m_group_rule(int layer, LayerMode mode, int tokens, const LaunchDecision& d) const {
  const int compute_blocks = d.resident_blocks - d.n_comm;
  const LayerWork row = row_work(shape_, par_, layer, launch_dtype(layer));
  const bool pull = row.layer == 0;  // the comm kind: a pull (layers 0, 2) or a combine (1, 3)
  const int gemm_k = int(row.flops / (2.0 * row.gemm_n));
  const int blocks_per_m_tile =
      pull ? ceil_div(row.gemm_n, d.tile_n) : std::min(d.n_group, ceil_div(row.gemm_n, d.tile_n));
  // A's rows as the GEMM reads them: a pull's A holds the rows it moved (bf16 rows of H, or layer 0's e4m3
  // records: codes and scales), a combine's bf16 rows of K.
  const size_t a_row_bytes = pull ? size_t(row.row_bytes) : size_t(gemm_k) * 2;
  const size_t a_tile_bytes = size_t(kTileM) * a_row_bytes;
  const int wave = ceil_div(compute_blocks, std::max(1, blocks_per_m_tile));
  const int l2_fit = int(caps_.l2_bytes / 4 / std::max<size_t>(1, a_tile_bytes));
  const bool fused_rule = mode == LayerMode::fused && (!pull || d.n_comm > 0);
  const int expected_m_tiles = pull ? int(expected_rows(shape_, par_, tokens) / kTileM) : 0;
  const int larger = fused_rule ? std::min(l2_fit, expected_m_tiles / 16) : l2_fit;
  return std::clamp(std::max(wave, larger), 1, 16);
}

// What the kernel needs to re-pick n_comm from the batch's plan (adaptive_split.hpp): the table's pick
// per load class for this tile (only entries with comm blocks: the sequential schedule is another
// launch), layer 0's wave chunk of those entries, and the cost model of this device.
AdaptiveSplit LaunchPlanner::adaptive_split(int layer, int tokens, const LaunchDecision& d) const {
  int by_load[kLoadClasses] = {}, chunk_by_load[kLoadClasses] = {};
  for (int c = 1; c < kLoadClasses; ++c) {
    const TuneEntry* e = table_.find(key(layer, tokens, 1 << c));
    if (e && e->variant.tile_n == d.tile_n && e->variant.n_comm > 0) {
      by_load[c] = std::min(e->variant.n_comm, d.resident_blocks - 1);
      chunk_by_load[c] = layer == 0 ? e->variant.wave_chunk : 0;  // the plan is ordered for layer 0
    }
  }
  AdaptiveSplit a = make_adaptive_split(shape_, par_, layer, tokens, model(), caps_.sms, d.tile_n, d.n_comm, nullptr,
                                        by_load, launch_dtype(layer));
  std::copy(chunk_by_load, chunk_by_load + kLoadClasses, a.chunk_by_load);
  return a;
}

// The weight-gradient GEMM by shape. Measured on the H200 (bench/results/h200_bwd_wgrad_kernels_0bf5199.json,
// 16 cases: 4 models x EP 8 / TP 8 x 1024 / 16384 tokens; the three kernels give the same bits):
//  * CUTLASS's ping-pong grouped GEMM (128 x 128 tiles) hides one warp group's fp32 store under the other's
//    mainloop; that store is a large share of a tile where K (an expert's rows) is short. It won by 5-15 %
//    at up to 2048 rows per expert, except with one local expert (Mixtral EP 8: +3 %) and with shards of
//    F below 512 (Qwen2 TP 8, F/8 = 176: +26 %). At 8192 rows and more it lost 3-50 %.
//  * The cooperative grouped GEMM (128 x 256 tiles, 2 x 1 clusters with TMA multicast) won by 4-15 % at
//    4096 rows and more with H >= 4096 (DeepSeek-V3, Mixtral EP 8; Phi-3.5 even), lost 4-5 % at H 2048.
//    On the H100 (2026-12-06, bench/results/h100_narrow_tail_7dc1f76/bwd_{old,new}.json, two runs) it also
//    won at H = 3584, which the H200 runs had no model with: Qwen2-57B at 4096 and 16384 rows per expert,
//    by 0.3-4.6 % on EP 8 and 3.3 % / 22 % on TP 8 (14.2 against 18.3 ms at 16384 tokens). So H >= 3072.
//  * Our persistent kernel otherwise.
// A measured pick in the table (kWeightGradLaunch keys, comet-tune --wgrad-runs) comes first: on the
// H100 the rule missed the fastest kernel in 10 of 29 backward cases, by up to 11 % of the weight
// gradients' time and 3.4 % of the backward's (Qwen2 TP 8 at 16384 tokens: ours 2.63 against the
// cooperative kernel's 2.37 ms; bench/results/h100_gemm_order_b5052c0/bwd_shipped.json). The GEMM has no
// comm, so an entry of either link serves.
// cuBLAS for the backward's GEMMs that have no comm beside them (MoeOptions::cublas_backward): one
// cublasGemmEx per expert pays where a rank has few, large experts, and loses to one grouped launch where
// it has many. On the H100 (2026-12-07, device link, 29 backward cases, on against off in one call,
// bench/results/h100_cublas_backward_6ecc67c/): 1 local expert (Mixtral EP 8) 0.94-0.96 of the time,
// 2 (Phi-3.5 EP 8) 0.88-0.98; 7-8 (Qwen2 / Qwen2-57B EP 8, Mixtral TP 8) 0.97-1.23, 16-256 (TP 8) up to
// 2.7x slower. So on where a rank has at most 2 local experts.
bool LaunchPlanner::cublas_backward(std::optional<bool> requested) const {
  return requested.value_or(par_.local_experts(shape_) <= 2);
}

WeightGradKernel LaunchPlanner::picked_weight_grad_tiles(WeightGradKernel k, int n) const {
  if (k != WeightGradKernel::grouped_cooperative && k != WeightGradKernel::grouped_320) return k;
  return policy_.narrow_n_tiles && prefers_320_tiles(n) ? WeightGradKernel::grouped_320
                                                        : WeightGradKernel::grouped_cooperative;
}

WeightGradKernel LaunchPlanner::weight_grad_kernel(int tokens, WeightGradKernel requested, int n) const {
  if (requested != WeightGradKernel::automatic) return requested;
  TuneKey k = key(kWeightGradLaunch, tokens);
  for (Link link : {link_, link_ == Link::host ? Link::device : Link::host}) {
    k.link = link;
    if (const TuneEntry* e = table_.find(k); e && e->variant.weight_grad != WeightGradKernel::automatic)
      return picked_weight_grad_tiles(e->variant.weight_grad, n);
  }
  const int local_experts = par_.local_experts(shape_);
  const double rows_per_expert = expected_rows(shape_, par_, tokens) / local_experts;
  if (rows_per_expert <= 2048 && local_experts >= 2 && par_.ffn_shard(shape_) >= 512) return WeightGradKernel::grouped;
  if (rows_per_expert >= 4096 && shape_.hidden >= 3072)
    return picked_weight_grad_tiles(WeightGradKernel::grouped_cooperative, n);
  return WeightGradKernel::persistent;
}

}  // namespace comet
