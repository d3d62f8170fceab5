// MoeEngine: buffers, validation and the launch sequence of the fused MoE layer (moe_engine.hpp). What
// each launch looks like is the planner's decision (tune/launch_planner.hpp); this file executes it.
#include "ops/moe_engine.hpp"
#include "ops/launch_schedule.hpp"
#include "ops/rank_state.hpp"
#include "ops/stream_capture.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>

#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"
#include "kernels/fp8_quantize.hpp"
#include "kernels/fused_layers.hpp"
#include "kernels/layer_sync.hpp"
#include "kernels/local_rows.hpp"
#include "kernels/peer_failure.hpp"
#include "plan/wave_chunk_rule.hpp"
#if COMET_HAVE_NVSHMEM_KERNELS
#include "kernels/nvshmem/fused_nvshmem.hpp"
#include "team/nvshmem_heap.hpp"
#endif

namespace comet {

namespace {

constexpr int kTileM = kernels::kTileM;

bool checking_from_env() {
  const char* v = std::getenv("COMET_CHECK");
  return v && std::string(v) == "1";
}

bool aligned(const void* p, size_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

DeviceCaps device_caps(int device, DType layer0_dtype) {
  cudaDeviceProp prop{};
  COMET_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceCaps c;
  c.gpu = prop.name;
  c.sms = prop.multiProcessorCount;
  c.l2_bytes = size_t(prop.l2CacheSize);
  c.resident_blocks = [layer0_dtype](int layer, int tile_n) {
    if (layer >= 2) return kernels::grad_layer_limits(layer, tile_n).max_blocks;
    return (layer == 0 ? kernels::layer0_limits(tile_n, layer0_dtype) : kernels::layer1_limits(tile_n)).max_blocks;
  };
  return c;
}

TuneTable load_table(const std::string& path) {
  return path.empty() ? TuneTable::load_default() : TuneTable::load(path);
}

#if COMET_HAVE_NVSHMEM_KERNELS
// The NVSHMEM transport's arguments for a rank's launches: the team's ranks are PEs 0..W-1 (the heap
// checks it), and the rank's put staging.
kernels::nvshmem::TransportArgs nvshmem_args(const Team& team, SymmetricId staging, int rank) {
  return {0, team.local_ptr(staging, rank)};
}
#endif

}  // namespace

void* MoeEngine::alloc(RankState& s, size_t bytes) {
  bytes = std::max<size_t>(bytes, 16);
  void* p = nullptr;
  if (options_.allocator.allocate) {
    p = options_.allocator.allocate(bytes);
    COMET_REQUIRE(p != nullptr, "FusedMoe: the allocator returned null for ", bytes, " bytes");
  } else {
    COMET_CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  s.owned.push_back(p);
  s.private_bytes += bytes;
  COMET_CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

MoeEngine::MoeEngine(Team& team, const MoeShape& shape, const Parallel& par, const MoeCapacity& cap,
                     const MoeOptions& options)
    : team_(team),
      shape_(shape),
      par_(par),
      cap_(cap),
      options_(options),
      planner_(shape, par, team.link(), device_caps(team.device(), options.dtype), load_table(options.tune_table),
               PlannerPolicy{options.adaptive_split, options.batch_invariant, options.dtype, options.narrow_n_tiles,
                             options.transport == DeviceTransport::peer}) {
  validate(shape_, par_);
  COMET_REQUIRE(options_.dtype == DType::bf16 || options_.dtype == DType::e4m3, "FusedMoe: unknown dtype ",
                int(options_.dtype));
  if (options_.dtype == DType::e4m3) {
    COMET_REQUIRE(!options_.training, "FusedMoe: the fp8 (e4m3) layer 0 has no backward yet; training needs dtype bf16");
    COMET_REQUIRE(shape_.hidden % fp8::kBlock == 0, "FusedMoe: fp8 (e4m3) needs H a multiple of ", fp8::kBlock,
                  " (its 1 x 128 scale blocks), got ", shape_.hidden);
  }
  COMET_REQUIRE(team_.world() == par_.world(), "FusedMoe: the team has ", team_.world(), " ranks but ep x tp = ",
                par_.ep, " x ", par_.tp, " = ", par_.world());
  COMET_REQUIRE(par_.ep <= 32, "FusedMoe: ep > 32 is not supported (got ", par_.ep, ")");
  cap_ = resolve_capacity(shape_, par_, cap_);
  for (int r : options_.compute_ranks)
    COMET_REQUIRE(r >= 0 && r < par_.world(), "FusedMoe: MoeOptions::compute_ranks holds rank ", r, ", not in [0, ",
                  par_.world(), ")");
  COMET_REQUIRE(bool(options_.allocator.allocate) == bool(options_.allocator.release),
                "FusedMoe: DeviceAllocator needs both allocate and release (or neither)");
  if (!options_.allocator.release) options_.allocator.release = [](void* p) { cudaFree(p); };
  {
    // Processes that build different layers would size the same buffers alike and read each other
    // wrongly: agree on everything that shapes what peers read, before the first symmetric buffer.
    const int32_t config[] = {shape_.hidden,        shape_.ffn, shape_.num_experts,          shape_.topk,
                              int32_t(shape_.act),  par_.ep,    par_.tp, cap_.max_tokens_per_rank, options_.training,
                              int32_t(options_.dtype), int32_t(options_.transport)};
    team_.require_agreement(
        config, sizeof(config),
        "FusedMoe (hidden, ffn, experts, top-k, activation, ep, tp, max_tokens, training, dtype, transport)");
  }
  check_transport();
  set_dispatch_store_lag(options_.dispatch_store_lag);
  COMET_REQUIRE(options_.wave_chunk >= 0, "FusedMoe: wave_chunk must be >= 0 (0: the default), got ",
                options_.wave_chunk);
  COMET_REQUIRE(options_.pull_order == PullOrder::source || options_.pull_order == PullOrder::expert,
                "FusedMoe: pull_order must be PullOrder::source or PullOrder::expert, got ", int(options_.pull_order));
  options_.checking = options_.checking || checking_from_env();
  // A forced variant that cannot run (a tile not compiled for the layer, too many comm blocks) is
  // refused here, not half-way through a call. (Plans are memoised: this costs nothing later.)
  planner_.plan(0, LayerMode::fused, cap_.max_tokens_per_rank, options_.layer0);
  planner_.plan(1, LayerMode::fused, cap_.max_tokens_per_rank, options_.layer1);
  if (options_.training) {
    planner_.plan(2, LayerMode::fused, cap_.max_tokens_per_rank, transport_request(2, backward_request(2)));
    planner_.plan(3, LayerMode::fused, cap_.max_tokens_per_rank, transport_request(3, backward_request(3)));
  }

  const int H = shape_.hidden, T = cap_.max_tokens_per_rank, W = par_.world();
  const size_t row_bytes = size_t(H) * 2;
  // A constructor that throws (a private buffer the allocator refuses) runs no destructor: until the
  // layer is whole this gives the team back the symmetric buffers taken below, where that needs no peer
  // (one process drives every rank; across processes freeing is collective, MoeEngine::close). The
  // private buffers go with the rank states either way.
  struct SymmetricUntilBuilt {
    MoeEngine* engine;
    ~SymmetricUntilBuilt() {
      if (!engine || engine->team_.spans_processes()) return;
      try {
        engine->free_symmetric();
      } catch (const std::exception&) {
        // Unwinding already: the constructor's own error is the one to report.
      }
    }
  } symmetric_until_built{this};
  // The exported tokens: bf16 rows, or (e4m3) their records; A holds the same rows, and is sized for
  // bf16 either way since Y [rows][H] bf16 shares its memory.
  x_sym_ = team_.alloc_symmetric(size_t(T) * token_row_bytes());
  routing_sym_ = team_.alloc_symmetric(RoutingBufferLayout{T, shape_.topk}.bytes());
  recv_sym_ = team_.alloc_symmetric(size_t(W) * T * row_bytes);
  failed_sym_ = team_.alloc_symmetric(size_t(W) * sizeof(int32_t));
  if (options_.training) gate_recv_sym_ = team_.alloc_symmetric(size_t(W) * T * shape_.topk * sizeof(float));
#if COMET_HAVE_NVSHMEM_KERNELS
  // Every comm block the layer-1 launch could have (its resident grid) stages its puts here.
  if (nvshmem_transport())
    staging_sym_ = team_.alloc_symmetric(kernels::nvshmem::staging_bytes(kernels::nvshmem::max_layer1_blocks()));
#endif

  const int rows = cap_.max_rows_per_rank;
  const int max_tiles = rows / kTileM;
  const int max_n_blocks = (H + 127) / 128;
  COMET_CUDA_CHECK(cudaSetDevice(team_.device()));
  for (int r : team_.local_ranks()) {
    auto s = std::make_unique<RankState>();
    s->rank = r;
    s->stream = team_.stream(r);
    s->release = options_.allocator.release;
    s->computes = options_.compute_ranks.empty() || std::count(options_.compute_ranks.begin(),
                                                                 options_.compute_ranks.end(), r) > 0;
    if (s->computes) {
      if (options_.check_schedule) s->schedule_check = std::make_unique<ScheduleCheck>();
      PlanConfig plan{shape_, par_, r, kTileM, PlanCapacity{T, rows}};
      plan.wave_chunk = options_.wave_chunk > 0 ? options_.wave_chunk : kDefaultWaveChunk;
      plan.pull_order = options_.pull_order;
      s->plan = DevicePlan(plan);
      s->a = alloc(*s, size_t(rows) * row_bytes);
      s->hid = alloc(*s, size_t(rows) * par_.ffn_shard(shape_) * 2);
      s->hid_call = s->hid;
      // Without training, A is dead once layer 0 has ended and layer 1 writes Y from scratch: they
      // share memory. Training keeps A for dW0 and uses Y for the backward's D and dA.
      s->y = options_.training ? alloc(*s, size_t(rows) * row_bytes) : s->a;
      s->self_partial = alloc(*s, size_t(T) * row_bytes);
      s->sync_bytes = kernels::LayerSync::bytes(max_tiles, max_n_blocks);
      s->sync = kernels::LayerSync::carve(alloc(*s, s->sync_bytes), max_tiles, max_n_blocks);
      s->chosen_n_comm = static_cast<int32_t*>(alloc(*s, kLaunchLayers * 4));
      s->gemm_workspace_bytes = kernels::expert_gemm_grouped_workspace_bytes(par_.local_experts(shape_));
      s->gemm_workspace = alloc(*s, s->gemm_workspace_bytes);
      if (nvshmem_transport()) {
        // This rank's own symmetric addresses, once per rank: the NVSHMEM transport names the peer by PE.
        auto table = [&](const std::vector<void*>& addrs) {
          void* d = alloc(*s, W * sizeof(void*));
          COMET_CUDA_CHECK(cudaMemcpy(d, addrs.data(), W * sizeof(void*), cudaMemcpyHostToDevice));
          return static_cast<void* const*>(d);
        };
        auto own = [&](SymmetricId id) { return table(std::vector<void*>(W, team_.local_ptr(id, r))); };
        s->own_x = own(x_sym_);
        s->own_recv = own(recv_sym_);
        s->own_failed = reinterpret_cast<int32_t* const*>(own(failed_sym_));
        if (options_.training) s->own_gate_recv = own(gate_recv_sym_);
        const size_t routing_bytes = RoutingBufferLayout{T, shape_.topk}.bytes();
        s->routing_mirror = alloc(*s, W * routing_bytes);
        std::vector<void*> slots(W);
        for (int p = 0; p < W; ++p) slots[p] = static_cast<char*>(s->routing_mirror) + p * routing_bytes;
        s->mirror_slots = table(slots);
      }
    }
    if (s->computes && options_.training) {
      int least = 0, greatest = 0;
      COMET_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      COMET_CUDA_CHECK(cudaStreamCreateWithPriority(&s->side, cudaStreamNonBlocking, least));
      COMET_CUDA_CHECK(cudaEventCreateWithFlags(&s->side_fork, cudaEventDisableTiming));
      COMET_CUDA_CHECK(cudaEventCreateWithFlags(&s->side_join, cudaEventDisableTiming));
      if (options_.cublas_backward.value_or(false)) {
        s->cublas = std::make_unique<CublasExpertGemms>();  // asked for: loads cuBLAS now, or refuses
        s->cublas_backward = true;
      } else if (planner_.cublas_backward(options_.cublas_backward)) {
        s->cublas_backward = s->load_cublas();  // the rule's pick, and no cuBLAS here: comet's kernels
      }
      s->pre = alloc(*s, size_t(rows) * w0_shard_rows() * 2);
      s->grad_rows = alloc(*s, size_t(rows) * row_bytes);
      s->gate_partials = static_cast<float*>(alloc(*s, size_t(rows) * gate_blocks() * sizeof(float)));
      // D of the backward of layer 1 lives in Y (free until the backward of layer 0 writes dA) when
      // its rows fit there.
      const int Fs = par_.ffn_shard(shape_);
      s->d_rows = Fs <= H ? s->y : alloc(*s, size_t(rows) * Fs * 2);
      s->wgrad_workspace_bytes = kernels::weight_grad_grouped_workspace_bytes(par_.local_experts(shape_));
      s->wgrad_workspace = alloc(*s, 2 * s->wgrad_workspace_bytes);
    }
    if (s->computes && nvshmem_transport()) register_get_targets(*s);
    COMET_CUDA_CHECK(cudaEventCreateWithFlags(&s->joined, cudaEventDisableTiming));
    ranks_.push_back(std::move(s));
  }
  // What one computing rank holds: its private buffers, its plan, its symmetric buffers. The GPU test
  // FusedMoeMemory.FootprintIsWhatIsAllocated holds it to layer_footprint(), the sizes' one statement.
  device_bytes_per_rank_ = team_.symmetric_bytes(x_sym_) + team_.symmetric_bytes(routing_sym_) +
                           team_.symmetric_bytes(recv_sym_) + team_.symmetric_bytes(failed_sym_) +
                           (options_.training ? team_.symmetric_bytes(gate_recv_sym_) : 0) +
                           (staging_sym_.id >= 0 ? team_.symmetric_bytes(staging_sym_) : 0);
  for (const auto& s : ranks_) {
    if (!s->computes) continue;
    device_bytes_per_rank_ += s->private_bytes + s->plan.device_bytes();
    break;
  }
  // The zeroing above ran on the legacy stream; the ranks' non-blocking streams do not wait for it.
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  symmetric_until_built.engine = nullptr;  // the layer is whole: its destructor or close() frees them
}

MoeEngine::~MoeEngine() {
  for (const auto& s : ranks_) cudaStreamSynchronize(s->stream);
  if (closed_ || team_.closed() || team_.spans_processes()) return;  // see FusedMoe::close
  try {
    free_symmetric();
  } catch (const std::exception&) {
    // A destructor does not throw; the team frees what is left when it goes.
  }
}

void MoeEngine::require_open() const {
  COMET_REQUIRE(!closed_, "FusedMoe: the layer is closed (FusedMoe::close): no call may run on it");
}

MoeEngine::RankState& MoeEngine::compute_state(int rank) const {
  require_open();
  RankState& s = state(rank);
  COMET_REQUIRE(s.computes, "FusedMoe: rank ", rank,
                " does not compute here (MoeOptions::compute_ranks): it only stages its tokens");
  return s;
}

void MoeEngine::close() {
  if (closed_) return;
  closed_ = true;
  for (const auto& s : ranks_) COMET_CUDA_CHECK(cudaStreamSynchronize(s->stream));
  for (const auto& s : ranks_) s->free_buffers();
  free_symmetric();
}

// Collective on a team that spans processes (MoeEngine::close); the destructor calls it only where
// it is not (one process drives every rank).
void MoeEngine::free_symmetric() {
  for (SymmetricId* id : {&x_sym_, &routing_sym_, &recv_sym_, &failed_sym_, &gate_recv_sym_, &staging_sym_}) {
    if (id->id < 0) continue;
    const SymmetricId buf = *id;
    *id = SymmetricId{};
    team_.free_symmetric(buf);
  }
}

MoeEngine::RankState& MoeEngine::state(int rank) const {
  for (const auto& s : ranks_)
    if (s->rank == rank) return *s;
  throw InvalidArgument(detail::concat("FusedMoe: rank ", rank, " is not driven by this process"));
}

void MoeEngine::set_dispatch_store_lag(int lag) {
  COMET_REQUIRE(lag == 1 || lag == 2 || lag == 4 || lag == 8, "FusedMoe: dispatch_store_lag must be 1, 2, 4 or 8, got ",
                lag);
  options_.dispatch_store_lag = lag;
}

void MoeEngine::set_layer0_trace(int rank, const kernels::LaunchTrace& trace) {
  compute_state(rank).layer0_trace = trace;
}

void MoeEngine::set_weights(int rank, const void* w0, const void* w1, const float* w0_scales) {
  COMET_REQUIRE(w0 || w1, "FusedMoe::set_weights: null weight pointers for rank ", rank);
  COMET_REQUIRE(aligned(w0, 16) && aligned(w1, 16) && aligned(w0_scales, 16), "FusedMoe::set_weights: w0, w1 and ",
                "w0_scales of rank ", rank, " must be 16-byte aligned (TMA)");
  const bool fp8 = options_.dtype == DType::e4m3;
  COMET_REQUIRE(!w0 || fp8 == (w0_scales != nullptr), "FusedMoe::set_weights: rank ", rank,
                fp8 ? ": an e4m3 w0 needs its block scales (w0_scales)" : ": w0_scales given but the layer is bf16");
  RankState& s = state(rank);
  if (w0) s.w0 = w0, s.w0_scales = w0_scales;
  if (w1) s.w1 = w1;
}

int MoeEngine::token_row_bytes() const {
  return options_.dtype == DType::e4m3 ? fp8::record_bytes(shape_.hidden) : shape_.hidden * 2;
}

void MoeEngine::check_batch(int rank, const RankBatch& b) const {
  COMET_REQUIRE(!team_.closed(), "FusedMoe: the team is closed (IpcTeam::close): no call may run on it");
  require_open();
  const RankState& s = state(rank);
  COMET_REQUIRE(b.tokens >= 0 && b.tokens <= cap_.max_tokens_per_rank, "FusedMoe: rank ", rank, " passes ", b.tokens,
                " tokens; capacity is ", cap_.max_tokens_per_rank, " per rank");
  COMET_REQUIRE(b.tokens == 0 || (b.x && b.ids && b.gates && b.out), "FusedMoe: rank ", rank,
                " passes a null x/ids/gates/out pointer");
  COMET_REQUIRE(b.ids_type == IdType::i32 || b.ids_type == IdType::i64, "FusedMoe: rank ", rank,
                ": unknown expert id type ", int(b.ids_type));
  COMET_REQUIRE(aligned(b.x, 16) && aligned(b.out, 16) && aligned(b.hidden, 16), "FusedMoe: rank ", rank,
                ": x, out and hidden must be 16-byte aligned (vector copies, TMA)");
  COMET_REQUIRE(aligned(b.ids, b.ids_type == IdType::i64 ? 8 : 4) && aligned(b.gates, 4), "FusedMoe: rank ", rank,
                ": ids and gates must be aligned to their element size");
  COMET_REQUIRE(s.w0, "FusedMoe: no weights (w0) set for rank ", rank);
}

void MoeEngine::stage(int rank, const RankBatch& b) {
  check_batch(rank, b);
  RankState& s = state(rank);
  s.x = b.x;
  s.tokens = b.tokens;
  s.saved = false;  // a new forward: the last one's activations are gone
  s.hid_call = b.hidden ? b.hidden : s.hid;
  const int H = shape_.hidden, k = shape_.topk;
  const RoutingBufferLayout layout{cap_.max_tokens_per_rank, k};
  char* routing = static_cast<char*>(team_.local_ptr(routing_sym_, rank));
  kernels::store_word(reinterpret_cast<int32_t*>(routing), b.tokens, s.stream);
  if (b.tokens == 0) return;
  const size_t slots = size_t(b.tokens) * k;
  int32_t* ids = reinterpret_cast<int32_t*>(routing + layout.ids_offset());
  if (b.ids_type == IdType::i64) {
    kernels::narrow_ids(static_cast<const int64_t*>(b.ids), ids, slots, s.stream);
  } else {
    COMET_CUDA_CHECK(cudaMemcpyAsync(ids, b.ids, slots * 4, cudaMemcpyDefault, s.stream));
  }
  COMET_CUDA_CHECK(cudaMemcpyAsync(routing + layout.gates_offset(), b.gates, slots * 4, cudaMemcpyDefault, s.stream));
  if (options_.dtype == DType::e4m3) {
    kernels::quantize_rows_e4m3(b.x, b.tokens, H, team_.local_ptr(x_sym_, rank), s.stream);
  } else {
    COMET_CUDA_CHECK(cudaMemcpyAsync(team_.local_ptr(x_sym_, rank), b.x, size_t(b.tokens) * H * 2, cudaMemcpyDefault,
                                     s.stream));
  }
}

void MoeEngine::prepare(int rank) { prepare(rank, options_.layer0); }

void MoeEngine::prepare(int rank, const LayerRequest& layer0) {
  RankState& s = compute_state(rank);
#if COMET_HAVE_NVSHMEM_KERNELS
  if (nvshmem_transport()) {
    // No peer pointers on this transport: the plan reads every rank's routing from a local copy.
    kernels::nvshmem::GatherRoutingArgs g;
    g.routing = team_.local_ptr(routing_sym_, rank);
    g.mirror = s.routing_mirror;
    g.max_tokens = cap_.max_tokens_per_rank;
    g.topk = shape_.topk;
    g.world = par_.world();
    kernels::nvshmem::gather_routing(g, nvshmem_args(team_, staging_sym_, rank), s.stream);
  }
#endif
  s.plan.set_wave_chunk_rule(wave_chunk_rule(s.tokens, layer0));
  s.plan.build(nvshmem_transport() ? s.mirror_slots : team_.peer_ptrs(routing_sym_, rank), s.stream);
  // cuBLAS's GEMMs need the rows on the host: the copy starts now, each launch that runs them waits for it.
  if (wants_host_rows(s)) s.host_counts.read_async(s.plan.view(), par_.local_experts(shape_), s.stream);
  else s.host_counts.clear();
  kernels::advance_epoch(s.sync.epoch, s.stream);
  if (s.tokens > 0) {
    // bf16 rows come from the caller's x; records from the exported buffer stage() quantised them into.
    // scatter_local counts a row in 16-bit units.
    const bool fp8 = options_.dtype == DType::e4m3;
    const void* rows = fp8 ? team_.local_ptr(x_sym_, rank) : s.x;
    kernels::scatter_local(rows, s.a, token_row_bytes() / 2, shape_.topk, s.tokens * shape_.topk, s.plan.view(),
                           s.stream);
  }
}

WaveChunkRule MoeEngine::wave_chunk_rule(const PlannedLaunch& layer0) const {
  return options_.wave_chunk > 0 ? WaveChunkRule{} : comet::wave_chunk_rule(layer0.adapt);
}

WaveChunkRule MoeEngine::wave_chunk_rule(int tokens, const LayerRequest& layer0) const {
  return wave_chunk_rule(planner_.plan(0, LayerMode::fused, tokens, layer0));
}

int MoeEngine::plan_wave_chunk(int tokens, int rows, const LayerRequest& layer0) const {
  return comet::plan_wave_chunk(options_.wave_chunk > 0 ? options_.wave_chunk : kDefaultWaveChunk,
                                wave_chunk_rule(tokens, layer0), rows);
}

void MoeEngine::advance_epoch(int rank) {
  RankState& s = compute_state(rank);
  kernels::advance_epoch(s.sync.epoch, s.stream);
}

void MoeEngine::poison_buffers(int rank) {
  RankState& s = state(rank);
  const size_t rows = size_t(cap_.max_rows_per_rank), H = size_t(shape_.hidden), T = size_t(cap_.max_tokens_per_rank);
  auto fill = [&](void* p, size_t bytes) {
    if (p) COMET_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, bytes, s.stream));
  };
  fill(s.a, rows * H * 2);
  fill(s.hid, rows * par_.ffn_shard(shape_) * 2);
  fill(s.y, rows * H * 2);
  fill(s.self_partial, T * H * 2);
  fill(team_.local_ptr(recv_sym_, rank), size_t(par_.world()) * T * H * 2);
  if (options_.training) {
    fill(s.pre, rows * w0_shard_rows() * 2);
    fill(s.grad_rows, rows * H * 2);
    fill(s.gate_partials, rows * gate_blocks() * sizeof(float));
    fill(team_.local_ptr(gate_recv_sym_, rank), size_t(par_.world()) * T * shape_.topk * sizeof(float));
  }
  COMET_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

void MoeEngine::set_epoch(int rank, uint64_t epoch) {
  RankState& s = compute_state(rank);
  COMET_CUDA_CHECK(cudaMemcpyAsync(s.sync.epoch, &epoch, sizeof(epoch), cudaMemcpyHostToDevice, s.stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

const LaunchDecision& MoeEngine::decision(int layer, int rank, LayerMode mode, const LayerRequest& request) const {
  return planner_.plan(layer, mode, state(rank).tokens, request).decision;
}

const PlannedLaunch& MoeEngine::checked_plan(RankState& s, int launch, LayerMode mode, const LayerRequest& request,
                                             TimedLaunch& timed) const {
  const LayerRequest r = launch >= 2 ? transport_request(launch, request) : request;
  const PlannedLaunch& pick = planner_.plan(launch, mode, s.tokens, r);
  // Checked: the planner's fused splits of a whole launch (not a forced n_comm, not the steps the
  // benchmark and the baselines run in other modes).
  if (!s.schedule_check || mode != LayerMode::fused || r.n_comm || pick.decision.schedule != Schedule::fused)
    return pick;
  ScheduleCheck& check = *s.schedule_check;
  const ScheduleCheckKey key{launch, tokens_bucket(s.tokens)};
  ScheduleCheck::Next next{check.verdict(key).value_or(ScheduleArm::pick), false};
  if (!stream_capturing(s.stream)) {  // under capture: no event query, nothing timed
    s.launch_timer.poll(check);
    next = check.next(key);
  }
  if (next.timed) timed.start(s.launch_timer, check, key, next.arm, s.stream);
  if (next.arm == ScheduleArm::pick) return pick;
  LayerRequest sequential = r;
  sequential.n_comm = 0;
  return planner_.plan(launch, mode, s.tokens, sequential);
}

std::optional<ScheduleArm> MoeEngine::schedule_verdict(int rank, int launch, int tokens) const {
  const RankState& s = compute_state(rank);
  if (!s.schedule_check) return std::nullopt;
  return s.schedule_check->verdict({launch, tokens_bucket(tokens)});
}

std::optional<std::pair<float, float>> MoeEngine::schedule_medians(int rank, int launch, int tokens) const {
  const RankState& s = compute_state(rank);
  if (!s.schedule_check) return std::nullopt;
  return s.schedule_check->medians({launch, tokens_bucket(tokens)});
}

const LaunchDecision& MoeEngine::last_decision(int rank, int layer) const {
  COMET_REQUIRE(layer >= 0 && layer < kLaunchLayers, "FusedMoe: layer must be 0..3 (2, 3: the backward's), got ",
                layer);
  return state(rank).last[layer];
}

int MoeEngine::last_n_comm(int rank, int layer) const {
  const RankState& s = compute_state(rank);
  const LaunchDecision& d = last_decision(rank, layer);
  if (!d.adaptive) return d.n_comm;
  int32_t n = 0;
  COMET_CUDA_CHECK(cudaMemcpyAsync(&n, s.chosen_n_comm + layer, 4, cudaMemcpyDeviceToHost, s.stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return n;
}

kernels::GridSplit MoeEngine::grid_split(const RankState& s, const PlannedLaunch& planned, LayerMode mode,
                                         int layer) const {
  kernels::GridSplit g;
  g.epoch = s.sync.epoch;
  g.n_comm = planned.decision.n_comm;
  g.adapt = planned.adapt;
  g.adapt.chosen = s.chosen_n_comm + layer;
  g.m_group = planned.decision.m_group;
  g.n_group = planned.decision.n_group;
  g.m_order = planned.decision.m_order;
  g.mode = mode;
  g.team = team_.device_view(s.rank);
  return g;
}

// A unit range is clamped to the plan's units on the device (the host does not know how many there
// are); here only its form: both ends set, begin <= end.
void check_units(UnitRange units, LayerMode mode, const char* layer) {
  COMET_REQUIRE(units.all() || mode == LayerMode::comm_only, "FusedMoe ", layer, ": a unit range needs comm_only mode");
  COMET_REQUIRE(units.all() || (units.begin >= 0 && units.end >= units.begin), "FusedMoe ", layer, ": unit range [",
                units.begin, ", ", units.end, ") is not a range");
}

void MoeEngine::layer0(int rank, LayerMode mode, const LayerRequest& request, UnitRange units) {
  check_units(units, mode, "layer 0");
  RankState& s = compute_state(rank);
  TimedLaunch timed;  // ends (MoeOptions::check_schedule) after the launches below
  const PlannedLaunch& planned = checked_plan(s, 0, mode, request, timed);
  const LaunchDecision& d = planned.decision;
  s.last[0] = d;
  // The plan's tile order follows this launch: prepare() ordered it for the request it was given.
  if (mode == LayerMode::fused) {
    const WaveChunkRule rule = wave_chunk_rule(planned);
    if (!(rule == s.plan.config().chunk_rule)) s.plan.reorder(rule, s.stream);
  }
  kernels::Layer0Launch l;
  l.tile_n = d.tile_n;
  l.dtype = options_.dtype;
  l.hidden = shape_.hidden;
  l.w0 = s.w0;
  l.w0_scales = s.w0_scales;
  l.n0 = w0_shard_rows();
  l.experts = par_.local_experts(shape_);
  l.rows_cap = cap_.max_rows_per_rank;
  l.hid = s.hid_call;
  l.hid_ld = par_.ffn_shard(shape_);
  l.pre = s.pre;  // training: keep the pre-activations
  l.act = kernels::epilogue_op(shape_.act);
  l.dispatch = dispatch_args(s, s.a, units);
  l.dispatch.trace = s.layer0_trace;
  l.split = grid_split(s, planned, mode, 0);
  auto launch = [&](const auto& x) { launch_fused(s, x); };
  run_schedule(l, d, /*pull=*/true, par_.world(), launch, launch);  // its GEMM applies the activation: always ours
}

void MoeEngine::layer1(int rank, LayerMode mode, const LayerRequest& request, UnitRange units) {
  check_units(units, mode, "layer 1");
  RankState& s = compute_state(rank);
  COMET_REQUIRE(s.w1 || mode == LayerMode::comm_only, "FusedMoe: no weights (w1) set for rank ", rank);
  TimedLaunch timed;
  const PlannedLaunch& planned = checked_plan(s, 1, mode, request, timed);
  const LaunchDecision& d = planned.decision;
  s.last[1] = d;
  const int H = shape_.hidden;
  kernels::Layer1Launch l;
  l.tile_n = d.tile_n;
  l.hid = s.hid_call;
  l.ffn_shard = par_.ffn_shard(shape_);
  l.w1 = s.w1;
  l.experts = par_.local_experts(shape_);
  l.rows_cap = cap_.max_rows_per_rank;
  l.y = s.y;
  l.tile_done = s.sync.tile_done;
  l.combine = combine_args(s, d.tile_n, units, /*unit_weights=*/false);
  l.split = grid_split(s, planned, mode, 1);
  auto launch = [&](const auto& x) { launch_fused(s, x); };
  run_schedule(l, d, /*pull=*/false, par_.world(), launch, [&](const auto& x) {
    // Y = h W1_e^T
    s.last[1].standalone_gemm =
        standalone_gemm(s, d.standalone_gemm, l.hid, l.ffn_shard, l.w1, /*w_kn=*/false, H, l.y);
    if (s.last[1].standalone_gemm == StandaloneGemm::comet) launch(x);
  });
}

void MoeEngine::check_transport() {
  if (!nvshmem_transport()) {
    COMET_REQUIRE(options_.transport == DeviceTransport::peer, "FusedMoe: unknown transport ", int(options_.transport));
    COMET_REQUIRE(team_.maps_peers(),
                  "FusedMoe: transport peer needs a pointer to every rank's buffers, and this team has none to some "
                  "(NVSHMEM across nodes, or COMET_NVSHMEM_PEER_POINTERS=0): use MoeOptions::transport = nvshmem");
    return;
  }
#if COMET_HAVE_NVSHMEM_KERNELS
  const auto* ipc = dynamic_cast<const IpcTeam*>(&team_);
  COMET_REQUIRE(ipc && ipc->heap() == SymmetricHeap::nvshmem,
                "FusedMoe: transport nvshmem needs an IpcTeam on NVSHMEM's heap (SymmetricHeap::nvshmem): its PEs "
                "are the team's ranks");
  // The forward's layers have every tile width the peer-pointer kernels have (the planner checks a
  // forced one); the backward's launches have 256 (backward_request, transport_request).
  // Each NVSHMEM initialisation needs the kernels' module bound again (its device state).
  static int bound_session = -1;
  if (bound_session != team_detail::NvshmemHeap::session()) {
    kernels::nvshmem::bind_fused_kernels();
    bound_session = team_detail::NvshmemHeap::session();
  }
#else
  throw InvalidArgument("FusedMoe: transport nvshmem needs comet built with NVSHMEM's headers (scripts/setup-deps)");
#endif
}

// Where NVSHMEM moves data through a NIC, the local ends of its gets must be registered with it: the
// gathered rows A (layer 0's pulls), G (the backward's pulls of output gradients) and the routing mirror. (The put
// staging and the receive buffers are symmetric.) On one node NVSHMEM copies over peer mappings and
// needs none of this.
void MoeEngine::register_get_targets(RankState& s) {
#if COMET_HAVE_NVSHMEM_KERNELS
  if (!team_detail::NvshmemHeap::remote_transport()) return;
  s.unregister = [](void* p) { team_detail::NvshmemHeap::unregister_buffer(p); };
  const size_t rows = size_t(cap_.max_rows_per_rank), row_bytes = size_t(shape_.hidden) * 2;
  auto add = [&](void* p, size_t bytes) {
    if (!p) return;
    team_detail::NvshmemHeap::register_buffer(p, bytes);
    s.registered.push_back(p);
  };
  add(s.a, rows * row_bytes);
  add(s.grad_rows, rows * row_bytes);
  add(s.routing_mirror, size_t(par_.world()) * RoutingBufferLayout{cap_.max_tokens_per_rank, shape_.topk}.bytes());
#else
  (void)s;
#endif
}

// The NVSHMEM transport compiles the backward's fused launches (2, 3) with one tile width
// (kernels/nvshmem/fused_nvshmem.hpp: kTileN); the forward's are the planner's, as with peer pointers.
LayerRequest MoeEngine::transport_request(int launch, const LayerRequest& request) const {
#if COMET_HAVE_NVSHMEM_KERNELS
  static_assert(kNvshmemGradTileN == kernels::nvshmem::kTileN, "the NVSHMEM backward's compiled width");
#endif
  LayerRequest r = request;
  if (nvshmem_transport() && launch >= 2 && !r.tile_n) r.tile_n = kNvshmemGradTileN;
  return r;
}


void MoeEngine::launch_fused(const RankState& s, const kernels::Layer0Launch& l) const {
#if COMET_HAVE_NVSHMEM_KERNELS
  if (nvshmem_transport())
    return kernels::nvshmem::launch_layer0(l, nvshmem_args(team_, staging_sym_, s.rank), s.stream);
#endif
  kernels::launch_layer0(l, s.stream);
}

void MoeEngine::launch_fused(const RankState& s, const kernels::Layer1Launch& l) const {
#if COMET_HAVE_NVSHMEM_KERNELS
  if (nvshmem_transport())
    return kernels::nvshmem::launch_layer1(l, nvshmem_args(team_, staging_sym_, s.rank), s.stream);
#endif
  kernels::launch_layer1(l, s.stream);
}

void MoeEngine::launch_fused(const RankState& s, const kernels::GradLayer1Launch& l) const {
#if COMET_HAVE_NVSHMEM_KERNELS
  if (nvshmem_transport())
    return kernels::nvshmem::launch_grad_layer1(l, nvshmem_args(team_, staging_sym_, s.rank), s.stream);
#endif
  kernels::launch_grad_layer1(l, s.stream);
}

void MoeEngine::launch_fused(const RankState& s, const kernels::GradLayer0Launch& l) const {
#if COMET_HAVE_NVSHMEM_KERNELS
  if (nvshmem_transport())
    return kernels::nvshmem::launch_grad_layer0(l, nvshmem_args(team_, staging_sym_, s.rank), s.stream);
#endif
  kernels::launch_grad_layer0(l, s.stream);
}

void MoeEngine::ship_gate_grads(const RankState& s, const kernels::ShipGateGradsArgs& a) const {
#if COMET_HAVE_NVSHMEM_KERNELS
  if (nvshmem_transport())
    return kernels::nvshmem::ship_gate_grads(a, nvshmem_args(team_, staging_sym_, s.rank), s.stream);
#endif
  kernels::ship_gate_grads(a, s.stream);
}

bool MoeEngine::wants_host_rows(const RankState& s) const {
  if (s.cublas_backward) return true;
  if (s.cublas_missing) return false;
  // The requests forward() and backward() make (a caller driving the steps with others reads the rows
  // when a launch needs them).
  for (int launch : {1, 2, 3}) {
    if (launch >= 2 && !options_.training) break;
    const LayerRequest r = launch >= 2 ? transport_request(launch, backward_request(launch)) : options_.layer1;
    if (planner_.plan(launch, LayerMode::fused, s.tokens, r).decision.standalone_gemm == StandaloneGemm::cublas)
      return true;
  }
  return false;
}

const ExpertRows* MoeEngine::host_rows(RankState& s, ExpertRows& scratch) const {
  if (s.cublas_rows) return &*s.cublas_rows;  // the backward's, waited for once
  if (!s.load_cublas()) return nullptr;  // no cuBLAS here: our kernel
  // Not read after this plan's build (a request the default plan did not foresee): read now, which waits
  // for the launches before it on the stream. Under graph capture there is no read: our kernel.
  if (!s.host_counts.pending()) s.host_counts.read_async(s.plan.view(), par_.local_experts(shape_), s.stream);
  return s.host_counts.wait(cap_.max_rows_per_rank, scratch) ? &scratch : nullptr;
}

StandaloneGemm MoeEngine::standalone_gemm(RankState& s, StandaloneGemm gemm, const void* a, int k, const void* w,
                                          bool w_kn, int n, void* out) const {
  if (gemm == StandaloneGemm::cublas || s.cublas_rows) {
    ExpertRows scratch;
    const ExpertRows* rows = host_rows(s, scratch);
    if (!rows) return StandaloneGemm::comet;
    s.cublas->data_gemm(s.stream, *rows, a, k, w, w_kn, n, out);
    return StandaloneGemm::cublas;
  }
  if (gemm != StandaloneGemm::comet) grouped_expert_gemm(s, gemm, a, k, w, w_kn, n, out);
  return gemm;
}

void MoeEngine::grouped_expert_gemm(const RankState& s, StandaloneGemm gemm, const void* a, int k, const void* w,
                                    bool w_kn, int n, void* out) const {
  const PlanView plan = s.plan.view();
  kernels::ExpertGemmLaunch l;
  l.a = a;
  l.k = k;
  l.w = w;
  l.w_kn = w_kn;
  l.n = n;
  l.out = out;
  l.experts = par_.local_experts(shape_);
  l.expert_offset = plan.expert_offset;
  l.expert_rows = plan.expert_rows;
  l.kernel = gemm;
  l.workspace = s.gemm_workspace;
  l.workspace_bytes = s.gemm_workspace_bytes;
  kernels::launch_expert_gemm_grouped(l, s.stream);
}

void MoeEngine::publish_failure(int rank) {
  RankState& s = compute_state(rank);
  kernels::PublishFailureArgs a;
  a.failure = call_failure(s);
  a.failure.peer_words = nullptr;  // its own failure: a peer's does not need telling twice
  a.peer_words = nvshmem_transport() ? s.own_failed : reinterpret_cast<int32_t* const*>(team_.peer_ptrs(failed_sym_, rank));
  a.rank = rank;
  a.world = par_.world();
#if COMET_HAVE_NVSHMEM_KERNELS
  if (nvshmem_transport()) return kernels::nvshmem::publish_failure(a, nvshmem_args(team_, staging_sym_, rank), s.stream);
#endif
  kernels::publish_failure(a, s.stream);
}

void MoeEngine::gather_peer_failures(const RankState& s) {
  kernels::gather_peer_failures(
      kernels::GatherFailuresArgs{static_cast<int32_t*>(team_.local_ptr(failed_sym_, s.rank)),
                                  team_.device_view(s.rank)},
      s.stream);
}

void MoeEngine::finish(int rank, const RankBatch& b) {
  RankState& s = compute_state(rank);
  // The layer ran on its own hidden rows (and, training, kept its pre-activations): a backward may follow.
  s.saved = options_.training && s.hid_call == s.hid;
  kernels::final_reduce(final_reduce_args(s, b.ids, b.ids_type == IdType::i64, b.out, b.tokens), s.stream);
  gather_peer_failures(s);  // after the reduce that read the words
}

kernels::DispatchArgs MoeEngine::dispatch_args(const RankState& s, void* rows, UnitRange units) const {
  // hidden: the row length in 16-bit units (a record's bytes / 2 in e4m3; the dispatch moves bytes).
  const void* const* x_addrs = nvshmem_transport() ? s.own_x : team_.peer_ptrs(x_sym_, s.rank);
  return kernels::DispatchArgs{reinterpret_cast<const __nv_bfloat16* const*>(x_addrs),
                               static_cast<__nv_bfloat16*>(rows),
                               token_row_bytes() / 2,
                               shape_.topk,
                               kTileM,
                               s.plan.view(),
                               s.sync.tile_arrived,
                               s.sync.tile_ready,
                               units.begin,
                               units.end,
                               options_.dispatch_store_lag};
}

kernels::CombineArgs MoeEngine::combine_args(const RankState& s, int tile_n, UnitRange units, bool unit_weights) const {
  const int H = shape_.hidden;
  const float expected_slots = kernels::expected_slots_per_unit(shape_.topk, par_.ep, shape_.num_experts);  // sizes the combine's batches
  return kernels::CombineArgs{static_cast<const __nv_bfloat16*>(s.y),
                              reinterpret_cast<__nv_bfloat16* const*>(nvshmem_transport() ? s.own_recv
                                                                                           : team_.peer_ptrs(recv_sym_, s.rank)),
                              static_cast<__nv_bfloat16*>(s.self_partial),
                              H,
                              shape_.topk,
                              kTileM,
                              tile_n,
                              (H + tile_n - 1) / tile_n,
                              cap_.max_tokens_per_rank,
                              s.rank,
                              s.plan.view(),
                              s.sync.tile_done,
                              units.begin,
                              units.end,
                              unit_weights,
                              par_.world(),
                              expected_slots,
                              s.sync.combine_batches};  // taken by a one-launch schedule only
}

kernels::CallFailure MoeEngine::call_failure(const RankState& s) const {
  return kernels::CallFailure{s.plan.view().status, &team_.device_view(s.rank).status->code,
                              static_cast<const int32_t*>(team_.local_ptr(failed_sym_, s.rank)), par_.world()};
}

kernels::FinalReduceArgs MoeEngine::final_reduce_args(const RankState& s, const void* ids, bool ids_64, void* out,
                                                      int tokens) const {
  kernels::FinalReduceArgs f{};
  f.recv = static_cast<const __nv_bfloat16*>(team_.local_ptr(recv_sym_, s.rank));
  f.self_partial = static_cast<const __nv_bfloat16*>(s.self_partial);
  f.ids = ids;
  f.ids_64 = ids_64;
  f.out = static_cast<__nv_bfloat16*>(out);
  f.tokens = tokens;
  f.hidden = shape_.hidden;
  f.topk = shape_.topk;
  f.max_tokens = cap_.max_tokens_per_rank;
  f.world = par_.world();
  f.tp = par_.tp;
  f.rank = s.rank;
  f.local_experts = par_.local_experts(shape_);
  f.num_experts = shape_.num_experts;
  f.failure = call_failure(s);
  return f;
}

void MoeEngine::run(const std::vector<RankBatch>& batches, Part part) {
  const std::vector<int> local = team_.local_ranks();
  COMET_REQUIRE(batches.size() == local.size(), "FusedMoe::forward: ", batches.size(), " batches for ", local.size(),
                " local ranks");
  for (int r : local) compute_state(r);  // every local rank must run the layer
  if (part != Part::layer1) {
    for (size_t i = 0; i < local.size(); ++i) check_batch(local[i], batches[i]);  // all refusals before any work
    for (size_t i = 0; i < local.size(); ++i) stage(local[i], batches[i]);
    team_.barrier();  // every rank's tokens and routing are in its exported buffers
    for (int r : local) {
      prepare(r);
      layer0(r, LayerMode::fused, options_.layer0);
    }
  }
  if (part == Part::layer0) return;
  for (size_t i = 0; i < local.size(); ++i) {
    RankState& s = state(local[i]);
    const RankBatch& b = batches[i];
    if (part == Part::layer1) {  // the routing is layer 0's; this call may move the hidden rows
      COMET_REQUIRE(b.tokens == s.tokens, "FusedMoe::forward_layer1: rank ", local[i], " passes ", b.tokens,
                    " tokens, its layer 0 staged ", s.tokens);
      COMET_REQUIRE(aligned(b.hidden, 16), "FusedMoe: rank ", local[i], ": hidden must be 16-byte aligned");
      s.hid_call = b.hidden ? b.hidden : s.hid;
    }
    layer1(local[i], LayerMode::fused, options_.layer1);
    publish_failure(local[i]);  // a rank that shipped nothing must not let its peers sum stale partials
  }
  team_.barrier();  // every rank has written its partial rows into the owners' receive slots
  for (size_t i = 0; i < local.size(); ++i) finish(local[i], batches[i]);
}

void MoeEngine::forward(const std::vector<RankBatch>& batches) {
  run(batches, Part::whole);
  if (options_.checking) sync_and_check();
}

// Fork: every rank's stream waits for the caller's work so far; join: the caller's stream waits for
// every rank's. An event record / wait pair on each side, captured into a CUDA graph like the rest.
void MoeEngine::fork(cudaStream_t stream) {
  RankState& first = *ranks_.front();
  COMET_CUDA_CHECK(cudaEventRecord(first.joined, stream));
  for (const auto& s : ranks_)
    if (s->stream != stream) COMET_CUDA_CHECK(cudaStreamWaitEvent(s->stream, first.joined, 0));
}

void MoeEngine::join(cudaStream_t stream) {
  for (const auto& s : ranks_) {
    if (s->stream == stream) continue;
    COMET_CUDA_CHECK(cudaEventRecord(s->joined, s->stream));
    COMET_CUDA_CHECK(cudaStreamWaitEvent(stream, s->joined, 0));
  }
}

void MoeEngine::forward_on(const std::vector<RankBatch>& batches, cudaStream_t stream, Part part) {
  fork(stream);
  run(batches, part);
  join(stream);
  if (options_.checking) sync_and_check();
}

// Reports the first error of the calls since the last check (a refused routing's precise message
// before a timeout it may have caused), and leaves the layer ready for the next call: an error read is
// cleared (plan and team status) and every rank's flags start afresh (recover).
void MoeEngine::sync_and_check() {
  std::exception_ptr team_error, plan_error;
  try {
    team_.synchronize();
  } catch (const TimeoutError&) {
    team_error = std::current_exception();
  } catch (const DeviceReportedError&) {
    team_error = std::current_exception();
  }
  for (const auto& s : ranks_) {
    if (!s->computes || closed_) continue;  // no plan
    try {
      s->plan.check(s->stream);  // reading the error clears it
    } catch (const DeviceReportedError&) {
      if (!plan_error) plan_error = std::current_exception();
    }
  }
  if (team_error) recover();
  if (plan_error) std::rethrow_exception(plan_error);
  if (team_error) std::rethrow_exception(team_error);
}

// After a timeout a kernel may have ended part-way: tile_arrived can hold counts of a call that never
// finished (they would release a tile early, or never, in the next call), and the rank's abort word
// makes every later wait give up. Zero each local rank's flags (epoch included: the flags compare
// with it) and clear its status, on its stream after everything already enqueued, then wait for it.
void MoeEngine::recover() {
  for (const auto& s : ranks_) {
    if (s->sync.epoch) COMET_CUDA_CHECK(cudaMemsetAsync(s->sync.epoch, 0, s->sync_bytes, s->stream));
    s->saved = false;  // the activations of a failed forward are not a forward to differentiate
  }
  for (const auto& s : ranks_) team_.clear_status(s->rank);
}

const DevicePlan& MoeEngine::plan(int rank) const { return compute_state(rank).plan; }
void* MoeEngine::gathered(int rank) const { return compute_state(rank).a; }
void* MoeEngine::hidden(int rank) const { return compute_state(rank).hid; }
void* MoeEngine::expert_out(int rank) const { return compute_state(rank).y; }

// ---- FusedMoe: the public face of the engine --------------------------------------------------------

FusedMoe::FusedMoe(Team& team, const MoeShape& shape, const Parallel& par, const MoeCapacity& cap,
                   const MoeOptions& options)
    : engine_(std::make_unique<MoeEngine>(team, shape, par, cap, options)) {}
FusedMoe::~FusedMoe() = default;

void FusedMoe::set_weights(int rank, const void* w0, const void* w1, const float* w0_scales) {
  engine_->set_weights(rank, w0, w1, w0_scales);
}

void FusedMoe::forward(const RankBatch& batch, cudaStream_t stream) {
  const std::vector<int> local = engine_->team().local_ranks();
  COMET_REQUIRE(local.size() == 1, "FusedMoe::forward(batch, stream): this process drives ", local.size(),
                " ranks; pass one batch per rank");
  engine_->forward_on({batch}, stream);
}

void FusedMoe::forward(const std::vector<RankBatch>& batches, cudaStream_t stream) {
  engine_->forward_on(batches, stream);
}

void FusedMoe::forward_layer0(const std::vector<RankBatch>& batches, cudaStream_t stream) {
  engine_->forward_on(batches, stream, MoeEngine::Part::layer0);
}

void FusedMoe::forward_layer1(const std::vector<RankBatch>& batches, cudaStream_t stream) {
  engine_->forward_on(batches, stream, MoeEngine::Part::layer1);
}

void FusedMoe::sync_and_check() { engine_->sync_and_check(); }
void FusedMoe::close() { engine_->close(); }
const LaunchDecision& FusedMoe::last_decision(int rank, int layer) const { return engine_->last_decision(rank, layer); }
size_t FusedMoe::device_bytes_per_rank() const { return engine_->device_bytes_per_rank(); }
const MoeShape& FusedMoe::shape() const { return engine_->shape(); }
const Parallel& FusedMoe::parallel() const { return engine_->parallel(); }
const MoeCapacity& FusedMoe::capacity() const { return engine_->capacity(); }
const MoeOptions& FusedMoe::options() const { return engine_->options(); }
Team& FusedMoe::team() const { return engine_->team(); }

}  // namespace comet
