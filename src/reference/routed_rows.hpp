// Which (rank, token, slot) rows each expert receives: the reference's version of the dispatch.
#pragma once

#include <vector>

#include "comet/reference.hpp"

namespace comet::reference::detail {

struct RoutedRow {
  int rank, token, slot;
};

// rows[e] lists the rows routed to expert e, by rank, then token, ascending. Inputs must be checked.
template <class T>
std::vector<std::vector<RoutedRow>> rows_by_expert(const MoeShape& shape, const std::vector<RankInput<T>>& ranks) {
  std::vector<std::vector<RoutedRow>> rows(shape.num_experts);
  const int k = shape.topk;
  for (int s = 0; s < int(ranks.size()); ++s)
    for (int t = 0; t < ranks[s].tokens; ++t)
      for (int j = 0; j < k; ++j) rows[ranks[s].ids[size_t(t) * k + j]].push_back({s, t, j});
  return rows;
}

// Pointers to the x rows of the given routed rows, in order.
template <class T>
std::vector<const T*> x_rows_of(const MoeShape& shape, const std::vector<RankInput<T>>& ranks,
                                const std::vector<RoutedRow>& rows) {
  std::vector<const T*> x;
  x.reserve(rows.size());
  for (const RoutedRow& r : rows) x.push_back(ranks[r.rank].x.data() + size_t(r.token) * shape.hidden);
  return x;
}

}  // namespace comet::reference::detail
