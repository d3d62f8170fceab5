#include "baselines/plan_readback.hpp"

#include "comet/cuda_check.hpp"

namespace comet::baselines {
ChunkInputs read_chunk_inputs(const PlanView& plan, int world, int local_experts, int num_experts,
                              cudaStream_t stream) {
  const size_t segments = size_t(local_experts) * world;
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
  if (status[0] != 0) throw DeviceReportedError(describe_plan_error(status, num_experts));
  in.unit_src.resize(size_t(units));
  if (units > 0) {
    COMET_CUDA_CHECK(cudaMemcpyAsync(in.unit_src.data(), plan.unit_src, sizeof(int32_t) * size_t(units),
                                     cudaMemcpyDeviceToHost, stream));
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return in;
}

}  // namespace comet::baselines
