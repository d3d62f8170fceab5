#include "models.hpp"

#include <regex>

namespace comet::bench {

const std::vector<Model>& all_models() {
  static const std::vector<Model> models = {
      {"mixtral", {4096, 14336, 8, 2, Activation::swiglu}},    // Mixtral-8x7B
      {"qwen2", {2048, 1408, 64, 4, Activation::swiglu}},      // Qwen2-MoE (2.7B active), routed experts
      {"phi35", {4096, 6400, 16, 2, Activation::swiglu}},      // Phi-3.5-MoE
      {"qwen57", {3584, 2560, 64, 8, Activation::swiglu}},     // Qwen2-57B-A14B
      {"deepseek", {7168, 2048, 256, 8, Activation::swiglu}},  // DeepSeek-V3, one MoE layer's routed experts
  };
  return models;
}

const Model& find_model(const std::string& name) {
  std::string names;
  for (const Model& m : all_models()) {
    if (m.name == name) return m;
    names += (names.empty() ? "" : ", ") + m.name;
  }
  throw InvalidArgument(detail::concat("unknown model '", name, "' (choose from ", names, ")"));
}

Layout parse_layout(const std::string& name) {
  static const std::regex pattern("^(ep([0-9]+))?(tp([0-9]+))?$");
  std::smatch m;
  COMET_REQUIRE(!name.empty() && std::regex_match(name, m, pattern), "bad layout '", name,
                "' (expected ep<a>tp<b>, ep<a> or tp<b>, e.g. ep4tp2)");
  const int ep = m[2].matched ? std::stoi(m[2].str()) : 1;
  const int tp = m[4].matched ? std::stoi(m[4].str()) : 1;
  COMET_REQUIRE(ep >= 1 && tp >= 1, "bad layout '", name, "': ep and tp must be >= 1");
  return Layout{name, Parallel{ep, tp}};
}

}  // namespace comet::bench
