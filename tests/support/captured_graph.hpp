// A CUDA graph captured from what `record` enqueues on a stream of its own, instantiated, and replayed
// on that stream; the graph, its instance and the stream are freed with it. For the GPU tests that
// capture a layer's forward.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "comet/cuda_check.hpp"

namespace comet::testing {

class CapturedGraph {
 public:
  CapturedGraph(cudaStreamCaptureMode mode, const std::function<void(cudaStream_t)>& record) {
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    COMET_CUDA_CHECK(cudaStreamBeginCapture(stream_, mode));
    record(stream_);
    COMET_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
    COMET_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // One replay, waited for.
  void replay() {
    COMET_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace comet::testing
