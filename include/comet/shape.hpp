// The MoE layer's shape and its parallel layout (EP x TP), shared by every part of comet.
#pragma once

#include <string>

#include "comet/common.hpp"

namespace comet {

// Expert activation. swiglu: W0 maps H -> 2F (gate and up halves), out = silu(gate) * up.
// gelu / silu: W0 maps H -> F, out = act(x W0). GELU is the tanh approximation.
enum class Activation : int { swiglu = 0, gelu = 1, silu = 2 };

inline const char* to_string(Activation a) {
  switch (a) {
    case Activation::swiglu: return "swiglu";
    case Activation::gelu: return "gelu";
    case Activation::silu: return "silu";
  }
  return "?";
}

inline bool is_gated(Activation a) { return a == Activation::swiglu; }

// Largest top-k any kernel supports (run-time value, no per-k instantiation).
inline constexpr int kMaxTopK = 16;

struct MoeShape {
  int hidden = 0;       // H
  int ffn = 0;          // F per expert, before TP sharding
  int num_experts = 0;  // E
  int topk = 0;         // k
  Activation act = Activation::swiglu;

  // Rows of W0 per expert before sharding: 2F for gated activations, F otherwise.
  int w0_rows() const { return is_gated(act) ? 2 * ffn : ffn; }
};

// W = ep * tp ranks. Rank r = ep_index * tp + tp_index (TP ranks of one EP group are adjacent).
// EP group g holds experts [g * E/ep, (g+1) * E/ep); TP index i holds F columns [i * F/tp, (i+1) * F/tp).
struct Parallel {
  int ep = 1;
  int tp = 1;

  int world() const { return ep * tp; }
  int ep_index(int rank) const { return rank / tp; }
  int tp_index(int rank) const { return rank % tp; }
  int local_experts(const MoeShape& s) const { return s.num_experts / ep; }
  int ffn_shard(const MoeShape& s) const { return s.ffn / tp; }
  int group_of_expert(const MoeShape& s, int expert) const { return expert / local_experts(s); }
  int first_local_expert(const MoeShape& s, int rank) const { return ep_index(rank) * local_experts(s); }
};

// Throws InvalidArgument if the shape or layout is not supported.
inline void validate(const MoeShape& s, const Parallel& p) {
  COMET_REQUIRE(s.hidden > 0 && s.ffn > 0 && s.num_experts > 0, "MoeShape: H, F and E must be positive (H=",
                s.hidden, " F=", s.ffn, " E=", s.num_experts, ")");
  COMET_REQUIRE(s.topk >= 1 && s.topk <= kMaxTopK, "MoeShape: top-k must be in [1, ", kMaxTopK, "], got ", s.topk);
  COMET_REQUIRE(s.topk <= s.num_experts, "MoeShape: top-k (", s.topk, ") exceeds the number of experts (",
                s.num_experts, ")");
  COMET_REQUIRE(p.ep >= 1 && p.tp >= 1, "Parallel: ep and tp must be >= 1 (ep=", p.ep, " tp=", p.tp, ")");
  COMET_REQUIRE(s.num_experts % p.ep == 0, "Parallel: E (", s.num_experts, ") must be divisible by ep (", p.ep, ")");
  COMET_REQUIRE(s.ffn % p.tp == 0, "Parallel: F (", s.ffn, ") must be divisible by tp (", p.tp, ")");
  // 16-byte alignment of bf16 rows for TMA and vector copies.
  COMET_REQUIRE(s.hidden % 8 == 0, "MoeShape: H (", s.hidden, ") must be a multiple of 8");
  COMET_REQUIRE((s.ffn / p.tp) % 8 == 0, "MoeShape: F/tp (", s.ffn / p.tp, ") must be a multiple of 8");
}

}  // namespace comet
