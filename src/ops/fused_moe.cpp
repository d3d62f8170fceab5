// FusedMoe: buffers, validation and the launch sequence of the fused MoE layer (see fused_moe.hpp).
#include "comet/fused_moe.hpp"

#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "comet/cuda_check.hpp"
#include "kernels/fused_layers.hpp"
#include "kernels/local_rows.hpp"

namespace comet {

namespace {

constexpr int kTileM = kernels::kTileM;

int round_up(long long v, int to) { return int((v + to - 1) / to * to); }

int default_rows(const MoeShape& s, const Parallel& p, int max_tokens) {
  const int el = p.local_experts(s);
  const long long rows = (long long)p.world() * max_tokens * std::min(s.topk, el) + (long long)el * (kTileM - 1);
  COMET_REQUIRE(rows < (1LL << 31) - kTileM, "FusedMoe: the worst-case gathered buffer has ", rows,
                " rows; give MoeCapacity::max_rows_per_rank explicitly");
  return round_up(std::max(rows, 1LL), kTileM);
}

// tile_n 0 (the tuner picks the shape) is allowed in options, not at launch.
void validate_variant(const LayerVariant& v, int layer, bool allow_auto_tile = false) {
  COMET_REQUIRE(kernels::is_supported_tile_n(v.tile_n, layer) || (allow_auto_tile && v.tile_n == 0), "FusedMoe layer ",
                layer, ": tile_n must be 128", layer == 0 ? ", 192" : "", " or 256",
                allow_auto_tile ? " (or 0: the tuner picks)" : "", ", got ", v.tile_n);
  COMET_REQUIRE(v.m_group >= 0 && v.n_group >= 1, "FusedMoe layer ", layer, ": m_group must be >= 0, n_group >= 1");
}

kernels::EpilogueOp activation_op(Activation a) {
  switch (a) {
    case Activation::swiglu: return kernels::EpilogueOp::swiglu;
    case Activation::gelu: return kernels::EpilogueOp::gelu;
    case Activation::silu: return kernels::EpilogueOp::silu;
  }
  return kernels::EpilogueOp::none;
}

// m_group 0: about one wave of work items (m_group x column blocks ~ compute blocks), and more where the
// layer has many M-tiles, so that B crosses HBM (M-tiles / m_group) times rather than once per wave
// (Mixtral ep8: a 235 MB expert, 112 column blocks, one wave = 2 M-tiles; at 16384 tokens the GEMM
// ran at 554 TFLOP/s re-reading it every 256 rows, 623-671 with larger groups).
//  * Without waits (gemm_only: every row present, tiles in m order): at least as many M-tiles as a
//    quarter of L2 holds of A.
//  * Fused (groups follow arrival): the L2 rule made its blocks wait on tiles that had not arrived
//    (fb5687d against 2ceb628: layer 0 up to 1.37x slower at 1024 tokens), so the group also stays
//    under 1/16 of the expected M-tiles: one wave at 1024 tokens, the L2 rule's 15 at 16384 (Mixtral
//    ep8; H200 probes of the fused layer 0 in docs/design-changes.md: never slower, up to 13 % faster).
int auto_m_group(int m_group, int compute_blocks, int blocks_per_m_tile, size_t a_tile_bytes, size_t l2_bytes,
                 bool fused_kernel, int expected_m_tiles) {
  if (m_group > 0) return m_group;
  const int wave = (compute_blocks + blocks_per_m_tile - 1) / std::max(1, blocks_per_m_tile);
  const int l2_fit = int(l2_bytes / 4 / std::max<size_t>(1, a_tile_bytes));
  const int larger = fused_kernel ? std::min(l2_fit, expected_m_tiles / 16) : l2_fit;
  return std::clamp(std::max(wave, larger), 1, 16);
}

// A rank's adaptive splits by (layer, tile_n, host n_comm, tokens): everything a split holds follows
// from those and the FusedMoe, so a launch builds it once and then finds it in a hash lookup.
using AdaptiveSplits = std::unordered_map<uint64_t, kernels::AdaptiveSplit>;

// What a fused launch needs to re-pick n_comm on the device (kernels/adaptive_split.hpp): only in fused
// mode, when the caller let the tuner pick n_comm and the pick has comm blocks (sequential mode stays).
kernels::AdaptiveSplit adaptive_split_for(const FusedMoe& moe, int layer, LayerMode mode, int tokens,
                                          const LayerVariant& requested, const LayerVariant& v, int32_t* chosen,
                                          AdaptiveSplits& memo) {
  if (!moe.options().adaptive_split || mode != LayerMode::fused || requested.n_comm >= 0 || v.n_comm <= 0) return {};
  tokens = std::max(1, tokens);
  const uint64_t id = (uint64_t(layer) << 56) | (uint64_t(v.tile_n) << 44) | (uint64_t(v.n_comm) << 32) | uint64_t(tokens);
  if (const auto it = memo.find(id); it != memo.end()) return it->second;
  const TuneKey key = moe.tune_key(layer, tokens);
  const std::array<int, kLoadClasses> by_load = moe.load_picks(layer, tokens, v.tile_n);
  return memo.emplace(id, kernels::make_adaptive_split(moe.shape(), moe.parallel(), layer, tokens,
                                                       moe.tune_table().model(key.gpu, key.link), key.sms, v.tile_n,
                                                       v.n_comm, chosen, by_load.data()))
      .first->second;
}

bool checking_from_env() {
  const char* v = std::getenv("COMET_CHECK");
  return v && std::string(v) == "1";
}

}  // namespace

struct FusedMoe::RankState {
  int rank = 0;
  cudaStream_t stream = nullptr;
  DevicePlan plan;
  void* a = nullptr;             // [rows_cap][H]
  void* hid = nullptr;           // [rows_cap][F_s]
  void* y = nullptr;             // [rows_cap][H]
  void* self_partial = nullptr;  // [T_cap][H]
  int32_t* tile_ready = nullptr;    // [max_tiles]
  int32_t* tile_arrived = nullptr;  // [max_tiles]
  int32_t* tile_done = nullptr;     // [max_tiles * ceil(H / 128)]
  int32_t* epoch = nullptr;
  int32_t* chosen_n_comm = nullptr;  // [2] the adaptive split's pick of the last fused launch per layer
  int last_n_comm[2] = {0, 0};      // the host's n_comm of the last launch per layer
  bool last_adapted[2] = {false, false};
  AdaptiveSplits adaptive_splits;  // built once per (layer, tile_n, host n_comm, tokens)
  const void* w0 = nullptr;
  const void* w1 = nullptr;
  const void* x = nullptr;  // the staged batch's tokens (device)
  int tokens = 0;
  std::vector<void*> owned;

