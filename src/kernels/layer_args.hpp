// Arguments of the fused layers' comm roles and the epilogue kinds: plain structs, usable from host
// code (the ops layer fills them) and device code (the kernels read them).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "comet/plan.hpp"
#include "kernels/launch_trace.hpp"

namespace comet::kernels {

// A rank's call generation, and what the tile flags hold: 64 bits, so that ">= this call's epoch" never
// wraps (2^64 calls), not even for a flag that no call has touched for billions of calls.
using Epoch = uint64_t;

// What the GEMM epilogue applies before storing bf16: the expert activation (layer 0) or nothing.
enum class EpilogueOp : int { none = -1, swiglu = 0, gelu = 1, silu = 2 };

inline EpilogueOp epilogue_op(Activation a) {
  switch (a) {
    case Activation::swiglu: return EpilogueOp::swiglu;
    case Activation::gelu: return EpilogueOp::gelu;
    case Activation::silu: return EpilogueOp::silu;
  }
  return EpilogueOp::none;
}

// Layer 0's comm role (dispatch_role.cuh).
struct DispatchArgs {
  const __nv_bfloat16* const* peer_x;  // [W] every rank's token rows [T_cap][H] (exported)
  __nv_bfloat16* a;                    // gathered rows [rows_cap][H]
  int hidden;
  int topk;
  int tile_m;
  PlanView plan;
  int32_t* tile_arrived;  // [max_tiles] remote rows landed so far in this call (self-resetting)
  Epoch* tile_ready;      // [max_tiles] epoch of the last call whose rows are all in
  int unit_begin;         // units to pull: [unit_begin, unit_end) in unit order; -1: the plan's remote
                          //   units, in its pull order (plan.pull_unit)
  int unit_end;
  int store_lag;          // bulk-store groups in flight before a unit is published: 1, 2, 4 or 8
  LaunchTrace trace;      // layer 0's timeline (comet-bench --trace); off by default
};

// Mean slots with a row on one rank per unit (a token with at least one slot there) under uniform
// routing: a token's k distinct experts out of E, E / ep of them on the rank's group, so
// E[slots | >= 1] = (k / ep) / (1 - C(E - E/ep, k) / C(E, k)). 0 (every slot) without expert parallelism.
inline float expected_slots_per_unit(int topk, int ep, int experts) {
  if (ep <= 1 || experts < ep || topk <= 0) return 0.f;
  const int here = experts / ep;
  double none = 1.0;  // P(no slot on the rank)
  for (int i = 0; i < topk && none > 0.0; ++i) none *= double(experts - here - i) / double(experts - i);
  return float(double(topk) / ep / (1.0 - none));
}

// Layer 1's comm role (combine_role.cuh).
struct CombineArgs {
  const __nv_bfloat16* y;          // expert outputs [rows_cap][H] (this rank's partial over its F shard)
  __nv_bfloat16* const* peer_recv;  // [W] each owner's receive buffer [W][T_cap][H], as seen from here
  __nv_bfloat16* self_partial;     // [T_cap][H] this rank's slot for its own tokens (device memory)
  int hidden;
  int topk;
  int tile_m;
  int tile_n;     // column block width of the GEMM (TileN: 128 or 256)
  int n_blocks;   // GEMM column blocks: ceil(H / tile_n)
  int max_tokens; // T_cap
  int rank;
  PlanView plan;
  const Epoch* tile_done;    // [max_tiles * n_blocks] epoch of the last call that finished (m, n)
  int unit_begin;            // units to ship: [unit_begin, unit_end); -1: all of the plan's units
  int unit_end;
  bool unit_weights = false;  // the backward of dispatch: rows summed with weight 1, not their gates
  int world = 0;              // ranks, i.e. entries of peer_recv
  // Mean slots a unit has on this rank (k / ep over the tokens that have one here; 0: every slot, as
  // in TP): the combine sizes its batches by it (combine_role.cuh).
  float expected_slots = 0.f;
  // [2] (layer_sync.hpp: combine_batches): with it, the combine's warps take batches from a shared
  // counter instead of a fixed share (the one-launch sequential schedule: a block starts its combine
  // when its last tile is done, so a fixed share would wait for the last wave's blocks); null: fixed.
  int32_t* batch_counter = nullptr;
};

}  // namespace comet::kernels
