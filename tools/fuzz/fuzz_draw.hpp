// What comet-fuzz runs, drawn from seeds: a family (one FusedMoe: shape, layout, link, capacity,
// options) and its batches (tokens per rank, routing, id type, an injected fault). Pure host code, so
// that a CPU test can check what the draws cover; a printed seed reproduces a family exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comet/fused_moe.hpp"
#include "harness/routing_gen.hpp"

namespace comet::fuzz {

// One FusedMoe and everything fixed across its batches.
struct Family {
  uint64_t seed = 0;
  MoeShape shape;
  Parallel par;
  Link link = Link::device;
  int max_tokens = 1;        // MoeCapacity::max_tokens_per_rank
  int max_rows = 0;          // MoeCapacity::max_rows_per_rank (0: the worst case; else tight, may refuse)
  MoeOptions options;        // forced or tuned variants, adaptive split, batch invariance, store lag, training
  GradType grad_type = GradType::f32;
  bool fused_activation = false;  // BackwardOptions::fused_activation of the family's backwards
};

// What a batch does wrong on purpose, and what the layer must answer.
enum class Fault : int {
  none = 0,
  duplicate_id,          // one slot repeats an earlier slot's expert: device-reported error at sync, NaN out
  id_out_of_range,       // one id is E or negative: device-reported error at sync, NaN out
  tokens_over_capacity,  // one rank passes max_tokens + 1: InvalidArgument before any launch
  gate_not_finite,       // one gate weight is NaN or +-Inf: device-reported error at sync, NaN out
};
const char* to_string(Fault f);

struct Batch {
  uint64_t seed = 0;
  std::vector<int> tokens;  // per rank
  testing::RoutingKind routing = testing::RoutingKind::uniform;
  int hot = 0;              // the hot expert (one_expert) or EP group (one_group)
  IdType ids_type = IdType::i32;
  Fault fault = Fault::none;
  int fault_rank = 0, fault_token = 0, fault_slot = 0, fault_id = 0;  // where the fault is (not for tokens)
};

// Routed rows (one per token and chosen expert) times H times (w0 rows + F): the reference's
// multiply-adds for a forward are about this many. Families are drawn so a full batch stays under it.
inline constexpr double kMaxReferenceWork = 1.5e8;

Family draw_family(uint64_t seed);
// Batch `index` of a family (its seed mixes the family's and the index); about one in twelve has a
// fault unless `faults` is false.
Batch draw_batch(const Family& family, int index, bool faults = true);

// The routing of a batch, the fault injected: per rank ids [T][k] and gates [T][k].
std::vector<testing::RankRouting> make_batch_routing(const Family& family, const Batch& batch);

// Rows of the gathered buffer an EP group needs for this routing (segments padded to 128 rows): the
// oracle of rows_over_capacity, written from the plan's definition, not with its code.
int rows_needed(const Family& family, const std::vector<testing::RankRouting>& routing, int ep_group);

std::string describe(const Family& family);
std::string describe(const Batch& batch);

}  // namespace comet::fuzz
