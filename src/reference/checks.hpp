// Input checks of the reference (each throws comet::InvalidArgument with a message naming the problem).
#pragma once

#include "comet/reference.hpp"

namespace comet::reference::detail {

// Shape is usable (comet::validate with a single rank) and w0 / w1 have the full sizes.
template <class T>
void check_weights(const MoeShape& shape, const ExpertWeights<T>& weights);

// expert in [0, E) and 0 <= f_begin <= f_end <= F.
void check_expert_shard(const MoeShape& shape, int expert, int f_begin, int f_end);

// dout has one [T_s][H] array per rank.
template <class T>
void check_dout(const MoeShape& shape, const std::vector<RankInput<T>>& ranks, const RankOutputs<T>& dout);

}  // namespace comet::reference::detail
