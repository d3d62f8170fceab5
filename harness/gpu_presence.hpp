// Whether this machine has a usable CUDA GPU (tests that need one are skipped without it).
#pragma once

namespace comet::testing {
bool has_gpu();
// Exit code that CTest (SKIP_RETURN_CODE) reports as "skipped".
inline constexpr int kSkipExitCode = 77;
}  // namespace comet::testing
