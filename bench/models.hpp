// The shapes the benchmark sweeps (DESIGN.md section 4) and the EP x TP layouts of 8 ranks.
#pragma once

#include <string>
#include <vector>

#include "comet/shape.hpp"

namespace comet::bench {

struct Model {
  std::string name;
  MoeShape shape;
};

struct Layout {
  std::string name;  // ep8, tp8, ep4tp2, ...
  Parallel par;
};

// mixtral, qwen2, phi35, qwen57, deepseek (all SwiGLU).
const std::vector<Model>& all_models();
// One of all_models() by name, or a shape spelled as a name: h<H>f<F>e<E>k<k>, SwiGLU unless -gelu or
// -silu follows (h4096f14336e8k2 is Mixtral's), so that a user's own layer can be benchmarked and tuned.
// Throws InvalidArgument naming the choices.
const Model& find_model(const std::string& name);

// "ep<a>tp<b>", "ep<a>" or "tp<b>"; throws InvalidArgument otherwise.
Layout parse_layout(const std::string& name);

}  // namespace comet::bench
