#include "models.hpp"

#include <deque>
#include <mutex>
#include <optional>
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

namespace {

// A shape spelled out in its name: h<H>f<F>e<E>k<k>, SwiGLU unless -gelu or -silu follows.
std::optional<MoeShape> parse_shape(const std::string& name) {
  static const std::regex pattern("^h([0-9]+)f([0-9]+)e([0-9]+)k([0-9]+)(-(swiglu|gelu|silu))?$");
  std::smatch m;
  if (!std::regex_match(name, m, pattern)) return std::nullopt;
  const std::string act = m[6].matched ? m[6].str() : "swiglu";
  const Activation a = act == "gelu" ? Activation::gelu : act == "silu" ? Activation::silu : Activation::swiglu;
  return MoeShape{std::stoi(m[1].str()), std::stoi(m[2].str()), std::stoi(m[3].str()), std::stoi(m[4].str()), a};
}

}  // namespace

const Model& find_model(const std::string& name) {
  std::string names;
  for (const Model& m : all_models()) {
    if (m.name == name) return m;
    names += (names.empty() ? "" : ", ") + m.name;
  }
  if (const std::optional<MoeShape> shape = parse_shape(name)) {
    COMET_REQUIRE(shape->hidden > 0 && shape->ffn > 0 && shape->num_experts > 0 && shape->topk > 0 &&
                      shape->topk <= shape->num_experts,
                  "model '", name, "': H, F, E and k must be positive, with k <= E");
    // Models named by their shape live as long as the process (find_model returns a reference).
    static std::mutex lock;
    static std::deque<Model> spelled;
    const std::lock_guard<std::mutex> hold(lock);
    for (const Model& m : spelled)
      if (m.name == name) return m;
    return spelled.emplace_back(Model{name, *shape});
  }
  throw InvalidArgument(detail::concat("unknown model '", name, "' (choose from ", names,
                                       ", or spell a shape: h<H>f<F>e<E>k<k>[-gelu|-silu], e.g. h4096f14336e8k2)"));
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
