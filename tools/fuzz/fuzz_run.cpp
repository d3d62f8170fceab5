#include "tools/fuzz/fuzz_run.hpp"

#include <cmath>
#include <sstream>

#include "comet/bf16.hpp"
#include "comet/cuda_check.hpp"
#include "comet/reference.hpp"
#include "comet/weight_layout.hpp"
#include "harness/layer_compare.hpp"
#include "harness/moe_problem.hpp"
#include "ops/moe_engine.hpp"

namespace comet::fuzz {

using testing::DeviceBuffer;

struct FamilyRun::RankBuffers {
  DeviceBuffer w0, w1;                    // this rank's shard, kernel layout
  testing::Fp8W0 w0_fp8;                  // fp8 families: w0 quantised (e4m3 codes, 128 x 128 scales)
  DeviceBuffer x, ids, gates, out;        // sized for max_tokens + 1 (the over-capacity fault)
  DeviceBuffer dout, dx, dgates, dw0, dw1;
};

namespace {

std::vector<float> download_bf16_as_float(const DeviceBuffer& b, size_t n) {
  return from_bf16(b.download<bf16_bits>(n));
}

uint64_t fnv1a(const std::vector<float>& v, uint64_t h) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

FamilyRun::FamilyRun(const Family& family, double timeout_s) : f_(family) {
  const MoeShape& s = f_.shape;
  const Parallel& par = f_.par;
  auto local = std::make_unique<LocalTeam>(par.world(), f_.link);
  local->set_timeout(timeout_s);
  team_ = std::move(local);
  const int H = s.hidden;
  weights_ = testing::random_expert_weights(s, f_.seed);
  fused_ = std::make_unique<FusedMoe>(*team_, s, par, MoeCapacity{f_.max_tokens, f_.max_rows}, f_.options);
  const size_t T = size_t(f_.max_tokens) + 1, k = s.topk;
  const size_t gbytes = f_.grad_type == GradType::f32 ? 4 : 2;
  for (int r = 0; r < par.world(); ++r) {
    auto b = std::make_unique<RankBuffers>();
    const RankWeights w = shard_weights(s, par, r, weights_.w0, weights_.w1);
    b->w0 = DeviceBuffer(w.w0);
    b->w1 = DeviceBuffer(w.w1);
    b->x = DeviceBuffer(T * H * 2);
    b->ids = DeviceBuffer(T * k * 8);
    b->gates = DeviceBuffer(T * k * 4);
    b->out = DeviceBuffer(T * H * 2);
    if (f_.options.training) {
      b->dout = DeviceBuffer(T * H * 2);
      b->dx = DeviceBuffer(T * H * 2);
      b->dgates = DeviceBuffer(T * k * 4);
      b->dw0 = DeviceBuffer(w.w0.size() * gbytes);
      b->dw1 = DeviceBuffer(w.w1.size() * gbytes);
    }
    if (f_.options.dtype == DType::e4m3) {
      b->w0_fp8 = testing::quantize_w0(s, par, b->w0.get());
      fused_->set_weights(r, b->w0_fp8.codes.get(), b->w1.get(), b->w0_fp8.scale_ptr());
    } else {
      fused_->set_weights(r, b->w0.get(), b->w1.get());
    }
    ranks_.push_back(std::move(b));
  }
}

FamilyRun::~FamilyRun() = default;

Outcome FamilyRun::run(const Batch& batch, bool check) {
  const MoeShape& s = f_.shape;
  const Parallel& par = f_.par;
  const int W = par.world(), H = s.hidden, k = s.topk;
  const auto routing = make_batch_routing(f_, batch);
  MoeEngine& engine = fused_->engine();

  // What the layer must answer: a routing error (every rank sees it), rows over a tight capacity
  // (the ranks of the EP groups that overflow refuse; they tell every peer, so every rank's outputs
  // are NaN: kernels/peer_failure.hpp), or the right numbers.
  std::string want_error;
  std::vector<bool> must_fail(W, false);
  if (batch.fault == Fault::duplicate_id || batch.fault == Fault::id_out_of_range ||
      batch.fault == Fault::gate_not_finite) {
    want_error = batch.fault == Fault::duplicate_id   ? "duplicate expert id"
                 : batch.fault == Fault::id_out_of_range ? "out of range"
                                                          : "gate weight";
    must_fail.assign(W, true);
  } else if (f_.max_rows > 0) {
    const int cap = (f_.max_rows + 127) / 128 * 128;
    for (int r = 0; r < W; ++r)
      if (rows_needed(f_, routing, par.ep_index(r)) > cap) want_error = "rows";
    if (!want_error.empty()) must_fail.assign(W, true);
  }

  // Inputs on the host (the reference's) and on the device.
  std::vector<reference::RankInput<float>> inputs(W);
  std::vector<std::vector<float>> dout(W);
  std::vector<RankBatch> batches(W);
  std::vector<RankGrad> grads(W);
  for (int r = 0; r < W; ++r) {
    RankBuffers& b = *ranks_[r];
    const int T = batch.tokens[r];
    reference::RankInput<float>& in = inputs[r];
    in.tokens = T;
    in.x = testing::random_bf16_values(size_t(T) * H, 1.0f, batch.seed * 31 + r);
    in.ids = routing[r].ids;
    in.gates = routing[r].gates;
    b.x.upload(to_bf16(in.x));
    if (batch.ids_type == IdType::i64) {
      b.ids.upload(std::vector<int64_t>(in.ids.begin(), in.ids.end()));
    } else {
      b.ids.upload(in.ids);
    }
    b.gates.upload(in.gates);
    // A refused call must write NaN itself: its output starts as zeros. Otherwise poison: every
    // element of a right answer must have been written.
    b.out.fill_bytes(batch.fault == Fault::none && want_error.empty() ? 0xFF : 0x00);
    engine.poison_buffers(r);
    batches[r] = RankBatch{T, b.x.get(), b.ids.get(), b.gates.as<float>(), b.out.get(), batch.ids_type};
    if (f_.options.training) {
      dout[r] = testing::random_bf16_values(size_t(T) * H, 1.0f, batch.seed * 31 + 17 + r);
      b.dout.upload(to_bf16(dout[r]));
      for (DeviceBuffer* g : {&b.dx, &b.dgates, &b.dw0, &b.dw1}) g->fill_bytes(0xFF);
      grads[r] = RankGrad{b.dout.get(), b.dx.get(), b.dgates.as<float>(), b.dw0.get(), b.dw1.get()};
    }
  }

  Outcome o;
  std::ostringstream bad;
  // The over-capacity fault: refused on the host, before anything is launched.
  if (batch.fault == Fault::tokens_over_capacity) {
    o.refused = true;
    try {
      fused_->forward(batches);
      bad << "a rank passed " << batch.tokens[batch.fault_rank] << " tokens over max_tokens " << f_.max_tokens
          << " and forward() accepted it\n";
    } catch (const InvalidArgument& e) {
      const std::string want = "rank " + std::to_string(batch.fault_rank) + " passes";
      if (std::string(e.what()).find(want) == std::string::npos) bad << "refusal does not name the rank: " << e.what() << "\n";
    }
    try {
      fused_->sync_and_check();
    } catch (const std::exception& e) {
      bad << "a refused call left an error behind: " << e.what() << "\n";
    }
    o.mismatch = bad.str();
    return o;
  }

  const bool refused = !want_error.empty();
  o.refused = refused;
  const bool backward = f_.options.training && !refused;

  std::string error;
  try {
    fused_->forward(batches);
    if (backward) fused_->backward(grads, nullptr, BackwardOptions{f_.grad_type, false, f_.fused_activation});
    fused_->sync_and_check();
  } catch (const DeviceReportedError& e) {
    error = e.what();
  } catch (const TimeoutError& e) {
    bad << "timeout: " << e.what() << "\n";
  }
  if (refused) {
    if (error.empty()) {
      bad << "expected an error (" << want_error << "), the call raised none\n";
    } else if (error.find(want_error) == std::string::npos) {
      bad << "expected an error about '" << want_error << "', got: " << error << "\n";
    } else if (batch.fault != Fault::none) {
      const std::string where = "at rank " + std::to_string(batch.fault_rank) + ", token " +
                                std::to_string(batch.fault_token) + ", slot " + std::to_string(batch.fault_slot);
      if (error.find(where) == std::string::npos) bad << "the error does not name " << where << ": " << error << "\n";
    }
    for (int r = 0; r < W; ++r)
      if (must_fail[r] && batch.tokens[r] > 0 &&
          !testing::all_nan(download_bf16_as_float(ranks_[r]->out, size_t(batch.tokens[r]) * H)))
        bad << "rank " << r << " refused the call but its output is not all NaN\n";
    o.mismatch = bad.str();
    return o;
  }
  if (!error.empty()) bad << "unexpected error: " << error << "\n";
  std::vector<std::vector<float>> got(W);
  o.output_hash = 14695981039346656037ull;
  for (int r = 0; r < W; ++r) {
    got[r] = download_bf16_as_float(ranks_[r]->out, size_t(batch.tokens[r]) * H);
    o.output_hash = fnv1a(got[r], o.output_hash);
  }
  if (!check || !bad.str().empty()) {
    o.mismatch = bad.str();
    return o;
  }
  // The fp8 oracle quantises x and w0 as the layer does (reference::forward_fp8).
  const bool fp8 = f_.options.dtype == DType::e4m3;
  bad << testing::compare_outputs(s, fp8 ? reference::forward_fp8(s, par, weights_, inputs)
                                         : reference::forward(s, par, weights_, inputs), got);
  if (backward) {
    o.checked_backward = true;
    const int El = par.local_experts(s), Fs = par.ffn_shard(s), n0 = s.w0_rows() / par.tp;
    reference::Gradients<float> g;
    g.dw0.assign(weights_.w0.size(), 0.f);
    g.dw1.assign(weights_.w1.size(), 0.f);
    auto as_float = [&](const DeviceBuffer& b, size_t n) {
      return f_.grad_type == GradType::f32 ? b.download<float>(n) : download_bf16_as_float(b, n);
    };
    for (int r = 0; r < W; ++r) {
      const int T = batch.tokens[r];
      g.dx.push_back(download_bf16_as_float(ranks_[r]->dx, size_t(T) * H));
      g.dgates.push_back(ranks_[r]->dgates.download<float>(size_t(T) * k));
      unshard_add_w0(s, par, r, as_float(ranks_[r]->dw0, size_t(El) * n0 * H), g.dw0);
      unshard_add_w1(s, par, r, as_float(ranks_[r]->dw1, size_t(El) * H * Fs), g.dw1);
    }
    bad << testing::compare_gradients(s, reference::backward(s, par, weights_, inputs, dout), g,
                                      testing::gate_grad_scales(s, weights_, inputs, dout));
  }
  o.mismatch = bad.str();
  return o;
}

}  // namespace comet::fuzz
