// comet-bench's entry point (the sweep itself is bench/comet_bench.cpp, which comet-tune runs too).
#include <cstdio>
#include <exception>

#include "comet_bench.hpp"

int main(int argc, char** argv) {
  try {
    return comet::bench::run_sweep(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comet-bench: %s\n", e.what());
    return 1;
  }
}
