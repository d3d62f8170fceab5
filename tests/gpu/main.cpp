// Entry point of the GPU test executable: skips visibly when there is no GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "harness/gpu_presence.hpp"

int main(int argc, char** argv) {
  if (!comet::testing::has_gpu()) {
    std::printf("skipped: no GPU (comet_gpu_tests needs an sm_90a device; run scripts/gpu-test there)\n");
    return comet::testing::kSkipExitCode;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