  void* alloc(size_t bytes) {
    void* p = nullptr;
    COMET_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    COMET_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(bytes, 16)));
    owned.push_back(p);
    return p;
  }
  ~RankState() {
    for (void* p : owned) cudaFree(p);
  }
};

FusedMoe::FusedMoe(Team& team, const MoeShape& shape, const Parallel& par, const MoeCapacity& cap,
                   const MoeOptions& options)
    : team_(team), shape_(shape), par_(par), cap_(cap), options_(options) {
  validate(shape_, par_);
  COMET_REQUIRE(team_.world() == par_.world(), "FusedMoe: the team has ", team_.world(), " ranks but ep x tp = ",
                par_.ep, " x ", par_.tp, " = ", par_.world());
  COMET_REQUIRE(par_.ep <= 32, "FusedMoe: ep > 32 is not supported (got ", par_.ep, ")");
  COMET_REQUIRE(cap_.max_tokens_per_rank > 0, "FusedMoe: MoeCapacity::max_tokens_per_rank must be positive");
  COMET_REQUIRE(cap_.max_rows_per_rank >= 0, "FusedMoe: MoeCapacity::max_rows_per_rank must be >= 0");
  cap_.max_rows_per_rank = cap_.max_rows_per_rank == 0 ? default_rows(shape_, par_, cap_.max_tokens_per_rank)
                                                       : round_up(cap_.max_rows_per_rank, kTileM);
  validate_variant(options_.layer0, 0, true);
  validate_variant(options_.layer1, 1, true);
  COMET_REQUIRE(options_.dispatch_store_lag == 1 || options_.dispatch_store_lag == 2 ||
                    options_.dispatch_store_lag == 4 || options_.dispatch_store_lag == 8,
                "FusedMoe: dispatch_store_lag must be 1, 2, 4 or 8");
  options_.checking = options_.checking || checking_from_env();
  table_ = TuneTable::load(options_.tune_table.empty() ? TuneTable::default_path() : options_.tune_table);
  {
    cudaDeviceProp prop{};
    COMET_CUDA_CHECK(cudaGetDeviceProperties(&prop, team_.device()));
    gpu_name_ = prop.name;
    sms_ = prop.multiProcessorCount;
    l2_bytes_ = size_t(prop.l2CacheSize);
  }

  const int H = shape_.hidden, T = cap_.max_tokens_per_rank, W = par_.world();
  const size_t row_bytes = size_t(H) * 2;
  x_sym_ = team_.alloc_symmetric(size_t(T) * row_bytes);
  routing_sym_ = team_.alloc_symmetric(RoutingBufferLayout{T, shape_.topk}.bytes());
  recv_sym_ = team_.alloc_symmetric(size_t(W) * T * row_bytes);

  const int rows = cap_.max_rows_per_rank;
  const int max_tiles = rows / kTileM;
  const int max_n_blocks = (H + 127) / 128;
  for (int r : team_.local_ranks()) {
    auto s = std::make_unique<RankState>();
    s->rank = r;
    s->stream = team_.stream(r);
    COMET_CUDA_CHECK(cudaSetDevice(team_.device()));
    s->plan = DevicePlan(PlanConfig{shape_, par_, r, kTileM, PlanCapacity{T, rows}});
    s->a = s->alloc(size_t(rows) * row_bytes);
    s->hid = s->alloc(size_t(rows) * par_.ffn_shard(shape_) * 2);
    s->y = s->alloc(size_t(rows) * row_bytes);
    s->self_partial = s->alloc(size_t(T) * row_bytes);
    s->tile_ready = static_cast<int32_t*>(s->alloc(size_t(max_tiles) * 4));
    s->tile_arrived = static_cast<int32_t*>(s->alloc(size_t(max_tiles) * 4));
    s->tile_done = static_cast<int32_t*>(s->alloc(size_t(max_tiles) * max_n_blocks * 4));
    s->epoch = static_cast<int32_t*>(s->alloc(4));
    s->chosen_n_comm = static_cast<int32_t*>(s->alloc(2 * 4));
    ranks_.push_back(std::move(s));
  }
}

