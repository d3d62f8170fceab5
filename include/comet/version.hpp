#pragma once
namespace comet {
const char* version();
}
