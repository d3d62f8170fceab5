// Standalone expert GEMMs through cuBLAS: the backward's (MoeOptions::cublas_backward) and a table's
// StandaloneGemm::cublas pick (any launch's sequential schedule). Where a launch runs a GEMM with no comm
// blocks beside it (a sequential schedule, the two weight gradients), nothing is left to overlap and the
// fastest GEMM wins; on one large expert per rank that is cuBLAS (Mixtral-8x7B EP 8: 0.313 ms against
// CUTLASS's best 0.374, H100). cuBLAS needs each expert's rows on the host, which the device plan keeps on
// the device: the forward copies them to pinned memory right after it builds the plan (no wait), and a
// launch that runs cuBLAS waits for that copy (the backward's: long done by then; layer 1's: done once
// the plan build is, at the start of layer 0). cuBLAS is loaded on first use (dlopen of
// libcublas.so.13: $COMET_CUBLAS_LIB, else the soname, which torch has loaded in a Python process), so
// the library keeps no link dependency on it. Internal (moe_engine.cpp, moe_backward.cpp).
#pragma once

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "ops/host_plan_counts.hpp"

namespace comet {

// cuBLAS handles (one per stream the GEMMs run on: a handle's workspace is not shared between streams)
// and the two kinds of expert GEMM the backward has, bf16 operands with fp32 accumulation.
class CublasExpertGemms {
 public:
  CublasExpertGemms();  // loads cuBLAS; throws InvalidArgument with the reason where it cannot
  ~CublasExpertGemms();
  CublasExpertGemms(const CublasExpertGemms&) = delete;
  CublasExpertGemms& operator=(const CublasExpertGemms&) = delete;

  // out_e [rows_e][n] = a_e [rows_e][k] w_e, w = [E_l][k][n] (w_kn: the backward's D = G W1_e and dA =
  // dPre W0_e) or w_e^T, w = [E_l][n][k] (the forward's Y = h W1_e^T), all row-major bf16; rows outside
  // the experts' are not written.
  void data_gemm(cudaStream_t stream, const ExpertRows& e, const void* a, int k, const void* w, bool w_kn, int n,
                 void* out);
  // dw_e [p_cols][q_cols] = p_e^T q_e over the expert's rows (+= with `accumulate`), p [rows][p_cols] and
  // q [rows][q_cols] bf16, dw fp32 or bf16; an expert with no rows gets zeros unless accumulating.
  void weight_grads(cudaStream_t stream, const ExpertRows& e, const void* p, int p_cols, const void* q, int q_cols,
                    void* dw, bool f32, bool accumulate);

 private:
  void* handle_for(cudaStream_t stream);
  std::vector<std::pair<cudaStream_t, void*>> handles_;  // cublasHandle_t per stream
};

}  // namespace comet
