#include "comet/weight_layout.hpp"

#include <algorithm>

namespace comet {

namespace {

void check_rank(const MoeShape& shape, const Parallel& par, int rank) {
  validate(shape, par);
  COMET_REQUIRE(rank >= 0 && rank < par.world(), "weight_layout: rank ", rank, " out of range [0, ", par.world(),
                ")");
}

void check_size(const char* what, size_t got, size_t expected, const char* formula) {
  COMET_REQUIRE(got == expected, "weight_layout: ", what, " has ", got, " values, expected ", formula, " = ",
                expected);
}

size_t full_w0_size(const MoeShape& s) { return size_t(s.num_experts) * s.w0_rows() * s.hidden; }
size_t full_w1_size(const MoeShape& s) { return size_t(s.num_experts) * s.hidden * s.ffn; }
int local_w0_rows(const MoeShape& s, const Parallel& p) { return is_gated(s.act) ? 2 * p.ffn_shard(s) : p.ffn_shard(s); }
size_t local_w0_size(const MoeShape& s, const Parallel& p) {
  return size_t(p.local_experts(s)) * local_w0_rows(s, p) * s.hidden;
}
size_t local_w1_size(const MoeShape& s, const Parallel& p) {
  return size_t(p.local_experts(s)) * s.hidden * p.ffn_shard(s);
}

// The layout as a list of contiguous runs: fn(local_offset, full_offset) for each run of `len`
// values. Sharding copies along these runs and unsharding adds along them, so the two cannot disagree.
template <class Fn>
void for_each_w0_run(const MoeShape& s, const Parallel& p, int rank, Fn&& fn) {
  const int El = p.local_experts(s), N0 = local_w0_rows(s, p), H = s.hidden, e0 = p.first_local_expert(s, rank);
  for (int e = 0; e < El; ++e)
    for (int n = 0; n < N0; ++n)
      fn((size_t(e) * N0 + n) * H, (size_t(e0 + e) * s.w0_rows() + w0_full_row(s, p, rank, n)) * H);
}

template <class Fn>
void for_each_w1_run(const MoeShape& s, const Parallel& p, int rank, Fn&& fn) {
  const int El = p.local_experts(s), Fs = p.ffn_shard(s), H = s.hidden, e0 = p.first_local_expert(s, rank);
  const int f0 = p.tp_index(rank) * Fs;
  for (int e = 0; e < El; ++e)
    for (int h = 0; h < H; ++h) fn((size_t(e) * H + h) * Fs, (size_t(e0 + e) * H + h) * s.ffn + f0);
}

}  // namespace

int w0_full_row(const MoeShape& shape, const Parallel& par, int rank, int local_row) {
  check_rank(shape, par, rank);
  const int Fs = par.ffn_shard(shape), f0 = par.tp_index(rank) * Fs;
  COMET_REQUIRE(local_row >= 0 && local_row < local_w0_rows(shape, par), "weight_layout: local w0 row ", local_row,
                " out of range [0, ", local_w0_rows(shape, par), ")");
  if (!is_gated(shape.act)) return f0 + local_row;
  const int block = local_row / 16, q = local_row % 16;  // 16 rows: 8 gate rows, then their 8 up rows
  const int f = f0 + 8 * block + q % 8;
  return q < 8 ? f : shape.ffn + f;
}

RankWeightsF32 shard_weights_f32(const MoeShape& shape, const Parallel& par, int rank,
                                 const std::vector<float>& w0_full, const std::vector<float>& w1_full) {
  check_rank(shape, par, rank);
  check_size("w0_full", w0_full.size(), full_w0_size(shape), "E*w0_rows*H");
  check_size("w1_full", w1_full.size(), full_w1_size(shape), "E*H*F");
  RankWeightsF32 r;
  r.local_experts = par.local_experts(shape);
  r.w0_rows = local_w0_rows(shape, par);
  r.ffn_shard = par.ffn_shard(shape);
  r.hidden = shape.hidden;
  r.w0.resize(local_w0_size(shape, par));
  r.w1.resize(local_w1_size(shape, par));
  for_each_w0_run(shape, par, rank, [&](size_t local, size_t full) {
    std::copy_n(&w0_full[full], r.hidden, &r.w0[local]);
  });
  for_each_w1_run(shape, par, rank, [&](size_t local, size_t full) {
    std::copy_n(&w1_full[full], r.ffn_shard, &r.w1[local]);
  });
  return r;
}

RankWeights shard_weights(const MoeShape& shape, const Parallel& par, int rank, const std::vector<float>& w0_full,
                          const std::vector<float>& w1_full) {
  const RankWeightsF32 f = shard_weights_f32(shape, par, rank, w0_full, w1_full);
  return RankWeights{f.local_experts, f.w0_rows, f.ffn_shard, f.hidden, to_bf16(f.w0), to_bf16(f.w1)};
}

void unshard_add_w0(const MoeShape& shape, const Parallel& par, int rank, const std::vector<float>& w0_local,
                    std::vector<float>& w0_full) {
  check_rank(shape, par, rank);
  check_size("w0_local", w0_local.size(), local_w0_size(shape, par), "E_l*N0_s*H");
  check_size("w0_full", w0_full.size(), full_w0_size(shape), "E*w0_rows*H");
  for_each_w0_run(shape, par, rank, [&](size_t local, size_t full) {
    for (int c = 0; c < shape.hidden; ++c) w0_full[full + c] += w0_local[local + c];
  });
}

void unshard_add_w1(const MoeShape& shape, const Parallel& par, int rank, const std::vector<float>& w1_local,
                    std::vector<float>& w1_full) {
  check_rank(shape, par, rank);
  check_size("w1_local", w1_local.size(), local_w1_size(shape, par), "E_l*H*F_s");
  check_size("w1_full", w1_full.size(), full_w1_size(shape), "E*H*F");
  const int Fs = par.ffn_shard(shape);
  for_each_w1_run(shape, par, rank, [&](size_t local, size_t full) {
    for (int f = 0; f < Fs; ++f) w1_full[full + f] += w1_local[local + f];
  });
}

}  // namespace comet
