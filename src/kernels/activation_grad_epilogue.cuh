// The backward of layer 1 with the activation's backward in the GEMM's epilogue (BackwardOptions::
// fused_activation): the compute blocks of layer 0's kernel make D = G W1_e and, per tile, turn it
// into what activation_grad (grad_rows.cu) makes from a stored D in a second pass over HBM:
//   dPre = act'(z) . g D  over the saved pre-activations z, in place (pre)
//   g h                   over the saved hidden rows h, in place (hid)
//   <h, D>                the row's gate partial over the tile's columns, into gate_partials[row][n_block]
//                         (ship_gate_grads sums a row's N-blocks in order: deterministic)
// D itself is never stored. Per element the arithmetic is activation_grad's, on D rounded to bf16 as
// that pass reads it, so dPre and g h (hence dx, dW0 and dW1) are bitwise those of the two-pass path;
// only the gate partials are summed in another order.
//
// The accesses follow store_tile (epilogue.cuh): each consumer warp stages 16 rows x 64 columns of D
// (bf16) in its slab, then its lanes take 8-column units (4 units each, 4 different rows): one 16-byte
// load of h and of z per unit (two for swiglu's gate and up), all issued before their stores.
// Padding rows are not written here (the tiles cover an expert's real rows only): MoeEngine::grad_layer1
// zeroes those of pre and hid before the launch, for the weight gradients.
#pragma once

#include <cuda_bf16.h>

#include <cute/tensor.hpp>

#include "comet/plan.hpp"
#include "kernels/activation_math.cuh"
#include "kernels/bf16x8.cuh"
#include "kernels/compute_role.cuh"
#include "kernels/gemm_config.cuh"
#include "kernels/layer_args.hpp"

namespace comet::kernels {

struct ActivationGradStore {
  EpilogueOp act;               // the forward's activation (swiglu, gelu or silu)
  __nv_bfloat16* pre;           // [rows][pre_ld]: z in, dPre out
  int pre_ld;                   // N0_s: 2 F_s for swiglu (gate / up interleaved in groups of 8), else F_s
  __nv_bfloat16* hid;           // [rows][n_cols]: h in, g h out
  int n_cols;                   // F_s, N of the GEMM
  float* gate_partials;         // [rows][gate_ld]
  int gate_ld;                  // >= the launch's N-blocks
  int topk;
  const int32_t* row_unit;      // the plan's (PlanView)
  const int32_t* row_slot;
  const float* unit_gates;

  template <class Cfg, class Acc>
  __device__ void apply(const Acc& acc, const TileCoord& tile, int mma_thread, char* staging) const {
    using namespace cute;
    static_assert(Cfg::TileM == kEpilogueWarps * kEpilogueRows && Cfg::TileN % kEpilogueCols == 0);
    constexpr int kUnits = kEpilogueCols / 8;              // 8-column units per staged row
    constexpr int kPerLane = kEpilogueRows * kUnits / 32;  // units per lane per chunk: rows lane/8 + 4i
    static_assert(kUnits == 8 && kPerLane == 4);
    typename Cfg::TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(mma_thread);
    Tensor coords = thread_mma.partition_C(make_identity_tensor(take<0, 2>(typename Cfg::TileShape{})));

    const int warp = mma_thread / 32, lane = mma_thread % 32;
    const int rows = min(kEpilogueRows, tile.rows - warp * kEpilogueRows);
    if (rows <= 0) return;
    char* slab = staging + warp * kEpiloguePitch * kEpilogueRows;
    const int row0 = tile.m_block * Cfg::TileM + warp * kEpilogueRows;
    const int c_first = get<1>(coords(0));  // every element's column is c_first + a multiple of 8
    const bool gated = act == EpilogueOp::swiglu;

    // The gate of each of this lane's 4 rows (they are the same in every chunk), and their partials.
    float g[kPerLane], partial[kPerLane];
    CUTE_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      partial[i] = 0.f;
      g[i] = 0.f;
      const int r = lane / kUnits + 4 * i;
      if (r < rows) {
        const int row = row0 + r, unit = row_unit[row];
        if (unit >= 0) g[i] = unit_gates[size_t(unit) * topk + row_slot[row]];
      }
    }

