// Validation of MoeShape / Parallel: unsupported layouts are rejected with a clear message.
#include <gtest/gtest.h>

#include "comet/shape.hpp"

using namespace comet;

TEST(Shape, AcceptsRealModels) {
  EXPECT_NO_THROW(validate(MoeShape{4096, 14336, 8, 2, Activation::swiglu}, Parallel{8, 1}));
  EXPECT_NO_THROW(validate(MoeShape{4096, 14336, 8, 2, Activation::swiglu}, Parallel{1, 8}));
  EXPECT_NO_THROW(validate(MoeShape{2048, 1408, 64, 4, Activation::swiglu}, Parallel{4, 2}));
  EXPECT_NO_THROW(validate(MoeShape{7168, 2048, 256, 8, Activation::swiglu}, Parallel{8, 1}));
}

TEST(Shape, RejectsBadLayouts) {
  EXPECT_THROW(validate(MoeShape{4096, 14336, 8, 0, Activation::swiglu}, Parallel{8, 1}), InvalidArgument);
  EXPECT_THROW(validate(MoeShape{4096, 14336, 8, 9, Activation::swiglu}, Parallel{8, 1}), InvalidArgument);
  EXPECT_THROW(validate(MoeShape{4096, 14336, 64, 17, Activation::swiglu}, Parallel{8, 1}), InvalidArgument);
  EXPECT_THROW(validate(MoeShape{4096, 14336, 6, 2, Activation::swiglu}, Parallel{4, 1}), InvalidArgument);
  EXPECT_THROW(validate(MoeShape{4100, 14336, 8, 2, Activation::swiglu}, Parallel{8, 1}), InvalidArgument);
  EXPECT_THROW(validate(MoeShape{4096, 1400, 8, 2, Activation::swiglu}, Parallel{1, 8}), InvalidArgument);
  try {
    validate(MoeShape{4096, 14336, 6, 2, Activation::swiglu}, Parallel{4, 1});
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("divisible by ep"), std::string::npos) << e.what();
  }
}
