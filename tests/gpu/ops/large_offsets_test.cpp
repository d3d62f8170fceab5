// Element offsets past 2^31 (issue 18): every offset of the form row x H or token x H into a buffer that
// holds more than 2^31 elements must be computed in 64 bits. Three layers, each with such buffers, run
// forward and backward (public API, from NaN-poisoned buffers) and are checked against the CPU reference:
//   GatheredRows  W 1, top-8 of 8, 40000 tokens: the gathered rows A, the expert outputs Y and the
//                 gathered output gradients hold 320512 x 8192 = 2.6e9 elements; every token has rows
//                 past element 2^31 (experts 6 and 7), and the weight gradients run K over all of them.
//   TokenRows     W 1, top-1 of 8 (gelu), 270000 tokens: x, out, dout, dx and the rank's partial rows
//                 hold 270000 x 8192 = 2.2e9 elements, and so do A and Y.
//   TwoRanks      EP 2, top-2 of 8, 140000 tokens a rank: rows pulled from the peer land past element
//                 2^31 of A (the last local expert's remote rows), and partial rows past element 2^31 of
//                 the owner's receive buffer [W][T][H] (slot 1, tokens >= 122144).
// The CPU reference of every token would take minutes. A token's output, dx and gate gradients depend
// only on its own x, ids, gates and dout, so the reference runs on a sample of each rank's tokens (the
// last 64, whose rows sit at the largest offsets, and 64 random ones). dout is zero outside the sample,
// so the weight gradients, summed on the GPU over every row, equal the sample's: they are checked whole.
// Device memory: about 21 GB, 44 GB and 64 GB; x and dout are generated on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "comet/bf16.hpp"
#include "comet/cuda_check.hpp"
#include "comet/fused_moe.hpp"
#include "comet/plan.hpp"
#include "comet/reference.hpp"
#include "comet/weight_layout.hpp"
#include "harness/device_buffer.hpp"
#include "harness/device_random.hpp"
#include "harness/layer_compare.hpp"
#include "harness/moe_problem.hpp"
#include "harness/routing_gen.hpp"
#include "ops/moe_engine.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

constexpr size_t k2To31 = size_t(1) << 31;
constexpr int kLastTokens = 64;
constexpr int kRandomTokens = 64;

// The sampled tokens of a rank with `tokens` tokens: the last kLastTokens and kRandomTokens others,
// ascending and distinct.
std::vector<int> sample_tokens(int tokens, uint64_t seed) {
  std::vector<int> s;
  const int first_last = std::max(0, tokens - kLastTokens);
  for (int t = first_last; t < tokens; ++t) s.push_back(t);
  if (first_last > 0) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> pick(0, first_last - 1);
    for (int i = 0; i < kRandomTokens; ++i) s.push_back(pick(rng));
  }
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

// Rows `rows` of a device bf16 array [*][width], as floats [rows.size()][width].
std::vector<float> download_rows(const DeviceBuffer& b, const std::vector<int>& rows, int width) {
  const size_t row_bytes = size_t(width) * 2;
  std::vector<bf16_bits> bits(rows.size() * size_t(width));
  for (size_t i = 0; i < rows.size(); ++i)
    COMET_CUDA_CHECK(cudaMemcpy(bits.data() + i * width, b.as<const char>() + size_t(rows[i]) * row_bytes, row_bytes,
                                cudaMemcpyDeviceToHost));
  return from_bf16(bits);
}

struct RankData {
  int tokens = 0;
  std::vector<int> sample;         // the tokens the reference checks
  std::vector<float> dout_sample;  // [sample][H]: dout's rows of the sample (every other row is zero)
  DeviceBuffer x, ids, gates, out, w0, w1, dout, dx, dgates, dw0, dw1;
};

