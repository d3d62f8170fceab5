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

// Which compute block runs what, when the tail is split: block c of n first takes the whole tiles c,
// c + n, ... (as without a split), then parts. The parts go first to the blocks with one whole tile
// fewer (up to `splits` parts each, i.e. about one tile's work), then round the grid: so a split never
// lengthens the longest block, also when comm blocks leave fewer compute blocks than the rule's wave.
struct TailAssignment {
  int n;       // compute blocks
  int whole;   // whole tiles
  int parts;   // split tiles x splits
  int splits;
  COMET_HD int rem() const { return whole % n; }          // blocks [0, rem) have one whole tile more
  COMET_HD int slack() const { return rem() == 0 ? n : n - rem(); }  // blocks with a free slot
  COMET_HD int first_slack() const { return rem(); }
  COMET_HD int phase_a() const {  // parts dealt over the slack blocks, round-robin
    const long long cap = (long long)slack() * splits;
    return parts < cap ? parts : int(cap);
  }
  COMET_HD int whole_of(int c) const { return whole / n + (c < rem() ? 1 : 0); }
  COMET_HD int phase_a_of(int c) const {
    const int s = c - first_slack();
    const int a = phase_a();
    return s < 0 || s >= a ? 0 : (a - s + slack() - 1) / slack();
  }
  COMET_HD int phase_b_of(int c) const {  // the rest, round-robin over all blocks from block 0
    const int b = parts - phase_a();
    return c >= b ? 0 : (b - c + n - 1) / n;
  }
  COMET_HD int items_of(int c) const { return whole_of(c) + phase_a_of(c) + phase_b_of(c); }
  COMET_HD int max_items() const {
    const int a = items_of(0), b = items_of(first_slack() < n ? first_slack() : 0);
    return a > b ? a : b;
  }
  // Item i of block c: a whole tile's index (>= 0), a part's index encoded as -2 - part, or -1: none.
  COMET_HD int item(int c, int i) const {
    const int w = whole_of(c);
    if (i < w) return c + i * n;
    i -= w;
    const int a = phase_a_of(c);
    if (i < a) return -2 - ((c - first_slack()) + i * slack());
    i -= a;
    if (i < phase_b_of(c)) return -2 - (phase_a() + c + i * n);
    return -1;
  }
};

// K-tiles [begin, end) of part p of `splits` over k_tiles.
COMET_HD inline int tail_split_k_begin(int part, int splits, int k_tiles) { return int((long long)part * k_tiles / splits); }

}  // namespace comet::kernels
