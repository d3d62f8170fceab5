// Bit-for-bit comparison of float results, for the tests that promise the same bits across schedules.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace comet::testing {

// Bitwise equal, or a message with how many elements differ and the first of them.
inline ::testing::AssertionResult bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " elements against " << b.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements differ, the first at " << first
                                       << ": " << a[first] << " against " << b[first];
}

}  // namespace comet::testing
