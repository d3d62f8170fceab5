// comet::FusedMoe: the distributed MoE layer with communication hidden inside the expert GEMMs.
//
//   layer 0  dispatch + GEMM0 + activation  (one persistent kernel: comm blocks pull remote token rows,
//            compute blocks run the GEMM on M-tiles as their rows land; local tiles first)
//   layer 1  GEMM1 + top-k combine          (one persistent kernel: compute blocks make column blocks,
//            comm blocks weight, pre-reduce and ship finished slices to the tokens' owners)
//   finish   each rank sums its tokens' partial rows in rank order (bitwise reproducible)
//
// One FusedMoe serves the ranks this process drives: one with IpcTeam (a process per rank), all W with
// LocalTeam (virtual ranks). forward() is ordered on the caller's stream and never synchronises with
// the host, so it can be captured in a CUDA graph. Device memory is sized once from MoeCapacity.
// Routing is validated on the device: errors surface at sync_and_check() (at once with
// MoeOptions::checking or COMET_CHECK=1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comet/footprint.hpp"
#include "comet/plan.hpp"
#include "comet/shape.hpp"
#include "comet/team.hpp"
#include "comet/variant.hpp"

namespace comet {

class MoeEngine;

// Where the rank-private buffers come from (the gathered rows, hidden, expert outputs, flags): by
// default cudaMalloc; a framework passes its own (torch's caching allocator) so that it accounts for
// them. Symmetric buffers (exported to peers) always come from the Team.
struct DeviceAllocator {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* ptr)> release;
};

// How the comm blocks reach the peers' buffers.
//   peer     loads, stores and bulk copies through peer pointers (CUDA IPC, NVSHMEM's nvshmem_ptr or
//            mapped host memory): every layer, tile and dtype, and the backward.
//   nvshmem  NVSHMEM's device gets and puts to PEs (issue 19; for peers that no pointer reaches, across
//            nodes). Needs an IpcTeam on NVSHMEM's heap (SymmetricHeap::nvshmem) and a build with
//            NVSHMEM's headers; so far bf16 layers with 128 x 256 tiles, forward and backward (e4m3 and
//            other tiles are refused at construction). docs/nvshmem.md.
enum class DeviceTransport : int { peer = 0, nvshmem = 1 };
inline const char* to_string(DeviceTransport t) { return t == DeviceTransport::nvshmem ? "nvshmem" : "peer"; }

// MoeOptions::wave_chunk's default where the tuner has no chunk for the batch (docs/design-changes.md,
// "Layer 0's tile order under skew").
inline constexpr int kDefaultWaveChunk = 1;
// MoeOptions::pull_order's default: expert by expert (docs/design-changes.md, "Layer 0's pull order").
inline constexpr PullOrder kDefaultPullOrder = PullOrder::expert;

