// The stage layout of the chunked baseline, from the plan's arrays (plan.hpp): units and rows are in
// source-position order, so a group of consecutive positions is one contiguous unit range and, for
// each expert, one contiguous row range.
#include <algorithm>

#include "baselines/baselines.hpp"

namespace comet {

std::vector<ChunkStage> plan_chunk_stages(int rank, int world, int local_experts, int chunks,
                                          const std::vector<int>& segment_offset,
                                          const std::vector<int>& segment_rows, const std::vector<int>& unit_src) {
  COMET_REQUIRE(world >= 1 && rank >= 0 && rank < world, "plan_chunk_stages: rank ", rank, " outside [0, ", world, ")");
  COMET_REQUIRE(chunks >= 1, "chunked baseline: chunks must be >= 1, got ", chunks);
  COMET_REQUIRE(local_experts >= 0, "plan_chunk_stages: negative number of local experts");
  const size_t segments = size_t(local_experts) * world;
  COMET_REQUIRE(segment_offset.size() == segments && segment_rows.size() == segments,
                "plan_chunk_stages: segment arrays must have E_l * W = ", segments, " entries");

  // First unit of each source position (units come position by position).
  std::vector<int> first_unit(world + 1, 0);
  int previous = 0;
  for (int src : unit_src) {
    COMET_REQUIRE(src >= 0 && src < world, "plan_chunk_stages: unit source ", src, " outside [0, ", world, ")");
    const int pos = (src - rank + world) % world;
    COMET_REQUIRE(pos >= previous, "plan_chunk_stages: units are not in source-position order");
    previous = pos;
    ++first_unit[pos + 1];
  }
  for (int j = 0; j < world; ++j) first_unit[j + 1] += first_unit[j];

  // Position groups: {0}, then the remote positions 1..W-1 in C near-equal groups of consecutive ones.
  std::vector<int> bounds{0, 1};
  const int remote = world - 1;
  const int c = std::min(chunks, remote);
  for (int g = 1; g <= c; ++g) bounds.push_back(1 + int((long long)g * remote / c));

  std::vector<ChunkStage> stages;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    ChunkStage s;
    s.pos_begin = bounds[i];
    s.pos_end = bounds[i + 1];
    s.unit_begin = first_unit[s.pos_begin];
    s.unit_end = first_unit[s.pos_end];
    s.row_begin.resize(local_experts);
    s.row_count.resize(local_experts);
    for (int e = 0; e < local_experts; ++e) {
      const int first = e * world + s.pos_begin, last = e * world + s.pos_end - 1;
      s.row_begin[e] = segment_offset[first];
      s.row_count[e] = segment_offset[last] + segment_rows[last] - segment_offset[first];
    }
    stages.push_back(std::move(s));
  }
  return stages;
}

}  // namespace comet