// A training layer on a LocalTeam (one GPU), its data generated at full size on the device.
class BigLayer {
 public:
  BigLayer(const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens, uint64_t seed)
      : shape_(shape), par_(par), team_(par.world(), Link::device) {
    team_.set_timeout(30.0);
    const int H = shape.hidden, E = shape.num_experts, k = shape.topk, W = par.world();
    const int El = par.local_experts(shape), Fs = par.ffn_shard(shape), n0 = shape.w0_rows() / par.tp;
    weights_ = random_expert_weights(shape, seed);
    routing_ = make_routing(shape, par, tokens, RoutingKind::uniform, seed * 7 + 3);

    // Exactly the rows the routing needs (the default, W T min(k, E_l) + padding, would double TwoRanks'
    // buffers), so the used rows reach the top of A.
    std::vector<long long> expert_rows(E, 0);
    for (const RankRouting& r : routing_)
      for (int32_t id : r.ids) ++expert_rows[id];
    long long rows = kTileRows;
    for (int g = 0; g < par.ep; ++g) {
      long long sum = 0;
      for (int e = g * El; e < (g + 1) * El; ++e) sum += (expert_rows[e] + kTileRows - 1) / kTileRows * kTileRows;
      rows = std::max(rows, sum);
    }
    const int max_tokens = std::max(1, *std::max_element(tokens.begin(), tokens.end()));
    MoeOptions o;
    o.training = true;
    fused_ = std::make_unique<FusedMoe>(team_, shape, par, MoeCapacity{max_tokens, int(rows)}, o);

    ranks_.resize(W);
    for (int r = 0; r < W; ++r) {
      RankData& d = ranks_[r];
      const size_t T = size_t(tokens[r]);
      d.tokens = tokens[r];
      d.sample = sample_tokens(d.tokens, seed * 31 + r);
      d.x = DeviceBuffer(T * H * 2);
      fill_random_bf16(d.x.get(), T * H, 1.0f, seed * 7 + 4 + r * 13);
      d.ids = DeviceBuffer(routing_[r].ids);
      d.gates = DeviceBuffer(routing_[r].gates);
      d.out = DeviceBuffer(T * H * 2);
      const RankWeights w = shard_weights(shape, par, r, weights_.w0, weights_.w1);
      d.w0 = DeviceBuffer(w.w0);
      d.w1 = DeviceBuffer(w.w1);
      fused_->set_weights(r, d.w0.get(), d.w1.get());
      d.dout = DeviceBuffer(T * H * 2);
      d.dout.fill_bytes(0);
      d.dout_sample = random_bf16_values(d.sample.size() * H, 1.0f, seed * 1000 + r);
      const std::vector<bf16_bits> bits = to_bf16(d.dout_sample);
      for (size_t i = 0; i < d.sample.size(); ++i)
        COMET_CUDA_CHECK(cudaMemcpy(d.dout.as<char>() + size_t(d.sample[i]) * H * 2, bits.data() + i * H,
                                    size_t(H) * 2, cudaMemcpyHostToDevice));
      COMET_CUDA_CHECK(cudaDeviceSynchronize());  // landed before the ranks' non-blocking streams read it
      d.dx = DeviceBuffer(T * H * 2);
      d.dgates = DeviceBuffer(T * k * 4);
      d.dw0 = DeviceBuffer(size_t(El) * n0 * H * 4);
      d.dw1 = DeviceBuffer(size_t(El) * H * Fs * 4);
    }
    // The fills above ran on the legacy stream, which the ranks' non-blocking streams do not wait for.
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // Rows of rank r's gathered buffer that the plan uses (padding included).
  size_t rows_used(int r) const {
    const HostPlan plan = fused_->engine().plan(r).to_host(team_.stream(r));
    return size_t(plan.view().expert_offset[par_.local_experts(shape_)]);
  }
  size_t rows_cap() const { return size_t(fused_->capacity().max_rows_per_rank); }

  // Forward and backward from poisoned buffers, each checked on the sample.
  void run_and_check(const std::string& what) {
    for (int r = 0; r < par_.world(); ++r) {
      fused_->engine().poison_buffers(r);
      RankData& d = ranks_[r];
      for (DeviceBuffer* b : {&d.out, &d.dx, &d.dgates, &d.dw0, &d.dw1}) b->fill_bytes(0xFF);
    }
    COMET_CUDA_CHECK(cudaDeviceSynchronize());

    std::vector<RankBatch> batches;
    for (const RankData& d : ranks_)
      batches.push_back(RankBatch{d.tokens, d.x.get(), d.ids.as<int32_t>(), d.gates.as<float>(), d.out.get()});
    fused_->forward(batches);
    fused_->sync_and_check();
    const std::vector<reference::RankInput<float>> inputs = sample_inputs();
    expect_forward_right(inputs, what);

    std::vector<RankGrad> grads;
    for (const RankData& d : ranks_)
      grads.push_back(RankGrad{d.dout.get(), d.dx.get(), d.dgates.as<float>(), d.dw0.get(), d.dw1.get()});
    fused_->backward(grads, nullptr, BackwardOptions{GradType::f32, false});
    fused_->sync_and_check();
    expect_backward_right(inputs, what);
  }

 private:
  static constexpr int kTileRows = 128;  // the plan pads every expert segment to this

  // Every rank's sampled tokens as a problem of their own (the reference's input).
  std::vector<reference::RankInput<float>> sample_inputs() const {
    const int H = shape_.hidden, k = shape_.topk;
    std::vector<reference::RankInput<float>> in(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const RankData& d = ranks_[r];
      in[r].tokens = int(d.sample.size());
      in[r].x = download_rows(d.x, d.sample, H);
      for (int t : d.sample) {
        for (int j = 0; j < k; ++j) {
          in[r].ids.push_back(routing_[r].ids[size_t(t) * k + j]);
          in[r].gates.push_back(routing_[r].gates[size_t(t) * k + j]);
        }
      }
    }
    return in;
  }

  void expect_forward_right(const std::vector<reference::RankInput<float>>& inputs, const std::string& what) const {
    const auto ref = reference::forward(shape_, par_, weights_, inputs);
    std::vector<std::vector<float>> got;
    for (const RankData& d : ranks_) got.push_back(download_rows(d.out, d.sample, shape_.hidden));
    EXPECT_EQ(compare_outputs(shape_, ref, got), "") << what << ": forward, sampled tokens";
  }

  void expect_backward_right(const std::vector<reference::RankInput<float>>& inputs, const std::string& what) const {
    const int H = shape_.hidden, k = shape_.topk;
    const int El = par_.local_experts(shape_), Fs = par_.ffn_shard(shape_), n0 = shape_.w0_rows() / par_.tp;
    std::vector<std::vector<float>> dout;
    for (const RankData& d : ranks_) dout.push_back(d.dout_sample);
    const auto ref = reference::backward(shape_, par_, weights_, inputs, dout);
    reference::Gradients<float> got;
    got.dw0.assign(weights_.w0.size(), 0.f);
    got.dw1.assign(weights_.w1.size(), 0.f);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const RankData& d = ranks_[r];
      got.dx.push_back(download_rows(d.dx, d.sample, H));
      const std::vector<float> dgates = d.dgates.download<float>(size_t(d.tokens) * k);
      std::vector<float> mine;
      for (int t : d.sample)
        for (int j = 0; j < k; ++j) mine.push_back(dgates[size_t(t) * k + j]);
      got.dgates.push_back(mine);
      unshard_add_w0(shape_, par_, int(r), d.dw0.download<float>(size_t(El) * n0 * H), got.dw0);
      unshard_add_w1(shape_, par_, int(r), d.dw1.download<float>(size_t(El) * H * Fs), got.dw1);
    }
    EXPECT_EQ(compare_gradients(shape_, ref, got, gate_grad_scales(shape_, weights_, inputs, dout)), "")
        << what << ": backward (dx, dgates of the sampled tokens; dW)";
  }