struct MoeOptions {
  // What to force in each layer's launches; every field left empty is the tuner's choice. The backward
  // follows them (its layer-1 backward runs layer 0's kernel, and the reverse), except a tile of 192,
  // which only the forward's kernels have.
  LayerRequest layer0;
  LayerRequest layer1;
  // Fused launches whose n_comm the tuner picked re-pick it on the device from the plan's row and unit
  // counts: a skewed batch takes the table's entry for its load class, else the cost model's pick for
  // its counts (src/tune/adaptive_split.hpp has the rule). No host synchronisation; the grid is
  // unchanged; a uniform batch keeps the host's pick. Off: the host's pick for uniform routing always.
  bool adaptive_split = true;
  // One token's output must not depend on the batch it came in (the same bits whatever the token count):
  // the tile shape is then chosen from the layer's shape alone, never per token bucket from the table,
  // and a table's cuBLAS pick (StandaloneGemm::cublas, which picks its kernel by the rows) runs ours.
  // Results are already independent of n_comm, groups, repeats and the other tokens' routing.
  bool batch_invariant = false;
  // Where N is narrow (comet/variant.hpp: prefers_320_tiles; Qwen2-57B and Phi-3.5 at TP 8), the
  // planner's CUTLASS pick for the weight gradients runs 128 x 320 tiles (the same bits). Off: the
  // table's and the rule's picks as they are (for A/B runs).
  bool narrow_n_tiles = true;
  // Training: the backward's GEMMs that run with no comm blocks beside them (the sequential schedule of
  // its two data GEMMs, and the weight gradients) are cuBLAS's, one call per expert with its exact rows
  // (src/ops/cublas_gemms.hpp: a training forward reads the plan's per-expert rows back to the host
  // without waiting; the backward waits for that copy). Nothing is overlapped there, so the fastest GEMM
  // wins; cuBLAS leads CUTLASS's best by up to 16 % on one large expert per rank (Mixtral EP 8). Other
  // bits than the device-shaped kernels' (still the same every run), and not under CUDA-graph capture
  // (where it falls back to them). Empty (default): the planner's rule, on where a rank has at most 2
  // local experts (LaunchPlanner::cublas_backward; without a loadable cuBLAS the rule's pick is off);
  // true / false: asked (true refuses a process without cuBLAS). docs/design-changes.md, "cuBLAS for the
  // backward's standalone GEMMs".
  std::optional<bool> cublas_backward;
  bool checking = false;  // synchronise and raise device-reported errors after every call
  // Check the tuner's fused picks on this machine (src/tune/schedule_check.hpp). For each launch (the
  // forward's two, the backward's two) and token bucket whose pick is a fused split, the first calls
  // alternate that pick with the sequential schedule of the same launch (6 launches each, the first
  // untimed), timed with CUDA events read back at later calls without waiting; from then on the launch
  // runs the one whose median was lower (the sequential schedule only where it was 2 % faster). For a
  // node whose link or GPU the shipped table did not measure. Each rank decides for itself (the
  // schedules of one launch need not agree across ranks). Nothing is timed while a CUDA graph is
  // captured (the pick runs there, or a verdict already reached). Both schedules give correct results;
  // where the sequential one runs a CUTLASS GEMM from the table, other bits than the fused one's. Off
  // by default: two runs may settle differently (the verdict rests on timings), so with such a GEMM
  // their bits could differ.
  bool check_schedule = false;
  // Forwards keep what backward() needs: the gathered tokens A, the hidden rows, and layer 0's
  // pre-activations (one more [max_rows][w0 rows of the shard] bf16 buffer per rank, allocated here),
  // plus the backward's buffers (gathered output gradients [max_rows][H] bf16, gate-gradient partials).
  bool training = false;
  // Layer 0's GEMM inputs (comet/variant.hpp: DType). e4m3: every rank quantises its tokens once per
  // forward (1 x 128 blocks) and the comm blocks move the packed records, half the bytes of bf16; W0 is
  // given as e4m3 codes with 128 x 128 block scales (set_weights). Forward only (training refused).
  DType dtype = DType::bf16;
  // Layer 0's comm blocks: bulk-store groups in flight before a unit's rows are published (1, 2, 4, 8).
  int dispatch_store_lag = 4;
  // Layer 0's fused launch (and the backward of layer 1) computes its tiles wave by wave as their rows
  // arrive; an expert's tiles go in runs of this many, each run at the wave of its last tile, so that a
  // pass over the expert's weights serves that many tiles (PlanConfig::wave_chunk, comet/plan.hpp).
  // 0: per batch, the tuner's chunk for the batch's load class where its table has one (with the n_comm
  // measured beside it; the adaptive split), else kDefaultWaveChunk. A value >= 1 holds every batch to
  // it. Every chunk gives the same results, bit for bit.
  int wave_chunk = 0;
  // The order layer 0's comm blocks pull remote tokens in (PlanConfig::pull_order, comet/plan.hpp):
  // source by source, or expert by expert (each expert's tiles complete together and are computed in
  // m order, so each pass over an expert's weights serves all of its tiles). Same results, bit for bit.
  PullOrder pull_order = kDefaultPullOrder;
  // The tuner's table; empty: the shipped table overlaid by the user's (TuneTable::load_default).
  std::string tune_table;
  DeviceAllocator allocator;  // empty: cudaMalloc / cudaFree
  // Ranks that run the layer here (empty: every local rank). A local rank not listed only stages its
  // tokens for its peers to pull (the engine's stage step): it exports its symmetric buffers but holds
  // no gathered rows, hidden, expert outputs, flags or plan. For benchmarks that time one of W virtual
  // ranks on one GPU; the whole-layer calls (forward, backward) need every local rank to compute.
  std::vector<int> compute_ranks;
  DeviceTransport transport = DeviceTransport::peer;  // see DeviceTransport
};

