// A FusedMoe's capacity and the device memory it holds per rank, buffer by buffer. FusedMoe sizes its
// buffers with these functions (device_bytes_per_rank() is footprint().total()), so a framework or the
// benchmark can plan memory before it builds a layer. Not counted: what MoeOptions::transport = nvshmem
// adds (its put staging, 6.5 MB on an H200, which depends on the GPU's resident blocks; the routing
// mirror, W times the routing buffer; four W-entry address tables): device_bytes_per_rank() includes it.
#pragma once

#include <cstddef>

#include "comet/shape.hpp"
#include "comet/variant.hpp"

namespace comet {

struct MoeCapacity {
  int max_tokens_per_rank = 0;  // T_cap: most tokens one rank may pass in a call
  // Rows of each rank's gathered buffer (padding to 128 rows per expert included). 0: from load_factor,
  // else the worst case, W * T_cap * min(k, E_l) + E_l * 127 rounded up (safe, but large: every token
  // of every rank on this rank's experts).
  int max_rows_per_rank = 0;
  // Rows for load_factor times the mean load of uniform routing, W * T_cap * k * E_l / E, plus the
  // padding (E_l * 127), never above the worst case. Like a capacity factor, but nothing is dropped: a
  // call that needs more rows is refused on the device (PlanError::rows_over_capacity names the rows it
  // needed; the outputs are NaN). 0: not used. Exclusive with max_rows_per_rank.
  double load_factor = 0.0;
};

// The capacity with max_rows_per_rank resolved (load_factor then 0); InvalidArgument for a capacity
// that cannot be built (no tokens, a negative or non-finite factor, both rows and a factor, more rows
// than an int holds).
MoeCapacity resolve_capacity(const MoeShape& shape, const Parallel& par, const MoeCapacity& cap);

// Device bytes per rank. Private buffers are allocated for ranks that compute; every rank exports the
// symmetric ones (in pinned host memory with Link::host).
struct LayerFootprint {
  size_t gathered = 0;      // A [rows][H] bf16: the gathered tokens
  size_t expert_out = 0;    // Y [rows][H] bf16; 0 when Y lives in A's memory (no training: A is dead
                            // once layer 0 has ended, and Y is first written by layer 1)
  size_t hidden = 0;        // [rows][F/tp] bf16
  size_t self_partial = 0;  // [T][H] bf16: the rank's own pre-summed output rows
  size_t flags = 0;         // tile flags and the adaptive split's picks
  size_t plan = 0;          // the routing plan and its device builder's scratch
  size_t workspaces = 0;    // CUTLASS's grouped GEMMs: the standalone expert GEMM's; training: and the
                            // two weight-gradient launches' (dW1 and dW0 may overlap)
  size_t training = 0;      // pre-activations [rows][N0_s], output gradients [rows][H], gate partials
                            // [rows][gate_partial_columns] fp32, and D [rows][F/tp] where F/tp > H
                            // (else D lives in Y)
  size_t symmetric = 0;     // x [T][H] (e4m3: [T] records, fp8.hpp), routing [T][k] ids + gates, receive slots [W][T][H], failure
                            // words [W] int32 (kernels/peer_failure.hpp); training:
                            // gate-gradient slots [W][T][k] fp32
  size_t compute() const { return gathered + expert_out + hidden + self_partial + flags + plan + workspaces + training; }
  size_t total() const { return compute() + symmetric; }
};

// Gate-gradient partial columns per gathered row in training: one per 128 columns of F/tp (the
// backward of layer 1's narrowest N-block), which BackwardOptions::fused_activation's epilogue fills;
// the two-pass backward uses column 0.
int gate_partial_columns(const MoeShape& shape, const Parallel& par);

// `cap` must be resolved (resolve_capacity). dtype: MoeOptions::dtype (the exported tokens' rows).
LayerFootprint layer_footprint(const MoeShape& shape, const Parallel& par, const MoeCapacity& cap, bool training,
                               DType dtype = DType::bf16);

}  // namespace comet
