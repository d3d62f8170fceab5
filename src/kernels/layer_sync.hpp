// The flags that order one rank's fused launches: what each word means, who writes it, who waits on
// it, and how many a layer needs. All of them are generation counters compared with ">= the call's
// epoch" (never cleared between calls: no reset kernel, no race between a reset and the next call),
// except tile_arrived, which the row that completes a tile resets.
//
//   epoch         [1]                   the rank's generation; prepare() bumps it on the stream
//   tile_arrived  [max_tiles]           layer 0: remote rows of M-tile m landed in this call
//                                       (comm blocks count them; the last one resets it to 0)
//   tile_ready    [max_tiles]           layer 0: epoch of the last call whose rows of m are all in A
//                                       (comm blocks release it; compute blocks wait on it)
//   tile_done     [max_tiles][n_blocks] layer 1: epoch of the last call that finished tile (m, n)
//                                       (compute blocks release it; comm blocks wait on it)
#pragma once

#include <cstddef>
#include <cstdint>

namespace comet::kernels {

struct LayerSync {
  int32_t* epoch = nullptr;
  int32_t* tile_arrived = nullptr;
  int32_t* tile_ready = nullptr;
  int32_t* tile_done = nullptr;

  // Words for a rank whose gathered buffer holds max_tiles M-tiles and whose layer-1 GEMM has at most
  // max_n_blocks column blocks.
  static size_t words(int max_tiles, int max_n_blocks) {
    return 1 + 2 * size_t(max_tiles) + size_t(max_tiles) * max_n_blocks;
  }
  // The flags laid out in one zeroed allocation of words() int32 words.
  static LayerSync carve(int32_t* base, int max_tiles) {
    LayerSync s;
    s.epoch = base;
    s.tile_arrived = base + 1;
    s.tile_ready = s.tile_arrived + max_tiles;
    s.tile_done = s.tile_ready + max_tiles;
    return s;
  }
};

}  // namespace comet::kernels