// Element type of the expert ids a caller passes (torch.topk gives int64).
enum class IdType : int { i32 = 0, i64 = 1 };

// One rank's inputs and output for a call (device pointers, bf16 activations, 16-byte aligned).
struct RankBatch {
  int tokens = 0;
  const void* x = nullptr;      // [tokens][H] bf16
  const void* ids = nullptr;    // [tokens][k] expert ids, of ids_type
  const float* gates = nullptr;  // [tokens][k] gate weights
  void* out = nullptr;          // [tokens][H] bf16
  IdType ids_type = IdType::i32;
  // Optional: where layer 0 writes (and layer 1 reads) the hidden rows, [max_rows][F/tp] bf16 in the
  // plan's layout; null: the layer's own buffer. Lets a framework own them (the split layer ops).
  void* hidden = nullptr;
};

// Element type of the weight gradients backward() writes.
enum class GradType : int { f32 = 0, bf16 = 1 };

// One rank's gradients for backward() (device pointers, 16-byte aligned). The routing and token count
// are the last forward's.
struct RankGrad {
  const void* dout = nullptr;  // [tokens][H] bf16: gradient of the forward's out
  void* dx = nullptr;          // [tokens][H] bf16
  float* dgates = nullptr;     // [tokens][k] fp32
  void* dw0 = nullptr;         // [E_l][w0 rows of the shard][H], GradType (weight_layout.hpp)
  void* dw1 = nullptr;         // [E_l][H][F/tp], GradType
};

struct BackwardOptions {
  GradType grad_type = GradType::bf16;
  bool accumulate = false;  // dw0 / dw1 += the gradient (a framework's main grads); else overwritten
  // The backward of layer 1 makes dPre, g h and the gate partials in its GEMM's epilogue
  // (src/kernels/activation_grad_epilogue.cuh) instead of storing D and running the activation's
  // backward as a second pass over HBM. The same dx, dW0 and dW1 bit for bit; the gate gradients summed
  // in another order. Off by default: on the H200 it was 0.3-0.7 % faster in the median, inside the noise
  // (docs/design-changes.md, "Backward").
  bool fused_activation = false;
  WeightGradKernel weight_grad_kernel = WeightGradKernel::automatic;
};

class FusedMoe {
 public:
  FusedMoe(Team& team, const MoeShape& shape, const Parallel& par, const MoeCapacity& cap,
           const MoeOptions& options = {});
  ~FusedMoe();
  FusedMoe(const FusedMoe&) = delete;
  FusedMoe& operator=(const FusedMoe&) = delete;

  // Expert weights of a local rank, in the layout of weight_layout.hpp (device pointers, bf16):
  // w0 [E_l][w0 rows of the shard][H], w1 [E_l][H][F/tp]. Kept by pointer: they must outlive the calls.
  // A null pointer keeps that layer's current weights (the split layer calls pass one at a time).
  // With MoeOptions::dtype e4m3, w0 holds e4m3 codes in the same layout and w0_scales its fp32 scales of
  // 128 x 128 blocks of each expert's [w0 rows][H], [E_l][ceil(w0 rows / 128)][H / 128] (fp8.hpp's
  // quantize_weights over the local layout; kernels/fp8_quantize.hpp makes them on the GPU).
  void set_weights(int rank, const void* w0, const void* w1, const float* w0_scales = nullptr);

