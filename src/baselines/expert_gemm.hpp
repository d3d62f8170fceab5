// The expert GEMMs of the baselines through cuBLAS: C_e = A_e * B_e^T over a set of row blocks, all
// row-major bf16 with fp32 accumulation, where block i is rows [row, row + rows) of A and C that belong
// to local expert `expert`, and B_e = b + expert * n * k is the expert's weight [n][k] (K-major, as in
// weight_layout.hpp).
//
// cuBLAS is column-major, so each block is computed as C^T = B_e * A^T: a row-major [rows][n] C is a
// column-major n x rows matrix; the weight [n][k] row-major is column-major k x n, hence OP_T; the
// rows of A [rows][k] are column-major k x rows, hence OP_N:
//   cublasGemmEx(h, OP_T, OP_N, n, rows, k, 1, B_e, k, A_block, k, 0, C_block, n).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <vector>

#include "baselines/baselines.hpp"

namespace comet::baselines {

struct GemmOperands {
  const void* a = nullptr;  // [rows][k]
  const void* b = nullptr;  // [experts][n][k]
  void* c = nullptr;        // [rows][n]
  int n = 0;
  int k = 0;
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
