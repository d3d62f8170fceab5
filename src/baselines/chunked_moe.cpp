// ChunkedMoe: coarse-grained overlap on two streams (Tutel / FasterMoE style). The rank's stream
// (where FusedMoe launches its copy kernels) pulls and ships stage by stage; a second stream runs each
// stage's cuBLAS GEMMs once its rows have landed. Events order the two; see baselines.hpp.
//
// Enqueue order matters for events: cudaStreamWaitEvent waits for the LAST record of the event made
// before the wait is enqueued, so every record below is enqueued before the wait that refers to it.
#include <algorithm>

#include "baselines/chunked_state.hpp"
#include "comet/cuda_check.hpp"

namespace comet {

namespace {
// Stages pulled ahead in run(): when stage i computes, the pulls of stages i+1 .. i+kLookahead are
// already enqueued, so the link stays busy while the rank's stream waits to ship stage i.
constexpr int kLookahead = 2;
}  // namespace

ChunkedMoe::ChunkedMoe(FusedMoe& moe_public, const ChunkedOptions& options) : moe_(moe_public.engine()), options_(options) {
  COMET_REQUIRE(options_.tile_n == 128 || options_.tile_n == 256, "ChunkedMoe: tile_n must be 128 or 256, got ",
                options_.tile_n);
  COMET_REQUIRE(options_.chunks >= 1, "ChunkedMoe: chunks must be >= 1, got ", options_.chunks);
  COMET_REQUIRE(moe_.options().dtype == DType::bf16, "ChunkedMoe: bf16 only (its GEMMs are cuBLAS bf16); the fp8 ",
                "layer has the sequential baseline");
  COMET_CUDA_CHECK(cudaSetDevice(moe_.team().device()));
  for (int r : moe_.team().local_ranks()) ranks_.push_back(std::make_unique<RankState>(moe_, r));
}

ChunkedMoe::~ChunkedMoe() {
  for (const auto& s : ranks_) cudaStreamSynchronize(s->comm);
}

ChunkedMoe::RankState& ChunkedMoe::state(int rank) const {
  for (const auto& s : ranks_)
    if (s->rank == rank) return *s;
  throw InvalidArgument(detail::concat("ChunkedMoe: rank ", rank, " is not driven by this process"));
}

void ChunkedMoe::set_weights(int rank, const void* w0, const void* w1) {
  moe_.set_weights(rank, w0, w1);
  state(rank).layers.set_weights(w0, w1);
}

void ChunkedMoe::setup(int rank) {
  RankState& s = state(rank);
  COMET_REQUIRE(s.layers.has_weights(), "ChunkedMoe: no weights set for rank ", rank, " (set them through the baseline)");
  COMET_REQUIRE(options_.chunks >= 1, "ChunkedMoe: chunks must be >= 1, got ", options_.chunks);
  const int limit = std::min(moe_.resident_blocks(0, options_.tile_n), moe_.resident_blocks(1, options_.tile_n));
  COMET_REQUIRE(options_.comm_blocks >= 1 && options_.comm_blocks < limit, "ChunkedMoe: comm_blocks must be in [1, ",
                limit, "), got ", options_.comm_blocks);
  s.ready = false;
  const int W = moe_.parallel().world(), el = moe_.parallel().local_experts(moe_.shape());
  const baselines::ChunkInputs in =
      baselines::read_chunk_inputs(moe_.plan(rank).view(), W, el, moe_.shape().num_experts, s.comm);
  s.stages = plan_chunk_stages(rank, W, el, options_.chunks, in.segment_offset, in.segment_rows, in.unit_src);
  s.layers.ensure_scratch(moe_);
  while (int(s.problems0.size()) < s.n_stages()) {
    s.problems0.push_back(std::make_unique<GemmProblems>(std::max(el, 1)));
    s.problems1.push_back(std::make_unique<GemmProblems>(std::max(el, 1)));
  }
  s.max_rows.assign(s.n_stages(), 0);
  for (int i = 0; i < s.n_stages(); ++i) {
    const ChunkStage& st = s.stages[i];
    std::vector<RowBlock> blocks;
    for (int e = 0; e < el; ++e) {
      blocks.push_back(RowBlock{e, st.row_begin[e], st.row_count[e]});
      s.max_rows[i] = std::max(s.max_rows[i], st.row_count[e]);
    }
    // Uploaded on the compute stream, where the GEMMs that read them run.
    s.problems0[i]->assign(s.layers.gemm0(moe_, rank), blocks, s.compute);
    s.problems1[i]->assign(s.layers.gemm1(moe_, rank), blocks, s.compute);
  }
  s.ready = true;
}

int ChunkedMoe::chunks(int rank) const {
  const RankState& s = state(rank);
  COMET_REQUIRE(s.ready, "ChunkedMoe: rank ", rank, " has no setup");
  return s.n_stages() - 1;
}

const std::vector<ChunkStage>& ChunkedMoe::stages(int rank) const { return state(rank).stages; }

static void require_ready(bool ready, int rank) {
  COMET_REQUIRE(ready, "ChunkedMoe: rank ", rank, " has no setup (call moe.prepare, then setup)");
}

void ChunkedMoe::run(int rank) {
  RankState& s = state(rank);
  require_ready(s.ready, rank);
  const int n = s.n_stages();
  s.fork();
  int next_pull = 1;
  auto pull_through = [&](int last) {
    for (; next_pull <= last && next_pull < n; ++next_pull) s.pull(moe_, options_, next_pull);
  };
  pull_through(kLookahead);
  for (int i = 0; i < n; ++i) {
    if (i > 0) s.wait(s.compute, s.pulled[i]);  // enqueued: i <= kLookahead, or after ship i-kLookahead-1
    s.compute0(moe_, options_, i);
    s.compute1(options_, i);
    s.wait(s.comm, s.done[i]);
    s.ship(moe_, options_, i);
    pull_through(i + kLookahead + 1);
  }
  // The last ship waited for the last stage's GEMM: the rank's stream is already past all compute work.
}

void ChunkedMoe::layer0(int rank) {
  RankState& s = state(rank);
  require_ready(s.ready, rank);
  const int n = s.n_stages();
  s.fork();
  for (int i = 1; i < n; ++i) s.pull(moe_, options_, i);  // back to back: the pulls wait on nothing
  for (int i = 0; i < n; ++i) {
    if (i > 0) s.wait(s.compute, s.pulled[i]);
    s.compute0(moe_, options_, i);
  }
  s.join();
}

void ChunkedMoe::layer1(int rank) {
  RankState& s = state(rank);
  require_ready(s.ready, rank);
  const int n = s.n_stages();
  s.fork();
  for (int i = 0; i < n; ++i) {
    s.compute1(options_, i);
    s.wait(s.comm, s.done[i]);
    s.ship(moe_, options_, i);
  }
}

void ChunkedMoe::forward(const std::vector<RankBatch>& batches) {
  const std::vector<int> local = moe_.team().local_ranks();
  COMET_REQUIRE(batches.size() == local.size(), "ChunkedMoe::forward: ", batches.size(), " batches for ",
                local.size(), " local ranks");
  for (size_t i = 0; i < local.size(); ++i) moe_.stage(local[i], batches[i]);
  moe_.team().barrier();
  for (int r : local) {
    moe_.prepare(r);
    setup(r);  // the routing may have changed: read the plan again
    run(r);
  }
  moe_.team().barrier();
  for (size_t i = 0; i < local.size(); ++i) moe_.finish(local[i], batches[i]);
  if (moe_.options().checking) moe_.sync_and_check();
}

}  // namespace comet
