// The expert GEMMs of the baselines through cuBLAS, all bf16 inputs with fp32 accumulation.
//
// Data GEMMs: C_e = A_e * op(B_e) over a set of row blocks, all row-major bf16, where block i is rows
// [row, row + rows) of A and C that belong to local expert `expert`, and B_e = b + expert * n * k is the
// expert's weight, stored either way:
//   n_by_k  [n][k] (K-major, as weight_layout.hpp keeps W0 and W1):  C = A B_e^T   (the forward)
//   k_by_n  [k][n]:                                                  C = A B_e     (the backward:
//           D = G W1_e with W1_e [H][F_s], dA = dPre W0_e with W0_e [N0_s][H])
// cuBLAS is column-major, so each block is computed as C^T = op(B_e)^T A^T: a row-major [rows][n] C is a
// column-major n x rows matrix and the rows of A [rows][k] are column-major k x rows (OP_N); a
// row-major [n][k] weight is column-major k x n, hence OP_T with lda k; a row-major [k][n] weight is
// column-major n x k already, hence OP_N with lda n:
//   cublasGemmEx(h, n_by_k ? OP_T : OP_N, OP_N, n, rows, k, 1, B_e, n_by_k ? k : n, A_block, k, 0, C_block, n).
//
// Weight gradients: dW_e = P_e^T Q_e summed over expert e's rows, P [rows][p_cols] and Q [rows][q_cols]
// row-major bf16, dW_e [p_cols][q_cols] row-major fp32 or bf16. Row-major dW_e is column-major
// q_cols x p_cols = Q^T P with Q column-major q_cols x rows (OP_N) and P column-major p_cols x rows (OP_T):
//   cublasGemmEx(h, OP_N, OP_T, q_cols, p_cols, rows, 1, Q_block, q_cols, P_block, p_cols, beta, dW_e, q_cols).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "baselines/baselines.hpp"

namespace comet::baselines {

// How an expert's weight is stored (see above).
enum class WeightLayout { n_by_k, k_by_n };

struct GemmOperands {
  const void* a = nullptr;  // [rows][k]
  const void* b = nullptr;  // [experts][n][k] (n_by_k) or [experts][k][n] (k_by_n)
  void* c = nullptr;        // [rows][n]
  int n = 0;
  int k = 0;
  WeightLayout weight = WeightLayout::n_by_k;
};

struct RowBlock {
  int expert = 0;
  int row = 0;
  int rows = 0;
};

// One grouped GEMM's problems: the host arrays cuBLAS reads (dimensions, leading dimensions, scalars)
// and, for the grouped path, the device arrays of matrix pointers (cuBLAS reads those on the device).
class GemmProblems {
 public:
  explicit GemmProblems(int max_problems);
  ~GemmProblems();
  GemmProblems(const GemmProblems&) = delete;
  GemmProblems& operator=(const GemmProblems&) = delete;

  // Describes the problems (blocks with no rows are dropped) and copies the pointer arrays to the
  // device on `stream`; run() must be called on the same stream (or one ordered after it). Waits for
  // this object's previous upload first, so its pinned staging is never overwritten in flight.
  void assign(const GemmOperands& op, const std::vector<RowBlock>& blocks, cudaStream_t stream);
  // Enqueues the GEMMs on the handle's stream.
  void run(cublasHandle_t handle, GemmPath path) const;

  int count() const { return int(rows_.size()); }
  long long total_rows() const;

 private:
  int max_problems_;
  GemmOperands op_{};
  // Host arrays, one entry per problem (the grouped call has one group of size 1 per problem).
  std::vector<int> m_, rows_, k_, lda_, ldb_, ldc_, group_size_;
  std::vector<cublasOperation_t> trans_a_, trans_b_;
  std::vector<float> alpha_, beta_;
  std::vector<const void*> weight_ptr_, row_ptr_;
  std::vector<void*> out_ptr_;
  // Pinned staging and device copies of the three pointer arrays, [3][max_problems].
  void** staging_ = nullptr;
  void** device_ = nullptr;
  cudaEvent_t uploaded_ = nullptr;
};

// Operands of a weight gradient dW_e = P_e^T Q_e (see above).
struct WeightGradOperands {
  const void* p = nullptr;  // [rows][p_cols] bf16
  const void* q = nullptr;  // [rows][q_cols] bf16
  void* dw = nullptr;       // [experts][p_cols][q_cols] of `type`
  int p_cols = 0;
  int q_cols = 0;
  GradType type = GradType::bf16;
};

// Enqueues every expert's weight gradient on `stream` (the handle's): one cublasGemmEx per block with
// rows (beta 1 when accumulating, so dW_e += P_e^T Q_e), and for a block with no rows a clear of dW_e
// unless accumulating, so that every expert named in `blocks` ends with its gradient. A loop, not a
// grouped call: there are only E_l problems and each is large (K is the expert's rows), so the launches
// cost little next to the GEMMs.
void run_weight_grads(cublasHandle_t handle, cudaStream_t stream, const WeightGradOperands& op,
                      const std::vector<RowBlock>& blocks, bool accumulate);

// A cuBLAS handle bound to one stream (each stream that runs GEMMs concurrently needs its own handle:
// a handle's workspace is not safe to share between streams).
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace comet::baselines
