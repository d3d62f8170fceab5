// The fused MoE layer across processes: every rank of an IpcTeam runs FusedMoe::forward on its own
// tokens and checks its output against the CPU reference (every process builds the same problem from
// the same seed), then checks that a second run is bitwise identical.
#include <cstring>
#include <string>

#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "ipc/ops/ipc_fused.hpp"
#include "harness/moe_problem.hpp"

namespace comet::ipc_test {

std::string check_fused_layer(IpcTeam& team) {
  using namespace comet::testing;
  const int W = team.world(), rank = team.rank();
  // EP over all ranks for W = 2; EP x TP (2 x 2) for W = 4. Uneven tokens, one rank with none.
  const MoeShape shape{256, 512, 8, W == 2 ? 2 : 4, Activation::swiglu};
  const Parallel par = W == 4 ? Parallel{2, 2} : Parallel{W, 1};
  std::vector<int> tokens;
  for (int r = 0; r < W; ++r) tokens.push_back(r == 1 ? 0 : 40 + 37 * r);
  const MoeProblem p = MoeProblem::make(shape, par, tokens, RoutingKind::uniform, 77);
  MoeOptions options;
  options.layer0 = forced(256, 2);
  options.layer1 = forced(256, 3);
  FusedMoe moe(team, shape, par, MoeCapacity{p.max_tokens(), 0}, options);
  const auto mine = upload_rank(p, rank);
  moe.set_weights(rank, mine->w0.get(), mine->w1.get());
  moe.forward({mine->batch()});
  moe.sync_and_check();
  const auto got = mine->output();
  const auto ref = reference::forward(shape, par, p.weights, p.inputs);
  const double err = relative_error(got, ref[rank]);
  if (!(err < 1.5e-2)) return "fused layer: relative error " + std::to_string(err) + " against the reference";
  moe.forward({mine->batch()});
  moe.sync_and_check();
  const auto again = mine->output();
  if (std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) != 0) return "fused layer: second run differs";
  // Ranks that build different layers (here: top-k) are refused on every rank, before any buffer exists.
  const MoeShape other{256, 512, 8, rank == 0 ? shape.topk : shape.topk + 1, Activation::swiglu};
  try {
    FusedMoe bad(team, other, par, MoeCapacity{p.max_tokens(), 0});
    return "fused layer: ranks with different top-k were not refused";
  } catch (const InvalidArgument& e) {
    if (std::string(e.what()).find("disagree") == std::string::npos)
      return std::string("fused layer: the mismatch was refused, but not for disagreeing: ") + e.what();
  }
  return "";
}

}  // namespace comet::ipc_test
