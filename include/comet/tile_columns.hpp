// How many columns a GEMM of N columns computes in TileN-wide column blocks. Where the kernel narrows
// its last block (src/kernels/narrow_tail_mma.cuh), a partial last block runs 128-wide wgmmas (64-wide
// in 128-wide tiles) when its valid columns fit; the kernels and the cost model share these rules.
#pragma once

#include "comet/hd.hpp"

namespace comet {

// Which kernels narrow a partial last column block: every width of layer 1's kernel (comm kind 1: the
// forward's layer 1, the backward's launch 3) and the 256-wide tile of layer 0's (comm kind 0: the
// forward's layer 0, the backward's launch 2), in their peer-pointer builds. In layer 0's 128- and
// 192-wide kernels, the weight gradients' and the NVSHMEM build's, the narrow loops left ptxas short of
// registers and it serialised every wgmma of the kernel (C7511), so those keep the tile's width.
COMET_HD constexpr bool narrows_last_block(int comm_kind, int tile_n) { return comm_kind == 1 || tile_n == 256; }

// The one narrow width a kernel compiles (one more wgmma loop; a second one, 64 beside 128, cost ptxas
// the registers of the wide loop's pipeline in some kernels): 128, or 64 in 128-wide tiles.
COMET_HD constexpr int narrow_block_width(int tile_n) { return tile_n > 128 ? 128 : 64; }

// The wgmma width of a last column block with `valid` columns (1..tile_n) in a kernel that narrows it.
COMET_HD constexpr int tail_block_width(int tile_n, int valid) {
  return valid <= narrow_block_width(tile_n) ? narrow_block_width(tile_n) : tile_n;
}

// Columns computed for a GEMM of n columns: whole blocks, and the last block at its width (narrow: the
// kernel narrows it).
COMET_HD constexpr int computed_columns(int n, int tile_n, bool narrow) {
  const int whole = n / tile_n, rest = n - whole * tile_n;
  return whole * tile_n + (rest == 0 ? 0 : narrow ? tail_block_width(tile_n, rest) : tile_n);
}

}  // namespace comet
