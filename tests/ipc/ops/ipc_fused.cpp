// The fused MoE layer across processes: every rank of an IpcTeam runs FusedMoe::forward on its own
// tokens and checks its output against the CPU reference (every process builds the same problem from
// the same seed; two shapes), then checks that a second run from poisoned buffers is bitwise identical,
// and that FusedMoe::close gives the exported buffers back (collectively) and refuses later calls; the
// same for an fp8 (e4m3) layer 0 against the fp8 oracle. Each output's digest is printed (DIGEST lines),
// for the comparison of the two symmetric heaps.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "ipc/ipc_cases.hpp"
#include "ipc/ops/ipc_fused.hpp"
#include "harness/moe_problem.hpp"
#include "ops/moe_engine.hpp"

namespace comet::ipc_test {

IpcLayer make_ipc_layer(IpcTeam& team, const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens,
                        testing::RoutingKind kind, uint64_t seed, DType dtype) {
  using namespace comet::testing;
  IpcLayer l{MoeProblem::make(shape, par, tokens, kind, seed), nullptr, nullptr, {}};
  MoeOptions options;
  options.dtype = dtype;
  options.layer0 = forced(dtype == DType::e4m3 ? 128 : 256, 2);
  options.layer1 = forced(256, 3);
  options.transport = transport_from_env();
  l.moe = std::make_unique<FusedMoe>(team, shape, par, MoeCapacity{l.problem.max_tokens(), 0}, options);
  l.mine = upload_rank(l.problem, team.rank());
  if (dtype == DType::e4m3) {
    l.w0_fp8 = quantize_w0(shape, par, l.mine->w0.get());
    l.moe->set_weights(team.rank(), l.w0_fp8.codes.get(), l.mine->w1.get(), l.w0_fp8.scale_ptr());
  } else {
    l.moe->set_weights(team.rank(), l.mine->w0.get(), l.mine->w1.get());
  }
  return l;
}

namespace {

// FNV-1a over the output's bytes: what runs on different symmetric heaps compare.
uint64_t digest(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// One layer on every rank: the output against the reference (whole and worst row), then a second run
// from poisoned buffers (every data buffer of the layer and the output NaN) bitwise equal to the first.
std::string check_one(IpcTeam& team, const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens,
                      testing::RoutingKind kind, uint64_t seed, DType dtype = DType::bf16) {
  using namespace comet::testing;
  const int rank = team.rank();
  const std::string what = "fused layer (H " + std::to_string(shape.hidden) + ", k " + std::to_string(shape.topk) +
                           ", ep " + std::to_string(par.ep) + " x tp " + std::to_string(par.tp) + ", " +
                           to_string(dtype) + "): ";
  const size_t symmetric_before = team.symmetric_bytes_in_use();
  const IpcLayer l = make_ipc_layer(team, shape, par, tokens, kind, seed, dtype);
  const MoeProblem& p = l.problem;
  FusedMoe& moe = *l.moe;
  const auto& mine = l.mine;
  moe.forward({mine->batch()});
  moe.sync_and_check();
  const auto got = mine->output();
  // One line per case and rank: scripts/gpu-test compares the lines of the CUDA IPC run with those of
  // the NVSHMEM-heap run (the results must be equal bit for bit: same plan, same kernels, same order).
  // The transport is not in the line: its runs must give the same digests as the peer pointers'.
  std::printf("DIGEST H%d k%d ep%d tp%d %s seed %llu world %d rank %d: %016llx\n", shape.hidden, shape.topk, par.ep,
              par.tp, to_string(dtype), (unsigned long long)seed, team.world(), rank, (unsigned long long)digest(got));
  std::fflush(stdout);
  // e4m3: the oracle quantises the tokens and W0 as the layer does (reference::forward_fp8).
  const auto ref = dtype == DType::e4m3 ? reference::forward_fp8(shape, par, p.weights, p.inputs)
                                        : reference::forward(shape, par, p.weights, p.inputs);
  const double err = relative_error(got, ref[rank]);
  if (!(err < 1.5e-2)) return what + "relative error " + std::to_string(err) + " against the reference";
  const double worst = worst_row_error(got, ref[rank], shape.hidden);
  if (!(worst < 3e-2)) return what + "worst-row error " + std::to_string(worst) + " against the reference";
  team.barrier();  // every rank is done reading its peers' buffers before any poisons its own
  team.synchronize();
  moe.engine().poison_buffers(rank);
  mine->out.fill_bytes(0xFF);
  team.barrier();
  moe.forward({mine->batch()});
  moe.sync_and_check();
  const auto again = mine->output();
  if (std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) != 0)
    return what + "a second run from poisoned buffers differs";
  // The collective close gives the exported buffers back (the next case's layer is built after it).
  moe.close();
  if (team.symmetric_bytes_in_use() != symmetric_before)
    return what + "close() left " + std::to_string(team.symmetric_bytes_in_use() - symmetric_before) +
           " symmetric bytes behind";
  try {
    moe.forward({mine->batch()});
    return what + "a forward on a closed layer was accepted";
  } catch (const InvalidArgument&) {
  }
  return "";
}

// Rank 0 refuses a batch (rows over its capacity: a per-rank refusal) that every other rank's plan
// accepts. The other processes must not sum rank 0's stale partials from the call before: their
// outputs are NaN and their sync_and_check names rank 0; then a batch that fits is right everywhere.
std::string check_peer_refusal(IpcTeam& team, const MoeOptions& options) {
  using namespace comet::testing;
  const int rank = team.rank(), W = team.world();
  const MoeShape shape{256, 512, 8, 2, Activation::swiglu};  // E_l = 8 / W experts per rank
  const Parallel par{W, 1};
  const std::string what = "peer refusal (W " + std::to_string(W) + "), rank " + std::to_string(rank) + ": ";
  // Uniform, 60 tokens per rank: E_l (2 or 4) experts of at most a few tiles fit 1024 rows. All on EP
  // group 0, 400 per rank: 400 W k = 800 W rows on rank 0, more than 1024; the other ranks get none.
  const MoeProblem good = MoeProblem::make(shape, par, std::vector<int>(W, 60), RoutingKind::uniform, 41);
  const MoeProblem hot = MoeProblem::make(shape, par, std::vector<int>(W, 400), RoutingKind::one_group, 42, 0);
  FusedMoe moe(team, shape, par, MoeCapacity{400, 1024}, options);
  const auto g = upload_rank(good, rank);
  const auto h = upload_rank(hot, rank);
  moe.set_weights(rank, g->w0.get(), g->w1.get());
  const auto ref = reference::forward(shape, par, good.weights, good.inputs);
  moe.forward({g->batch()});
  moe.sync_and_check();
  if (!(relative_error(g->output(), ref[rank]) < 1.5e-2)) return what + "the first (good) call is wrong";
  h->out.fill_bytes(0);  // NaN must be written by the failed call
  moe.forward({h->batch()});
  std::string error;
  try {
    moe.sync_and_check();
  } catch (const DeviceReportedError& e) {
    error = e.what();
  }
  const std::string want = rank == 0 ? "max_rows = 1024" : "the call failed on peer rank 0";
  if (error.find(want) == std::string::npos) return what + "expected an error with '" + want + "', got '" + error + "'";
  if (!all_nan(h->output())) return what + "the refused call's output is not all NaN";
  moe.forward({g->batch()});
  moe.sync_and_check();
  if (!(relative_error(g->output(), ref[rank]) < 1.5e-2)) return what + "the call after the refusal is wrong";
  team.barrier();
  team.synchronize();
  moe.close();
  return "";
}


// The problems every fused-layer case runs: EP over all ranks for W = 2 and 8, EP x TP (2 x 2) for W = 4;
// uneven tokens, one rank with none.
struct BaseProblem {
  MoeShape shape;
  Parallel par;
  std::vector<int> tokens, zipf_tokens;
};
BaseProblem base_problem(int W) {
  BaseProblem b{MoeShape{256, 512, 8, W == 2 ? 2 : 4, Activation::swiglu}, W == 4 ? Parallel{2, 2} : Parallel{W, 1},
                {}, {}};
  for (int r = 0; r < W; ++r) {
    b.tokens.push_back(r == 1 ? 0 : 40 + 37 * r);
    b.zipf_tokens.push_back(r == W - 1 ? 0 : 129 + 61 * r);  // no count a multiple of the 128-row tile
  }
  return b;
}

// The two bf16 layers (their transport: COMET_IPC_TRANSPORT), then a peer's refusal where the routing
// allows it.
std::string check_bf16_layers(IpcTeam& team, const MoeOptions& refusal_options) {
  using namespace comet::testing;
  const int W = team.world();
  const BaseProblem b = base_problem(W);
  std::string e = check_one(team, b.shape, b.par, b.tokens, RoutingKind::uniform, 77);
  if (!e.empty()) return e;
  // A second shape: H 1024, top-8 of 16 experts, Zipf routing (hot experts), EP over all ranks.
  e = check_one(team, MoeShape{1024, 256, 16, 8, Activation::swiglu}, Parallel{W, 1}, b.zipf_tokens,
                RoutingKind::zipf, 91);
  if (!e.empty()) return e;
  if (W <= 4) return check_peer_refusal(team, refusal_options);  // one_group routing needs k <= E_l = 8 / W
  return "";
}

}  // namespace

std::string check_fused_layer(IpcTeam& team) {
  using namespace comet::testing;
  const BaseProblem b = base_problem(team.world());
  const MoeShape& shape = b.shape;
  const Parallel& par = b.par;
  const std::vector<int>& tokens = b.tokens;
  std::string e = check_bf16_layers(team, MoeOptions{});
  if (!e.empty()) return e;
  // fp8 layer 0 across processes: each rank quantises its own tokens into its exported records, which
  // the peers' comm blocks pull.
  e = check_one(team, shape, par, tokens, RoutingKind::uniform, 78, DType::e4m3);
  if (!e.empty()) return e;
  const int rank = team.rank();
  const MoeProblem p = MoeProblem::make(shape, par, tokens, RoutingKind::uniform, 77);
  // Ranks that build different layers (here: top-k) are refused on every rank, before any buffer exists.
  const MoeShape other{256, 512, 8, rank == 0 ? shape.topk : shape.topk + 1, Activation::swiglu};
  try {
    FusedMoe bad(team, other, par, MoeCapacity{p.max_tokens(), 0});
    return "fused layer: ranks with different top-k were not refused";
  } catch (const InvalidArgument& e) {
    if (std::string(e.what()).find("disagree") == std::string::npos)
      return std::string("fused layer: the mismatch was refused, but not for disagreeing: ") + e.what();
  }
  // Likewise ranks that disagree on layer 0's dtype (their exported token rows would differ in size).
  MoeOptions mixed;
  mixed.dtype = rank == 0 ? DType::e4m3 : DType::bf16;
  try {
    FusedMoe bad(team, shape, par, MoeCapacity{p.max_tokens(), 0}, mixed);
    return "fused layer: ranks with different dtypes were not refused";
  } catch (const InvalidArgument& e) {
    if (std::string(e.what()).find("disagree") == std::string::npos)
      return std::string("fused layer: the dtype mismatch was refused, but not for disagreeing: ") + e.what();
  }
  return "";
}

std::string check_unmapped_fused_layer(IpcTeam& team) {
  const BaseProblem b = base_problem(team.world());
  // Transport peer cannot reach the peers: refused on every rank before any buffer exists.
  try {
    FusedMoe bad(team, b.shape, b.par, MoeCapacity{256, 0});
    return "unmapped team: a layer with transport peer was not refused";
  } catch (const InvalidArgument& e) {
    if (std::string(e.what()).find("transport peer needs a pointer") == std::string::npos)
      return std::string("unmapped team: transport peer refused, but not for the missing pointers: ") + e.what();
  }
  if (transport_from_env() != DeviceTransport::nvshmem) return "unmapped team: COMET_IPC_TRANSPORT must be nvshmem";
  MoeOptions nvshmem;
  nvshmem.transport = DeviceTransport::nvshmem;
  const std::string e = check_bf16_layers(team, nvshmem);
  if (!e.empty()) return e;
  return check_one(team, b.shape, b.par, b.tokens, testing::RoutingKind::uniform, 78, DType::e4m3);
}

}  // namespace comet::ipc_test
