// The tail split of layer 1's kernel (the forward's layer 1 and the backward's launch 3): where the
// last wave of GEMM tiles would leave most SMs idle, the tiles of the last few column blocks are cut
// along K into `splits` parts that run side by side; the part that finishes last sums the parts' fp32
// partials in a fixed order (part 0 first) and runs the tile's epilogue. Example: Phi-3.5 EP 8 at 1024
// tokens has 288 tiles of 128 x 256 (18 M-tiles x 16 column blocks) on 132 SMs, 3 waves for 2.2 waves
// of work; with its last 2 column blocks (36 tiles) split 3 ways the grid runs about 2.33.
//
// Which tiles are split is a function of (M-tiles, N-blocks, K-tiles, the grid's resident blocks) and
// nothing else: not of n_comm, the groups or the tile order, so results stay bitwise equal across
// them. A split tile sums K in another order than an unsplit one, so the bits do depend on the batch
// (through the M-tile count), on the tile width and on whether a CUTLASS standalone GEMM (which never
// splits) ran instead: MoeOptions::batch_invariant and MoeOptions::tail_split = false turn it off.
#pragma once

#include <cstddef>

#include "comet/hd.hpp"
#include "kernels/layer_args.hpp"

namespace comet::kernels {

// Partial tiles the workspace holds: one per SM of an H100 / H200 (a GPU with more SMs splits less).
inline constexpr int kTailSplitSlots = 132;
inline constexpr int kTailSplitMaxTileElems = 128 * 256;  // the widest compiled tile
inline constexpr int kTailSplitMinKTiles = 4;  // a part runs at least 4 K-tiles (256 of K): shorter parts
                                               // cost more in partial traffic than they save
inline constexpr int kTailSplitMaxSplits = 8;

inline constexpr size_t tail_split_workspace_bytes() {
  return size_t(kTailSplitSlots) * kTailSplitMaxTileElems * sizeof(float);
}

// What layer 1's kernel needs to split its tail (slots 0: no split).
struct TailSplitArgs {
  float* partials = nullptr;   // [slots][TileM * TileN] fp32: part p of split tile u at slot u * splits + p
  int32_t* arrivals = nullptr;  // [kTailSplitSlots] parts of split tile u finished in this call (the last
                                // part resets it to 0; MoeEngine::recover zeroes it after a failure)
  int slots = 0;               // partial tiles `partials` holds for this launch's tile width
  int sms = 0;                 // the wave width of the rule: the grid's resident blocks, whatever n_comm
};

// The tiles of column blocks >= n_cut (every M-tile of them: `units` tiles) run as `splits` parts each.
// Whole column blocks, so that the set does not depend on the order the tiles run in, and so that the
// split tiles are the columns the comm blocks ship last anyway.
struct TailSplit {
  int n_cut = 0;
  int units = 0;
  int splits = 1;
};

COMET_HD inline TailSplit tail_split_rule(int m_tiles, int n_blocks, int k_tiles, int sms, int slots) {
  TailSplit none{n_blocks, 0, 1};
  if (slots <= 0 || sms <= 0 || m_tiles <= 0 || n_blocks <= 0) return none;
  const int tail = int((long long)m_tiles * n_blocks % sms);  // tiles of the last wave
  if (tail == 0) return none;
  const int cols = (tail + m_tiles - 1) / m_tiles;
  const int units = cols * m_tiles;
  int splits = (sms < slots ? sms : slots) / units;
  if (splits > k_tiles / kTailSplitMinKTiles) splits = k_tiles / kTailSplitMinKTiles;
  if (splits > kTailSplitMaxSplits) splits = kTailSplitMaxSplits;
  if (splits < 2) return none;
  return TailSplit{n_blocks - cols, units, splits};
}

// K-tiles [begin, end) of part p of `splits` over k_tiles.
COMET_HD inline int tail_split_k_begin(int part, int splits, int k_tiles) { return int((long long)part * k_tiles / splits); }

}  // namespace comet::kernels
