// Asserts that a call throws comet::InvalidArgument whose message names the problem.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "comet/common.hpp"

namespace comet::testing {

inline void expect_invalid(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no InvalidArgument (expected a message containing \"" << needle << "\")";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace comet::testing