  // The layer for this process's one rank (IpcTeam, or a team of one), ordered on `stream`.
  void forward(const RankBatch& batch, cudaStream_t stream);
  // The layer for every local rank (batches[i] belongs to team.local_ranks()[i]), ordered on `stream`
  // (nullptr: the legacy default stream).
  void forward(const std::vector<RankBatch>& batches, cudaStream_t stream = nullptr);
  // The layer in two calls on `stream`: dispatch + GEMM0 + activation, then GEMM1 + combine. The second
  // uses the routing the first staged (the same ranks' batches, token counts and ids; out is written).
  void forward_layer0(const std::vector<RankBatch>& batches, cudaStream_t stream = nullptr);
  void forward_layer1(const std::vector<RankBatch>& batches, cudaStream_t stream = nullptr);

  // Gradients of the last forward (whole layer, MoeOptions::training) with respect to x, the gates and
  // the local expert weights, for this process's one rank / for every local rank, ordered on `stream`.
  // The backward of layer 1 is layer 0's fused kernel with other operands (dispatch of the output
  // gradient rows overlapped with the GEMM against W1, activation backward and gate gradient in the
  // epilogue); the backward of layer 0 is layer 1's (GEMM against W0, combine of the input-gradient rows
  // with unit weights). It consumes the forward's saved activations: a second backward of the same
  // forward is refused.
  void backward(const RankGrad& grad, cudaStream_t stream, const BackwardOptions& options = {});
  void backward(const std::vector<RankGrad>& grads, cudaStream_t stream = nullptr,
                const BackwardOptions& options = {});

  // Synchronises the local ranks and raises what the device reported since the last check (timeouts,
  // bad routing): the first error is kept through later calls until this reads it. A failed call
  // writes NaN into its outputs (out; a backward's dx and dgates) on the ranks that saw the failure,
  // never stale sums. After raising, the layer is ready for the next call: the error is cleared and
  // every local rank's flags start afresh (a timed-out kernel may have left counts behind).
  void sync_and_check();

  // What the planner decided for the last launch of a layer on a local rank (tile, comm blocks,
  // schedule, where the choice came from).
  // layer: 0, 1, or the backward's launches 2 (backward of layer 1) and 3 (of layer 0), comet/tune.hpp.
  const LaunchDecision& last_decision(int rank, int layer) const;
  // Device memory this layer holds per local rank that computes (its private buffers and its symmetric
  // ones): layer_footprint(shape, parallel, capacity, training).total() (comet/footprint.hpp).
  size_t device_bytes_per_rank() const;

  // Collective (every process, in the same order as the team's other collective calls): frees the
  // layer's symmetric buffers (Team::free_symmetric) and its private ones; any later call is refused.
  // The destructor does the same on a team of one process. On a team that spans processes (IpcTeam)
  // the destructor frees only the private buffers and leaves the symmetric ones to the team (released
  // by IpcTeam::close or its destructor), since freeing them needs every peer: call close() on every
  // rank to give them back earlier. A second close() does nothing.
  void close();

  const MoeShape& shape() const;
  const Parallel& parallel() const;
  const MoeCapacity& capacity() const;  // with max_rows_per_rank resolved
  const MoeOptions& options() const;
  Team& team() const;

  // The per-step interface (src/ops/moe_engine.hpp) that the baselines, benchmarks and tests drive.
  // Internal: not a stable API.
  MoeEngine& engine() const { return *engine_; }

 private:
  std::unique_ptr<MoeEngine> engine_;
};

}  // namespace comet