FusedMoe::~FusedMoe() = default;

FusedMoe::RankState& FusedMoe::state(int rank) const {
  for (const auto& s : ranks_)
    if (s->rank == rank) return *s;
  throw InvalidArgument(detail::concat("FusedMoe: rank ", rank, " is not driven by this process"));
}

void FusedMoe::set_weights(int rank, const void* w0, const void* w1) {
  COMET_REQUIRE(w0 && w1, "FusedMoe::set_weights: null weight pointer for rank ", rank);
  RankState& s = state(rank);
  s.w0 = w0;
  s.w1 = w1;
}

void FusedMoe::stage(int rank, const RankBatch& b) {
  RankState& s = state(rank);
  COMET_REQUIRE(b.tokens >= 0 && b.tokens <= cap_.max_tokens_per_rank, "FusedMoe: rank ", rank, " passes ", b.tokens,
                " tokens; capacity is ", cap_.max_tokens_per_rank, " per rank");
  COMET_REQUIRE(b.tokens == 0 || (b.x && b.ids && b.gates && b.out), "FusedMoe: rank ", rank,
                " passes a null x/ids/gates/out pointer");
  COMET_REQUIRE(s.w0 && s.w1, "FusedMoe: no weights set for rank ", rank);
  s.x = b.x;
  s.tokens = b.tokens;
  const int H = shape_.hidden, k = shape_.topk;
  const RoutingBufferLayout layout{cap_.max_tokens_per_rank, k};
  char* routing = static_cast<char*>(team_.local_ptr(routing_sym_, rank));
  kernels::store_word(reinterpret_cast<int32_t*>(routing), b.tokens, s.stream);
  if (b.tokens == 0) return;
  const size_t slots = size_t(b.tokens) * k;
  COMET_CUDA_CHECK(cudaMemcpyAsync(routing + layout.ids_offset(), b.ids, slots * 4, cudaMemcpyDefault, s.stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(routing + layout.gates_offset(), b.gates, slots * 4, cudaMemcpyDefault, s.stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(team_.local_ptr(x_sym_, rank), b.x, size_t(b.tokens) * H * 2, cudaMemcpyDefault,
                                   s.stream));
}

void FusedMoe::prepare(int rank) {
  RankState& s = state(rank);
  s.plan.build(team_.peer_ptrs(routing_sym_, rank), s.stream);
  kernels::advance_epoch(s.epoch, s.stream);
  if (s.tokens > 0) {
    kernels::scatter_local(s.x, s.a, shape_.hidden, shape_.topk, s.tokens * shape_.topk, s.plan.view(), s.stream);
  }
}

void FusedMoe::advance_epoch(int rank) {
  RankState& s = state(rank);
  kernels::advance_epoch(s.epoch, s.stream);
}

int FusedMoe::max_blocks(int layer, int tile_n) const {
  int& cached = max_blocks_[layer == 0 ? 0 : 1][tile_n == 256 ? 2 : tile_n == 192 ? 1 : 0];
  if (cached == 0) cached = (layer == 0 ? kernels::layer0_limits(tile_n) : kernels::layer1_limits(tile_n)).max_blocks;
  return cached;
}

int FusedMoe::last_n_comm(int rank, int layer) const {
  const RankState& s = state(rank);
  const int l = layer == 0 ? 0 : 1;
  if (!s.last_adapted[l]) return s.last_n_comm[l];
  int32_t n = 0;
  COMET_CUDA_CHECK(cudaMemcpyAsync(&n, s.chosen_n_comm + l, 4, cudaMemcpyDeviceToHost, s.stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return n;
}

TuneKey FusedMoe::tune_key(int layer, int tokens_per_rank) const {
  TuneKey k;
  k.gpu = gpu_name_;
  k.sms = sms_;
  k.layer = layer;
  k.hidden = shape_.hidden;
  k.ffn = shape_.ffn;
  k.experts = shape_.num_experts;
  k.topk = shape_.topk;
  k.world = par_.world();
  k.ep = par_.ep;
  k.tp = par_.tp;
  k.link = team_.link();
  k.tokens_bucket = tokens_bucket(tokens_per_rank);
  return k;
}

TunedVariant FusedMoe::resolve(int layer, int rank, const LayerVariant& v) const {
  if (v.n_comm >= 0 && v.tile_n != 0) return TunedVariant{v, "forced"};
  const int tokens = std::max(1, state(rank).tokens);
  // (layer, tile_n, tokens bucket) in disjoint bit fields; the pick is made for n_comm -1 and a forced
  // n_comm (tile_n 0: only the shape is picked) replaces its n_comm afterwards.
  const uint64_t memo = (uint64_t(layer) << 56) | (uint64_t(v.tile_n) << 40) | uint64_t(tokens_bucket(tokens));
  auto it = picks_.find(memo);
  if (it == picks_.end()) {
    const TuneKey key = tune_key(layer, tokens);
    TunedVariant t = pick_variant(table_, key, expected_work(shape_, par_, layer, tokens, v.tile_n), v);
    // The pick must leave compute blocks on this device (a table from another GPU could ask for more).
    t.variant.n_comm = std::min(t.variant.n_comm, max_blocks(layer, t.variant.tile_n) - 1);
    if (par_.world() == 1) t.variant.n_comm = layer == 0 ? 0 : t.variant.n_comm;  // nothing to pull
    it = picks_.emplace(memo, t).first;
  }
  TunedVariant t = it->second;
  if (v.n_comm >= 0) t.variant.n_comm = v.n_comm;
  return t;
}

std::array<int, kLoadClasses> FusedMoe::load_picks(int layer, int tokens_per_rank, int tile_n) const {
  std::array<int, kLoadClasses> by_load{};
  TuneKey key = tune_key(layer, tokens_per_rank);
  for (int c = 1; c < kLoadClasses; ++c) {
    key.load = 1 << c;
    const TuneEntry* e = table_.find(key);
    // Only an entry measured with this launch's tile shape and with comm blocks (the sequential mode
    // is a different launch, chosen on the host).
    if (e && e->variant.tile_n == tile_n && e->variant.n_comm > 0)
      by_load[c] = std::min(e->variant.n_comm, max_blocks(layer, tile_n) - 1);
  }
  return by_load;
}

LayerVariant FusedMoe::launch_variant(int layer, int rank, LayerMode mode, const LayerVariant& requested,
                                      UnitRange units) const {
  const char* name = layer == 0 ? "layer 0" : "layer 1";
  const LayerVariant v = resolve(layer, rank, requested).variant;
  validate_variant(v, layer);
  COMET_REQUIRE(v.n_comm >= 0, "FusedMoe ", name, ": n_comm must be >= 0");
  COMET_REQUIRE(units.all() || mode == LayerMode::comm_only, "FusedMoe ", name, ": a unit range needs comm_only mode");
  const int limit = max_blocks(layer, v.tile_n);
  COMET_REQUIRE(mode == LayerMode::gemm_only || v.n_comm < limit, "FusedMoe ", name, ": n_comm ", v.n_comm,
                " leaves no compute block (", limit, " resident blocks)");
  return v;
}

void FusedMoe::layer0(int rank, LayerMode mode, const LayerVariant& requested, UnitRange units) {
  const LayerVariant v = launch_variant(0, rank, mode, requested, units);
  RankState& s = state(rank);
  const int limit = max_blocks(0, v.tile_n);
  kernels::Layer0Launch l;
  l.tile_n = v.tile_n;
  l.w0 = s.w0;
  l.n0 = is_gated(shape_.act) ? 2 * par_.ffn_shard(shape_) : par_.ffn_shard(shape_);
  l.experts = par_.local_experts(shape_);
  l.rows_cap = cap_.max_rows_per_rank;
  l.hid = s.hid;
  l.hid_ld = par_.ffn_shard(shape_);
  l.act = activation_op(shape_.act);
  l.dispatch = kernels::DispatchArgs{reinterpret_cast<const __nv_bfloat16* const*>(team_.peer_ptrs(x_sym_, rank)),
                                     static_cast<__nv_bfloat16*>(s.a),
                                     shape_.hidden,
                                     shape_.topk,
                                     kTileM,
                                     s.plan.view(),
                                     s.tile_arrived,
                                     s.tile_ready,
                                     units.begin,
                                     units.end,
                                     options_.dispatch_store_lag};
  l.epoch = s.epoch;
  l.n_comm = v.n_comm;
  l.adapt = adaptive_split_for(*this, 0, mode, s.tokens, requested, v, s.chosen_n_comm, s.adaptive_splits);
  s.last_n_comm[0] = v.n_comm;
  s.last_adapted[0] = l.adapt.enabled;
  l.m_group = auto_m_group(v.m_group, limit - v.n_comm, (l.n0 + v.tile_n - 1) / v.tile_n,
                           size_t(kTileM) * shape_.hidden * 2, l2_bytes_, mode == LayerMode::fused && v.n_comm > 0,
                           int(expected_rows(shape_, par_, s.tokens) / kTileM));
  l.mode = mode;
  l.team = team_.device_view(rank);
  if (mode == LayerMode::fused && v.n_comm == 0) {
    // Sequential mode (n_comm 0): no comm blocks inside the GEMM. With remote ranks the pull runs first,
    // as its own launch over the whole GPU (where the link is as fast as HBM this beats a few comm
    // blocks: docs/design-changes.md); with W = 1 there is nothing to pull.
    if (par_.world() > 1) {
      l.mode = LayerMode::comm_only;
      l.n_comm = limit;
      kernels::launch_layer0(l, s.stream);
    }
    l.mode = LayerMode::gemm_only;
  }
  kernels::launch_layer0(l, s.stream);
}

void FusedMoe::layer1(int rank, LayerMode mode, const LayerVariant& requested, UnitRange units) {
  const LayerVariant v = launch_variant(1, rank, mode, requested, units);
  RankState& s = state(rank);
  const int limit = max_blocks(1, v.tile_n);
  const int H = shape_.hidden;
  kernels::Layer1Launch l;
  l.tile_n = v.tile_n;
  l.hid = s.hid;
  l.ffn_shard = par_.ffn_shard(shape_);
  l.w1 = s.w1;
  l.experts = par_.local_experts(shape_);
  l.rows_cap = cap_.max_rows_per_rank;
  l.y = s.y;
  l.tile_done = s.tile_done;
  l.combine = kernels::CombineArgs{static_cast<const __nv_bfloat16*>(s.y),
                                   reinterpret_cast<__nv_bfloat16* const*>(team_.peer_ptrs(recv_sym_, rank)),
                                   static_cast<__nv_bfloat16*>(s.self_partial),
                                   H,
                                   shape_.topk,
                                   kTileM,
                                   v.tile_n,
                                   (H + v.tile_n - 1) / v.tile_n,
                                   cap_.max_tokens_per_rank,
                                   rank,
                                   s.plan.view(),
                                   s.tile_done,
                                   units.begin,
                                   units.end};
  l.epoch = s.epoch;
  l.n_comm = v.n_comm;
  l.adapt = adaptive_split_for(*this, 1, mode, s.tokens, requested, v, s.chosen_n_comm + 1, s.adaptive_splits);
  s.last_n_comm[1] = v.n_comm;
  s.last_adapted[1] = l.adapt.enabled;
  l.m_group = auto_m_group(v.m_group, limit - v.n_comm, std::min(v.n_group, (H + v.tile_n - 1) / v.tile_n),
                           size_t(kTileM) * l.ffn_shard * 2, l2_bytes_, mode == LayerMode::fused, 0);
  l.n_group = v.n_group;
  l.mode = mode;
  l.team = team_.device_view(rank);
  if (mode == LayerMode::fused && v.n_comm == 0) {
    // No comm blocks inside the GEMM: the combine runs as a second launch over the whole GPU.
    l.mode = LayerMode::gemm_only;
    kernels::launch_layer1(l, s.stream);
    l.mode = LayerMode::comm_only;
    l.n_comm = limit;
  }
  kernels::launch_layer1(l, s.stream);
}

void FusedMoe::finish(int rank, const RankBatch& b) {
  RankState& s = state(rank);
  kernels::FinalReduceArgs f{};
  f.recv = static_cast<const __nv_bfloat16*>(team_.local_ptr(recv_sym_, rank));
  f.self_partial = static_cast<const __nv_bfloat16*>(s.self_partial);
  f.ids = b.ids;
  f.out = static_cast<__nv_bfloat16*>(b.out);
  f.tokens = b.tokens;
  f.hidden = shape_.hidden;
  f.topk = shape_.topk;
  f.max_tokens = cap_.max_tokens_per_rank;
  f.world = par_.world();
  f.tp = par_.tp;
  f.rank = rank;
  f.local_experts = par_.local_experts(shape_);
  f.num_experts = shape_.num_experts;
  kernels::final_reduce(f, s.stream);
}

void FusedMoe::forward(const std::vector<RankBatch>& batches) {
  const std::vector<int> local = team_.local_ranks();
  COMET_REQUIRE(batches.size() == local.size(), "FusedMoe::forward: ", batches.size(), " batches for ", local.size(),
                " local ranks");
  for (size_t i = 0; i < local.size(); ++i) stage(local[i], batches[i]);
  team_.barrier();  // every rank's tokens and routing are in its exported buffers
  for (int r : local) {
    prepare(r);
    layer0(r, LayerMode::fused, options_.layer0);
    layer1(r, LayerMode::fused, options_.layer1);
  }
  team_.barrier();  // every rank has written its partial rows into the owners' receive slots
  for (size_t i = 0; i < local.size(); ++i) finish(local[i], batches[i]);
  if (options_.checking) sync_and_check();
}

void FusedMoe::sync_and_check() {
  team_.synchronize();
  for (const auto& s : ranks_) s->plan.check(s->stream);
}

const DevicePlan& FusedMoe::plan(int rank) const { return state(rank).plan; }
void* FusedMoe::gathered(int rank) const { return state(rank).a; }
void* FusedMoe::hidden(int rank) const { return state(rank).hid; }
void* FusedMoe::expert_out(int rank) const { return state(rank).y; }

}  // namespace comet
