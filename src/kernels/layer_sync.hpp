// The flags that order one rank's fused launches: what each word means, who writes it, who waits on
// it, and how many a layer needs. epoch, tile_ready and tile_done are 64-bit generation counters
// compared with ">= the call's epoch" (never cleared between calls: no reset kernel, no race between a
// reset and the next call; 64 bits never wrap); tile_arrived is a count that the row completing a
// tile resets. A call that fails part-way (a timeout) can leave counts behind: the engine zeroes the
// whole block when it reports the failure (MoeEngine::recover), epoch included.
//
//   epoch         [1]                   the rank's generation; prepare() bumps it on the stream
//   tile_ready    [max_tiles]           layer 0: epoch of the last call whose rows of m are all in A
//                                       (comm blocks release it; compute blocks wait on it)
//   tile_done     [max_tiles][n_blocks] layer 1: epoch of the last call that finished tile (m, n)
//                                       (compute blocks release it; comm blocks wait on it)
//   tile_arrived  [max_tiles]  (int32)  layer 0: remote rows of M-tile m landed in this call
//                                       (comm blocks count them; the last one resets it to 0)
//   combine_batches [2]        (int32)  layer 1 in one launch: [0] combine batches taken, [1] warps
//                                       done taking; the last warp done resets both to 0
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/layer_args.hpp"

namespace comet::kernels {

struct LayerSync {
  Epoch* epoch = nullptr;
  Epoch* tile_ready = nullptr;
  Epoch* tile_done = nullptr;
  int32_t* tile_arrived = nullptr;
  int32_t* combine_batches = nullptr;

  // Bytes for a rank whose gathered buffer holds max_tiles M-tiles and whose layer-1 GEMM has at most
  // max_n_blocks column blocks.
  static size_t bytes(int max_tiles, int max_n_blocks) {
    return sizeof(Epoch) * (1 + size_t(max_tiles) + size_t(max_tiles) * max_n_blocks) +
           sizeof(int32_t) * (size_t(max_tiles) + 2);
  }
  // The flags laid out in one zeroed, 8-byte aligned allocation of bytes() bytes.
  static LayerSync carve(void* base, int max_tiles, int max_n_blocks) {
    LayerSync s;
    s.epoch = static_cast<Epoch*>(base);
    s.tile_ready = s.epoch + 1;
    s.tile_done = s.tile_ready + max_tiles;
    s.tile_arrived = reinterpret_cast<int32_t*>(s.tile_done + size_t(max_tiles) * max_n_blocks);
    s.combine_batches = s.tile_arrived + max_tiles;
    return s;
  }
};

}  // namespace comet::kernels
