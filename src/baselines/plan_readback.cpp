#include "baselines/plan_readback.hpp"

#include "comet/cuda_check.hpp"

namespace comet::baselines {
namespace {

void raise_if_error(const int32_t* status, int num_experts) {
  if (status[0] != 0) throw DeviceReportedError(describe_plan_error(status, num_experts));
}

}  // namespace

PlanReader::PlanReader(int local_experts) : local_experts_(local_experts) {
  COMET_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&words_),
                                  sizeof(int32_t) * (kPlanStatusWords + 2 * size_t(local_experts) + 1)));
}

PlanReader::~PlanReader() {
  if (words_) cudaFreeHost(words_);
}

ExpertCounts PlanReader::read_counts(const PlanView& plan, int num_experts, cudaStream_t stream) {
  const int el = local_experts_;
  int32_t* status = words_;
  int32_t* rows = words_ + kPlanStatusWords;
  int32_t* offset = rows + el;
  COMET_CUDA_CHECK(cudaMemcpyAsync(status, plan.status, sizeof(int32_t) * kPlanStatusWords, cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(rows, plan.expert_rows, sizeof(int32_t) * el, cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(offset, plan.expert_offset, sizeof(int32_t) * (el + 1), cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  raise_if_error(status, num_experts);
  return ExpertCounts{std::vector<int>(rows, rows + el), std::vector<int>(offset, offset + el + 1)};
}

ChunkInputs PlanReader::read_chunk_inputs(const PlanView& plan, int world, int num_experts, cudaStream_t stream) {
  const size_t segments = size_t(local_experts_) * world;
  ChunkInputs in;
  in.segment_offset.resize(segments);
  in.segment_rows.resize(segments);
  int32_t status[kPlanStatusWords];
  int32_t units = 0;
  COMET_CUDA_CHECK(cudaMemcpyAsync(status, plan.status, sizeof(status), cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(&units, plan.num_units, sizeof(units), cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(in.segment_offset.data(), plan.segment_offset, sizeof(int32_t) * segments,
                                   cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(in.segment_rows.data(), plan.segment_rows, sizeof(int32_t) * segments,
                                   cudaMemcpyDeviceToHost, stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  raise_if_error(status, num_experts);
  in.unit_src.resize(size_t(units));
  if (units > 0) {
    COMET_CUDA_CHECK(cudaMemcpyAsync(in.unit_src.data(), plan.unit_src, sizeof(int32_t) * size_t(units),
                                     cudaMemcpyDeviceToHost, stream));
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return in;
}

}  // namespace comet::baselines
