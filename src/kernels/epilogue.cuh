// Epilogues of the fused GEMMs: fp32 accumulators -> activation -> bf16 rows in global memory.
// Each consumer thread stores pairs of adjacent columns (4 bytes) straight from registers; the
// coordinates of every accumulator come from CuTe's partition of an identity tile, so nothing here
// depends on knowing the wgmma register layout by heart.
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

// Writes the tile's valid rows to out[row0 + m][col] (row stride ld). n_cols is the number of B rows
// (N of the GEMM); for swiglu the output has n_cols / 2 columns.
template <class Cfg, class Acc>
__device__ void store_tile(const Acc& acc, int mma_thread, const TileCoord& tile, EpilogueOp op,
                           __nv_bfloat16* out, int ld, int n_cols) {
  using namespace cute;
  typename Cfg::TiledMma tiled_mma;
  auto thread_mma = tiled_mma.get_slice(mma_thread);
  Tensor coords = thread_mma.partition_C(make_identity_tensor(take<0, 2>(typename Cfg::TileShape{})));
  static_assert(decltype(size(coords))::value == decltype(size(acc))::value);
  static_assert(decltype(size(acc))::value % 8 == 0);
  const int row0 = tile.m_block * Cfg::TileM;
  const int col0 = tile.n_block * Cfg::TileN;

  if (op == EpilogueOp::swiglu) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 8) {
      CUTE_UNROLL
      for (int v = 0; v < 4; v += 2) {  // (v, v+1): two adjacent gate columns; +4: their up partners
        const int m = get<0>(coords(i + v));
        const int c = col0 + get<1>(coords(i + v));
        if (m < tile.rows && c < n_cols) {
          const int out_col = (c / 16) * 8 + (c % 8);
          store_bf16x2(out + size_t(row0 + m) * ld + out_col, silu(acc(i + v)) * acc(i + v + 4),
                       silu(acc(i + v + 1)) * acc(i + v + 5));
        }
      }
    }
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {  // (i, i+1): two adjacent columns of one row
      const int m = get<0>(coords(i));
      const int c = col0 + get<1>(coords(i));
      if (m < tile.rows && c < n_cols) {
        store_bf16x2(out + size_t(row0 + m) * ld + c, apply(op, acc(i)), apply(op, acc(i + 1)));
      }
    }
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
  __device__ void apply(const Acc& acc, const TileCoord& tile, int mma_thread) const {
    store_tile<Cfg>(acc, mma_thread, tile, act, hid, hid_ld, n_cols);
    if (pre) store_tile<Cfg>(acc, mma_thread, tile, EpilogueOp::none, pre, n_cols, n_cols);
  }
};

}  // namespace comet::kernels
