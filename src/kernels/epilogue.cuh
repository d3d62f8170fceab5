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
#include "kernels/compute_role.cuh"
#include "kernels/layer_args.hpp"
#include "ptx/math.cuh"

namespace comet::kernels {

// Fast-math forms (no slow-path calls in the epilogue); their error is far below bf16's rounding.
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }
__device__ __forceinline__ float gelu_tanh(float z) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * z * (1.0f + dev::tanh_approx(c * (z + 0.044715f * z * z * z)));
}

__device__ __forceinline__ void store_bf16x2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
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

__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }
// d/dz of the forward's forms above (the tanh form of GELU).
__device__ __forceinline__ float silu_grad(float z) {
  const float s = sigmoid(z);
  return s * (1.0f + z * (1.0f - s));
}
__device__ __forceinline__ float gelu_tanh_grad(float z) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  const float t = dev::tanh_approx(c * (z + a * z * z * z));
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * c * (1.0f + 3.0f * a * z * z);
}

__device__ __forceinline__ float2 load_bf16x2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

// Backward of layer 1 and of the activation, on the tile D = G W1_e (G: the rows' output gradients,
// unscaled; D's columns are the shard's F columns). Per row (gate g of its (token, slot)), with the
// forward's saved pre-activations z and hidden rows h:
//   dgate partial = <h, D> over the tile's columns (y = W1 h, so <dout, y> = <W1^T dout, h>)
//   dz = act'(z) . (g D)             written over z: the backward of layer 0 reads it as its A
//   h  = g h                         written over h: dW1 = G^T (g h), the gate folded into one operand
// Padding rows get zeros in both, so that the weight-gradient GEMMs may run K over whole tiles.
// The gate partials are per (row, column block): summed later in block order, so that the gate
// gradient does not depend on which block finished first.
struct ActivationBackward {
  EpilogueOp act;      // the forward's activation
  __nv_bfloat16* pre;  // [rows][pre_ld]: z in, dz out (swiglu: gate and up interleaved, weight_layout.hpp)
  int pre_ld;
  __nv_bfloat16* hid;  // [rows][f_cols]: h in, g h out
  int f_cols;
  float* gate_partials;  // [rows][gate_blocks]
  int gate_blocks;
  const int32_t* row_unit;
  const int32_t* row_slot;
  const float* unit_gates;
  int topk;

  template <class Cfg, class Acc>
  __device__ void apply(const Acc& acc, const TileCoord& tile, int mma_thread) const {
    using namespace cute;
    typename Cfg::TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(mma_thread);
    Tensor coords = thread_mma.partition_C(make_identity_tensor(take<0, 2>(typename Cfg::TileShape{})));
    const int row0 = tile.m_block * Cfg::TileM;
    const int col0 = tile.n_block * Cfg::TileN;
    // Each thread holds two rows of the tile (wgmma's accumulator layout: rows r and r + 8 of its
    // warp's 16), and the four lanes of a quad hold all columns of the same two rows.
    const int rows[2] = {get<0>(coords(0)), get<0>(coords(2))};
    float gate[2], part[2] = {0.f, 0.f};
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + rows[h];
      gate[h] = rows[h] < tile.rows ? unit_gates[size_t(row_unit[row]) * topk + row_slot[row]] : 0.f;
    }
    // The loads of a batch of kBatch column pairs are issued before any of its stores: the stores may
    // alias later loads as far as the compiler knows, so one loop of load-compute-store would wait a
    // global-memory latency per pair (measured: the backward of layer 1 at 40 % of the GEMM's rate).
    constexpr int kBatch = 16;
    static_assert(decltype(size(acc))::value % (2 * kBatch) == 0);
    const bool gated = act == EpilogueOp::swiglu;
    CUTE_UNROLL
    for (int base = 0; base < size(acc); base += 2 * kBatch) {
      uint32_t h_in[kBatch], z_in[kBatch], up_in[kBatch];  // raw bf16 pairs
      CUTE_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        const int i = base + 2 * b, m = get<0>(coords(i)), c = col0 + get<1>(coords(i));
        if (c >= f_cols || m >= tile.rows) continue;
        const size_t row = size_t(row0 + m);
        const int zc = gated ? (c / 8) * 16 + c % 8 : c;  // gate column; up is zc + 8
        h_in[b] = *reinterpret_cast<const uint32_t*>(hid + row * f_cols + c);
        z_in[b] = *reinterpret_cast<const uint32_t*>(pre + row * pre_ld + zc);
        if (gated) up_in[b] = *reinterpret_cast<const uint32_t*>(pre + row * pre_ld + zc + 8);
      }
      CUTE_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        const int i = base + 2 * b, m = get<0>(coords(i)), c = col0 + get<1>(coords(i));
        if (c >= f_cols) continue;
        const int h = m == rows[0] ? 0 : 1;
        const size_t row = size_t(row0 + m);
        __nv_bfloat16* hp = hid + row * f_cols + c;
        __nv_bfloat16* zp = pre + row * pre_ld + (gated ? (c / 8) * 16 + c % 8 : c);
        if (m >= tile.rows) {
          store_bf16x2(hp, 0.f, 0.f);
          store_bf16x2(zp, 0.f, 0.f);
          if (gated) store_bf16x2(zp + 8, 0.f, 0.f);
          continue;
        }
        const float2 hv = unpack_bf16x2(h_in[b]), z = unpack_bf16x2(z_in[b]);
        part[h] += hv.x * acc(i) + hv.y * acc(i + 1);
        const float g = gate[h];
        store_bf16x2(hp, g * hv.x, g * hv.y);
        const float d0 = g * acc(i), d1 = g * acc(i + 1);
        if (gated) {
          const float2 up = unpack_bf16x2(up_in[b]);
          store_bf16x2(zp, d0 * up.x * silu_grad(z.x), d1 * up.y * silu_grad(z.y));
          store_bf16x2(zp + 8, d0 * silu(z.x), d1 * silu(z.y));
        } else if (act == EpilogueOp::gelu) {
          store_bf16x2(zp, d0 * gelu_tanh_grad(z.x), d1 * gelu_tanh_grad(z.y));
        } else {
          store_bf16x2(zp, d0 * silu_grad(z.x), d1 * silu_grad(z.y));
        }
      }
    }
    const int lane = mma_thread % 32;
    if (__shfl_xor_sync(0xffffffffu, rows[0], 1) != rows[0] || __shfl_xor_sync(0xffffffffu, rows[0], 2) != rows[0])
      __trap();  // the layout assumption above does not hold for this MMA: never silently wrong
    for (int h = 0; h < 2; ++h) {
      part[h] += __shfl_xor_sync(0xffffffffu, part[h], 1);
      part[h] += __shfl_xor_sync(0xffffffffu, part[h], 2);
      if (lane % 4 == 0 && rows[h] < tile.rows)
        gate_partials[size_t(row0 + rows[h]) * gate_blocks + tile.n_block] = part[h];
    }
  }
};

}  // namespace comet::kernels
