// Epilogues of the fused GEMMs: fp32 accumulators -> activation -> bf16 rows in global memory.
// The coordinates of every accumulator come from CuTe's partition of an identity tile, so nothing here
// depends on knowing the wgmma register layout by heart, except the fact (PTX ISA, wgmma m64 D
// fragments) that consumer warp w holds rows [16w, 16w + 16) of the tile, and within them columns
// that start below 8 and step by multiples of 8.
//
// The stores go through shared memory. Straight from registers, a warp's store of adjacent column
// pairs covers 8 rows x 16 bytes (8 half-filled sectors); with a short K (TP 8's layer 1: K = F/8) those
// stores took as long as the mainloop. So each warp writes 16 rows x 64 columns into its own slab
// (kEpilogue* in gemm_config.cuh; no block barrier, only __syncwarp), then stores whole 128-byte row
// segments with 16-byte stores: 4 rows per instruction.
//
// SwiGLU: W0's rows are interleaved in blocks of 8 (weight_layout.hpp): B rows [16b, 16b+8) are gate
// rows [8b, 8b+8) and B rows [16b+8, 16b+16) the matching up rows. In the wgmma accumulator layout a
// thread holding column c (c % 16 < 8) also holds column c + 8, four registers further on, so
// silu(gate) * up is formed in registers and output column (c / 16) * 8 + c % 8 is written.
#pragma once

#include <cuda_bf16.h>

#include <cute/tensor.hpp>

#include "comet/shape.hpp"
#include "kernels/activation_math.cuh"
#include "kernels/compute_role.cuh"
#include "kernels/layer_args.hpp"

namespace comet::kernels {

__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ float2 load_bf16x2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

__device__ __forceinline__ float apply(EpilogueOp op, float z) {
  switch (op) {
    case EpilogueOp::gelu: return gelu_tanh(z);
    case EpilogueOp::silu: return silu(z);
    default: return z;
  }
}

// Writes the tile's valid rows to out[row0 + m][col] (row stride ld, a multiple of 8 like n_cols:
// fused_launch.cuh checks both). n_cols is the number of B rows (N of the GEMM); for swiglu the output
// has n_cols / 2 columns. `staging` is the block's kEpilogueStagingBytes of shared memory.
template <class Cfg, class Acc>
__device__ void store_tile(const Acc& acc, int mma_thread, const TileCoord& tile, EpilogueOp op,
                           __nv_bfloat16* out, int ld, int n_cols, char* staging) {
  using namespace cute;
  static_assert(Cfg::TileM == kEpilogueWarps * kEpilogueRows && Cfg::TileN % kEpilogueCols == 0);
  typename Cfg::TiledMma tiled_mma;
  auto thread_mma = tiled_mma.get_slice(mma_thread);
  Tensor coords = thread_mma.partition_C(make_identity_tensor(take<0, 2>(typename Cfg::TileShape{})));
  static_assert(decltype(size(coords))::value == decltype(size(acc))::value);
  static_assert(decltype(size(acc))::value % 8 == 0);

  const int warp = mma_thread / 32, lane = mma_thread % 32;
  const int rows = min(kEpilogueRows, tile.rows - warp * kEpilogueRows);  // valid rows of this warp's 16
  if (rows <= 0) return;
  char* slab = staging + warp * kEpilogueRows * kEpiloguePitch;
  const bool swiglu = op == EpilogueOp::swiglu;
  const int chunk_cols = swiglu ? kEpilogueCols / 2 : kEpilogueCols;  // output columns per slab
  const int out_cols = swiglu ? n_cols / 2 : n_cols;
  const int out_col0 = tile.n_block * (swiglu ? Cfg::TileN / 2 : Cfg::TileN);
  __nv_bfloat16* out_rows = out + size_t(tile.m_block * Cfg::TileM + warp * kEpilogueRows) * ld;

  // Element i's column lies at a compile-time offset from this thread's first one (the loops are
  // unrolled, so the chunk tests below fold away).
  const int c_first = get<1>(coords(0));
  auto row_of = [&](int i) { return get<0>(coords(i)) - warp * kEpilogueRows; };  // in the warp's 16 rows
  auto col_off = [&](int i) { return get<1>(coords(i)) - c_first; };  // a multiple of 8
  auto slab_at = [&](int r, int col) { return reinterpret_cast<__nv_bfloat162*>(slab + r * kEpiloguePitch + col * 2); };

  CUTE_UNROLL
  for (int q = 0; q < Cfg::TileN / kEpilogueCols; ++q) {
    if (swiglu) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); i += 8) {
        if (col_off(i) / kEpilogueCols != q) continue;
        CUTE_UNROLL
        for (int v = 0; v < 4; v += 2) {  // (v, v+1): two adjacent gate columns; +4: their up partners
          const int c = c_first + col_off(i + v) % kEpilogueCols;  // in the slab's 64 B columns, c % 16 < 8
          *slab_at(row_of(i + v), (c / 16) * 8 + c % 8) = __floats2bfloat162_rn(
              silu(acc(i + v)) * acc(i + v + 4), silu(acc(i + v + 1)) * acc(i + v + 5));
        }
      }
    } else {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); i += 2) {  // (i, i+1): two adjacent columns of one row
        if (col_off(i) / kEpilogueCols != q) continue;
        *slab_at(row_of(i), c_first + col_off(i) % kEpilogueCols) =
            __floats2bfloat162_rn(apply(op, acc(i)), apply(op, acc(i + 1)));
      }
    }
    __syncwarp();
    const int units = chunk_cols / 8;  // 16-byte units per staged row
    for (int u = lane; u < kEpilogueRows * units; u += 32) {
      const int r = u / units, col = out_col0 + q * chunk_cols + (u % units) * 8;
      if (r < rows && col < out_cols)
        *reinterpret_cast<uint4*>(out_rows + size_t(r) * ld + col) =
            *reinterpret_cast<const uint4*>(slab + r * kEpiloguePitch + (u % units) * 16);
    }
    __syncwarp();  // the slab is read before the next chunk overwrites it
  }
}

}  // namespace comet::kernels

namespace comet::kernels {

// ---- the epilogues of the fused layer-0 kernel (layer0_kernel.cuh: Epi) -------------------------------

// Forward: the activation into the hidden rows; in training also the pre-activations (bf16, the
// backward's input to the activation's derivative: saving them is cheaper than a second GEMM0).
// The backward of layer 1 uses it too, with act none and no pre: D = G W1_e stored as bf16 rows, which
// activation_grad (grad_rows.hpp) then turns into dPre, g h and the gate partials at HBM speed (an
// epilogue that loaded h and z per register pair held its GEMM to 26-45 % of the forward's rate).
struct ActivationStore {
  EpilogueOp act;
  __nv_bfloat16* hid;  // [rows][hid_ld]
  int hid_ld;
  int n_cols;          // N of the GEMM (W0 rows of the shard)
  __nv_bfloat16* pre;  // [rows][n_cols], or null (inference)

  template <class Cfg, class Acc>
  __device__ void apply(const Acc& acc, const TileCoord& tile, int mma_thread, char* staging) const {
    store_tile<Cfg>(acc, mma_thread, tile, act, hid, hid_ld, n_cols, staging);
    if (pre) store_tile<Cfg>(acc, mma_thread, tile, EpilogueOp::none, pre, n_cols, n_cols, staging);
  }
};

}  // namespace comet::kernels
