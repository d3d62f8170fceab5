// The benchmark sweep, callable in-process (comet-bench's main, comet-tune's measuring).
#pragma once

#include <string>
#include <vector>

namespace comet::bench {

// Runs the sweep with comet-bench's command-line arguments (argv[0] is the program name); returns the
// exit status comet-bench would.
int run_sweep(int argc, char** argv);
// The same with the arguments after the program name.
int run_sweep(const std::vector<std::string>& args);

}  // namespace comet::bench
