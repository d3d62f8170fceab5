// The wave chunk a plan orders its tiles with: the config's, or its chunk rule's pick for the rank's
// load class (comet/plan.hpp, WaveChunkRule). Both builders call it with the plan's row count, so they
// agree, and the fused kernel's adaptive split sees the same class (tune/adaptive_split.hpp).
#pragma once

#include "comet/plan.hpp"
#include "tune/cost_model_eval.hpp"

namespace comet {

static_assert(sizeof(WaveChunkRule::by_load) / sizeof(int) == kLoadClasses, "one chunk per load class");

COMET_HD inline int plan_wave_chunk(int wave_chunk, const WaveChunkRule& rule, int rows) {
  if (!(rule.expected_rows > 0)) return wave_chunk;
  const int chunk = rule.by_load[load_class_index(load_class(rows, rule.expected_rows))];
  return chunk > 0 ? chunk : wave_chunk;
}

}  // namespace comet