    CUTE_UNROLL
    for (int q = 0; q < Cfg::TileN / kEpilogueCols; ++q) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); i += 2) {  // D rounded to bf16, as activation_grad reads it
        const int off = get<1>(coords(i)) - c_first;
        if (off / kEpilogueCols != q) continue;  // folds away once unrolled
        const int r = get<0>(coords(i)) - warp * kEpilogueRows;
        *reinterpret_cast<__nv_bfloat162*>(slab + r * kEpiloguePitch + (c_first + off % kEpilogueCols) * 2) =
            __floats2bfloat162_rn(acc(i), acc(i + 1));
      }
      __syncwarp();
      const int u = lane % kUnits;
      const int col = tile.n_block * Cfg::TileN + q * kEpilogueCols + u * 8;  // D / h column of the unit
      uint4 dv[kPerLane], hv[kPerLane], zg[kPerLane], zu[kPerLane];
      bool live[kPerLane];
      CUTE_UNROLL
      for (int i = 0; i < kPerLane; ++i) {  // every load first: 8-12 16-byte loads in flight per lane
        const int r = lane / kUnits + 4 * i;
        live[i] = r < rows && col < n_cols;
        if (!live[i]) continue;
        const size_t row = size_t(row0 + r);
        dv[i] = *reinterpret_cast<const uint4*>(slab + r * kEpiloguePitch + u * 16);
        hv[i] = *reinterpret_cast<const uint4*>(hid + row * n_cols + col);
        if (gated) {  // gate columns [16 (col / 8), +8), their up partners 8 further
          zg[i] = *reinterpret_cast<const uint4*>(pre + row * pre_ld + 2 * col);
          zu[i] = *reinterpret_cast<const uint4*>(pre + row * pre_ld + 2 * col + 8);
        } else {
          zg[i] = *reinterpret_cast<const uint4*>(pre + row * pre_ld + col);
        }
      }
      CUTE_UNROLL
      for (int i = 0; i < kPerLane; ++i) {
        if (!live[i]) continue;
        const size_t row = size_t(row0 + lane / kUnits + 4 * i);
        float dh[8], h[8];
        unpack_bf16x8(dv[i], dh);
        unpack_bf16x8(hv[i], h);
        CUTE_UNROLL
        for (int v = 0; v < 8; ++v) {
          partial[i] += h[v] * dh[v];  // D before the gate scales it
          dh[v] *= g[i];
          h[v] *= g[i];
        }
        *reinterpret_cast<uint4*>(hid + row * n_cols + col) = pack_bf16x8(h);
        if (gated) {
          float a[8], b[8];
          unpack_bf16x8(zg[i], a);
          unpack_bf16x8(zu[i], b);
          CUTE_UNROLL
          for (int v = 0; v < 8; ++v) {
            const float gate = a[v];
            a[v] = dh[v] * b[v] * silu_grad(gate);
            b[v] = dh[v] * silu(gate);
          }
          *reinterpret_cast<uint4*>(pre + row * pre_ld + 2 * col) = pack_bf16x8(a);
          *reinterpret_cast<uint4*>(pre + row * pre_ld + 2 * col + 8) = pack_bf16x8(b);
        } else {
          float z[8];
          unpack_bf16x8(zg[i], z);
          CUTE_UNROLL
          for (int v = 0; v < 8; ++v) z[v] = dh[v] * (act == EpilogueOp::gelu ? gelu_tanh_grad(z[v]) : silu_grad(z[v]));
          *reinterpret_cast<uint4*>(pre + row * pre_ld + col) = pack_bf16x8(z);
        }
      }
      __syncwarp();  // the slab is read before the next chunk overwrites it
    }
    // A row's partial is spread over the 8 lanes of its unit group (lane / 8 fixed): sum them in a fixed
    // order and let the group's first lane store it.
    CUTE_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      float p = partial[i];
      CUTE_UNROLL
      for (int off = 1; off < kUnits; off *= 2) p += __shfl_xor_sync(0xffffffffu, p, off);
      const int r = lane / kUnits + 4 * i;
      if (lane % kUnits == 0 && r < rows) gate_partials[size_t(row0 + r) * gate_ld + tile.n_block] = p;
    }
  }
};

}  // namespace comet::kernels
