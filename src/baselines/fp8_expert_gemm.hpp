// The fp8 expert GEMM baseline through cuBLASLt's block-scaled fp8 (Hopper, sm_90): what a user of
// cuBLASLt runs for comet's fp8 layer 0, so that comet's fp8 GEMM is compared with like.
//
// For each row block i = {expert e, row, rows} (expert_gemm.hpp's RowBlock), with fp32 accumulation:
//   C[row .. row + rows) [rows][n] bf16 = dequant(A rows) * dequant(B_e)^T
// where A is packed records (fp8::record_bytes(k) bytes a row: k e4m3 codes, then k / 128 fp32 scales of
// 1 x 128 blocks: kernels::quantize_rows_e4m3's output) and B_e is expert e's codes [n][k] e4m3 with
// scales [ceil(n / 128)][k / 128] fp32 of 128 x 128 blocks (kernels::quantize_weights_e4m3's output, one
// mat per expert: b_codes + e n k, b_scales + e ceil(n / 128) (k / 128)).
//
// cuBLASLt facts this relies on (cuBLAS 13.1 docs, section 3.1.4.5 "128-element 1D and 128x128 2D Block
// Scaling For FP8 Data Types", 3.1.4.5.1 "Scaling factors layouts", and cublasLtMatmul()'s fp8
// requirements; the same pairing as PyTorch's _scaled_mm 1x128 x 128x128 path):
//   - fp8 on Hopper is "TN" only: cuBLASLt's A transposed, B not, i.e. both operands K-major; compute
//     type CUBLAS_COMPUTE_32F, scale type CUDA_R_32F; D may be bf16 (not fp8) with these scale modes.
//   - cuBLASLt is column-major, so each block runs as C^T = B_e A^T (as expert_gemm.hpp's bf16 loop):
//     cuBLASLt's A is our B_e (stored k x n, ld k, OP_T; m = n), its B is our rows (stored k x rows,
//     ld k, OP_N), D is column-major n x rows with ld n = our row-major [rows][n].
//   - A_SCALE_MODE = BLK128x128_32F with B_SCALE_MODE = VEC128_32F is a supported pair (BLK/BLK is not).
//     BLK128x128 scales are K-major, shape L4 x ceil(M / 128), L4 = round_up(k / 128, 4): element
//     (m block p, k block j) at p L4 + j. This is exactly our [ceil(n / 128)][k / 128] when k / 128 is a
//     multiple of 4 (every model's H); otherwise run() first copies them into a padded scratch.
//     VEC128 scales of B are N-major, shape N x L: element (row r, k block j) at j N + r.
//   - M and N must be multiples of 4, scale pointers 16-byte aligned.
// What that costs a cuBLASLt user, and so counts in this baseline's time:
//   - An unpack kernel (fp8_unpack.cu) copies the blocks' records into a codes buffer [rows][k] and their
//     scales into the N-major layout above (the records interleave codes and scales per row).
//   - N = round_up(rows, 4): a block's rows are padded to a multiple of 4 in the unpack scratch (zero codes,
//     zero scales). A block whose rows are a multiple of 4 writes C directly; any other block (e.g. rows 1
//     or 17) writes a scratch [N][n] that one cudaMemcpyAsync then copies into C's rows (C has no room for
//     the pad rows).
// One cublasLtMatmul per non-empty block, each with a cached algorithm: heuristics are queried once per
// distinct (N, pointer alignments) and kept (cheap: the matmul descriptor is shared, only the two scale
// pointers are set per call).
//
// Scratch: the codes and scales buffers hold max_rows rows plus the pad rows of 256 blocks (growing if a
// call needs more), the output scratch the largest padded block seen (allocated on first need); growing
// synchronises the stream. One Fp8ExpertGemm serves one stream at a time.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <vector>

#include "baselines/expert_gemm.hpp"

namespace comet::baselines {

// One row block's part in the unpack: records [src_row, src_row + rows) go to scratch rows
// [dst_row, dst_row + rows_pad); rows_pad = round_up(rows, 4) > 0, dst_row a multiple of 4.
struct Fp8UnpackBlock {
  int src_row = 0;
  int rows = 0;
  int rows_pad = 0;
  int dst_row = 0;
};

// For each block (in increasing dst_row, each starting where the previous one's rows_pad end): codes
// rows dst_row + r = the records' codes ([..][k] e4m3), and scales + dst_row (k / 128) = the block's
// [k / 128][rows_pad] fp32 scales (cuBLASLt's VEC128 layout for its B, N-major); pad rows get zero codes
// and zero scales. records 16-byte aligned, fp8::record_bytes(k) bytes a row (fp8_unpack.cu).
void unpack_fp8_records(const void* records, int k, const std::vector<Fp8UnpackBlock>& blocks, void* codes,
                        float* scales, cudaStream_t stream);

// dst [experts][row_blocks][round_up(col_blocks, 4)] = src [experts][row_blocks][col_blocks], zeros in the
// padding (128 x 128 weight scales in cuBLASLt's BLK128x128 layout; fp8_unpack.cu).
void pad_fp8_weight_scales(const float* src, int experts, int row_blocks, int col_blocks, float* dst,
                           cudaStream_t stream);

class Fp8ExpertGemm {
 public:
  // n: a multiple of 16; k: a multiple of 128; max_rows: the most rows (summed over blocks) one run()
  // takes. Creates the cuBLASLt handle, the descriptors and a 32 MiB workspace; needs an sm_90 device.
  Fp8ExpertGemm(int max_rows, int n, int k);
  ~Fp8ExpertGemm();
  Fp8ExpertGemm(const Fp8ExpertGemm&) = delete;
  Fp8ExpertGemm& operator=(const Fp8ExpertGemm&) = delete;

  // Enqueues the unpack and one cublasLtMatmul per non-empty block on `stream` (see above). Pointers
  // 16-byte aligned; a_records holds every row the blocks name; blocks with no rows are skipped.
  void run(const void* a_records, const void* b_codes, const float* b_scales, void* c_bf16,
           const std::vector<RowBlock>& blocks, cudaStream_t stream);

  int n() const { return n_; }
  int k() const { return k_; }

 private:
  struct Plan {
    cublasLtMatrixLayout_t b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
  };
  // The layouts and algorithm for N = rows_pad with the given pointer alignments (bytes, powers of 2).
  const Plan& plan_for(int rows_pad, int align_a, int align_b, int align_d);
  // Makes *buf hold `bytes` (waiting for `stream` and this object's last run before freeing the old one).
  void reserve(void** buf, size_t* capacity, size_t bytes, cudaStream_t stream);

  int max_rows_, n_, k_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  std::map<uint64_t, Plan> plans_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* codes_ = nullptr;  // [rows][k] e4m3, the blocks' padded rows one after the other
  size_t codes_bytes_ = 0;
  void* scales_ = nullptr;  // per block [k / 128][rows_pad] fp32, same order
  size_t scales_bytes_ = 0;
  void* out_ = nullptr;  // [rows_pad][n] bf16 for a block whose rows are not a multiple of 4
  size_t out_bytes_ = 0;
  void* weight_scales_ = nullptr;  // [experts][ceil(n / 128)][L4] when k / 128 is not a multiple of 4
  size_t weight_scales_bytes_ = 0;
  cudaEvent_t done_ = nullptr;  // recorded at the end of each run()
};

}  // namespace comet::baselines
