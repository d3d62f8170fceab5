// SequentialMoe: dispatch, expert GEMMs, combine, one after the other on the rank's stream, each step
// with the whole GPU (Megatron's all-to-all + grouped GEMM + all-to-all). See baselines.hpp; the
// backward is in sequential_backward.cpp.
#include "baselines/sequential_state.hpp"
#include "comet/cuda_check.hpp"

namespace comet {

SequentialMoe::SequentialMoe(FusedMoe& moe_public, const SequentialOptions& options) : moe_(moe_public.engine()), options_(options) {
  COMET_REQUIRE(options_.tile_n == 128 || options_.tile_n == 256, "SequentialMoe: tile_n must be 128 or 256, got ",
                options_.tile_n);
  COMET_CUDA_CHECK(cudaSetDevice(moe_.team().device()));
  for (int r : moe_.team().local_ranks()) ranks_.push_back(std::make_unique<RankState>(moe_, r));
}

SequentialMoe::~SequentialMoe() {
  for (const auto& s : ranks_) cudaStreamSynchronize(s->stream);  // GEMMs may still read our scratch
}

SequentialMoe::RankState& SequentialMoe::state(int rank) const {
  for (const auto& s : ranks_)
    if (s->rank == rank) return *s;
  throw InvalidArgument(detail::concat("SequentialMoe: rank ", rank, " is not driven by this process"));
}

void SequentialMoe::set_weights(int rank, const void* w0, const void* w1, const float* w0_scales) {
  moe_.set_weights(rank, w0, w1, w0_scales);  // validates the pointers, the scales and the rank
  RankState& s = state(rank);
  s.layers.set_weights(w0, w1);
  if (w0) s.w0_scales = w0_scales;
}

static bool is_fp8(const MoeEngine& moe) { return moe.options().dtype == DType::e4m3; }

void SequentialMoe::prepare(int rank) {
  RankState& s = state(rank);
  COMET_REQUIRE(s.layers.has_weights(), "SequentialMoe: no weights set for rank ", rank,
                " (set them through the baseline)");
  s.prepared = s.grad_prepared = false;  // a new routing: every GEMM problem is stale
  moe_.prepare(rank);
  s.read_counts(moe_);
  s.layers.ensure_scratch(moe_);
  if (is_fp8(moe_) && !s.fp8_gemm0)
    s.fp8_gemm0 = std::make_unique<baselines::Fp8ExpertGemm>(moe_.capacity().max_rows_per_rank,
                                                             baselines::w0_shard_rows(moe_), moe_.shape().hidden);
  s.problems0.assign(s.layers.gemm0(moe_, rank), s.blocks, s.stream);
  s.problems1.assign(s.layers.gemm1(moe_, rank), s.blocks, s.stream);
  s.prepared = true;
}

static void require_prepared(bool prepared, int rank) {
  COMET_REQUIRE(prepared, "SequentialMoe: rank ", rank, " has not been prepared (call prepare first)");
}

void SequentialMoe::dispatch(int rank) {
  require_prepared(state(rank).prepared, rank);
  if (moe_.parallel().world() == 1) return;  // every row is local and already in A
  moe_.layer0(rank, LayerMode::comm_only, baselines::all_sm_variant(moe_, 0, options_.tile_n));
}

void SequentialMoe::gemm0(int rank) {
  RankState& s = state(rank);
  require_prepared(s.prepared, rank);
  if (s.fp8_gemm0) {
    // The gathered records (fp8.hpp) x W0's codes, block-scaled, into the same pre-activation rows.
    const baselines::GemmOperands op = s.layers.gemm0(moe_, rank);
    s.fp8_gemm0->run(op.a, op.b, s.w0_scales, op.c, s.blocks, s.stream);
    return;
  }
  s.problems0.run(s.handle.get(), options_.gemm0);
}

void SequentialMoe::activation(int rank) {
  RankState& s = state(rank);
  require_prepared(s.prepared, rank);
  baselines::launch_activation(s.layers.activation(moe_, rank, 0, moe_.parallel().world()), s.max_rows, s.stream);
}

void SequentialMoe::gemm1(int rank) {
  RankState& s = state(rank);
  require_prepared(s.prepared, rank);
  s.problems1.run(s.handle.get(), options_.gemm1);
}

void SequentialMoe::combine(int rank) {
  require_prepared(state(rank).prepared, rank);
  moe_.layer1(rank, LayerMode::comm_only, baselines::all_sm_variant(moe_, 1, options_.tile_n));
}

void SequentialMoe::layer0(int rank) {
  dispatch(rank);
  gemm0(rank);
  activation(rank);
}

void SequentialMoe::layer1(int rank) {
  gemm1(rank);
  combine(rank);
}

void SequentialMoe::forward(const std::vector<RankBatch>& batches) {
  const std::vector<int> local = moe_.team().local_ranks();
  COMET_REQUIRE(batches.size() == local.size(), "SequentialMoe::forward: ", batches.size(), " batches for ",
                local.size(), " local ranks");
  for (size_t i = 0; i < local.size(); ++i) moe_.stage(local[i], batches[i]);
  moe_.team().barrier();  // every rank's tokens and routing are in its exported buffers
  for (int r : local) {
    prepare(r);
    layer0(r);
    layer1(r);
  }
  moe_.team().barrier();  // every partial row is in its owner's receive buffer
  for (size_t i = 0; i < local.size(); ++i) moe_.finish(local[i], batches[i]);
  if (moe_.options().checking) moe_.sync_and_check();
}

const std::vector<int>& SequentialMoe::expert_rows(int rank) const { return state(rank).counts.rows; }

}  // namespace comet
