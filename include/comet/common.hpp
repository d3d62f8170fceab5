// Errors and checks shared by every part of comet.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace comet {

// Bad input from the caller (shape, dtype, range, capacity, rank count). Raised before any launch.
struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A CUDA runtime / driver / library call failed.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A bounded device-side wait expired (a flag or signal never reached its value).
struct TimeoutError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The device found bad data it could not check on the host without a synchronisation
// (e.g. routing that lives on the GPU), recorded it in a status word, and the host raised it.
struct DeviceReportedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(Args const&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace comet

// Throws comet::InvalidArgument with a message built from the remaining arguments.
#define COMET_REQUIRE(cond, ...)                                                        \
  do {                                                                                  \
    if (!(cond)) throw ::comet::InvalidArgument(::comet::detail::concat(__VA_ARGS__)); \
  } while (0)