  MoeShape shape_;
  Parallel par_;
  LocalTeam team_;
  reference::ExpertWeights<float> weights_;
  std::vector<RankRouting> routing_;
  std::unique_ptr<FusedMoe> fused_;
  std::vector<RankData> ranks_;
};

// A, Y and the gathered output gradients past 2^31 elements; x and out below.
TEST(LargeOffsets, GatheredRowsPast2To31Elements) {
  const MoeShape shape{8192, 64, 8, 8, Activation::swiglu};
  const int tokens = 40000;
  BigLayer l(shape, Parallel{1, 1}, {tokens}, 3);
  ASSERT_GT(l.rows_cap() * shape.hidden, k2To31);
  l.run_and_check("gathered rows");
  EXPECT_GT(l.rows_used(0) * shape.hidden, k2To31) << "the plan's rows should pass 2^31 elements";
}

// x, out, dout, dx and the partial rows past 2^31 elements (and A and Y with them).
TEST(LargeOffsets, TokenRowsPast2To31Elements) {
  const MoeShape shape{8192, 64, 8, 1, Activation::gelu};
  const int tokens = 270000;
  ASSERT_GT(size_t(tokens) * shape.hidden, k2To31);
  BigLayer l(shape, Parallel{1, 1}, {tokens}, 4);
  l.run_and_check("token rows");
  EXPECT_GT(l.rows_used(0) * shape.hidden, k2To31);
}

// EP 2: the dispatch pulls rows past element 2^31 of A, the combine writes and final_reduce reads partial
// rows past element 2^31 of the receive buffer.
TEST(LargeOffsets, TwoRanksPullAndCombinePast2To31Elements) {
  const MoeShape shape{8192, 64, 8, 2, Activation::swiglu};
  const Parallel par{2, 1};
  const int tokens = 140000;
  ASSERT_GT(size_t(par.world()) * tokens * shape.hidden, k2To31);  // the receive buffer [W][T][H]
  BigLayer l(shape, par, {tokens, tokens}, 5);
  l.run_and_check("two ranks");
  for (int r = 0; r < par.world(); ++r)
    EXPECT_GT(l.rows_used(r) * shape.hidden, k2To31) << "rank " << r << ": the plan's rows should pass 2^31 elements";
}

}  // namespace
