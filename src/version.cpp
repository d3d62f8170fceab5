#include "comet/version.hpp"
namespace comet {
const char* version() { return "0.1.0"; }
}
