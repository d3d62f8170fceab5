#include "group_runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <numeric>
#include <sstream>

#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"
#include "harness/device_random.hpp"
#include "harness/plan_rewrite.hpp"
#include "layer0_trace.hpp"

namespace comet::bench {
namespace {

// The pull order a comet layer-0 launch of the run takes (--pull-order, --expert-order; else the default).
const char* pull_order_name(const BenchOptions& o) {
  if (o.expert_by_size) return "expert-size";
  return o.pull_order.value_or(kDefaultPullOrder) == PullOrder::expert ? "expert" : "source";
}

// The tuner's pick, at a given tile width (0: the width the tuner picks too).
LayerRequest tuned(int tile_n) {
  LayerRequest r;
  if (tile_n > 0) r.tile_n = tile_n;
  return r;
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }
double gb_s(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

uint64_t seed_of(uint64_t seed, const std::string& a, long long b, long long c) {
  uint64_t h = seed * 0x9E3779B97F4A7C15ull;
  for (char ch : a) h = (h ^ uint64_t(ch)) * 0x100000001B3ull;
  h = (h ^ uint64_t(b)) * 0x100000001B3ull;
  return (h ^ uint64_t(c)) * 0x100000001B3ull;
}

}  // namespace

GroupRunner::GroupRunner(const BenchOptions& options, const Model& model, const Layout& layout, Link link,
                         int max_tokens, int max_rows)
    // The timer's events: --paired times in rotation two calls, a whole n_comm sweep, the backward's
    // comet, sequential and chunked, or every standalone GEMM (--standalone-gemms).
    : o_(options), model_(model), layout_(layout), link_(link),
      timer_(std::max({3, int(std::size(kStandaloneGemms)), int(options.n_comm.size())}) * options.reps) {
  const MoeShape& s = model.shape;
  const Parallel& p = layout.par;
  const int W = p.world(), H = s.hidden, k = s.topk, el = p.local_experts(s), fs = p.ffn_shard(s);
  const int n0 = is_gated(s.act) ? 2 * fs : fs;
  team_ = std::make_unique<LocalTeam>(W, link);
  MoeOptions mo;
  mo.layer0 = variant(o_.tile_n, 2, 0);
  mo.layer1 = variant(o_.tile_n == 320 ? 256 : o_.tile_n, 4);  // 320: layer 0's alone (l0 runs only)
  mo.adaptive_split = o_.adaptive;
  mo.narrow_n_tiles = o_.narrow_n_tiles;
  mo.cublas_backward = o_.cublas_backward;
  mo.check_schedule = o_.check_schedule;
  mo.tune_table = o_.tune_table;
  mo.training = o_.has_backward();  // the forwards keep their pre-activations (every forward record then pays it)
  mo.compute_ranks = {0};           // the others only stage their tokens: no gathered rows, hidden or Y
  mo.dtype = fp8() ? DType::e4m3 : DType::bf16;
  mo.wave_chunk = o_.wave_chunk;
  if (o_.pull_order) mo.pull_order = *o_.pull_order;
  moe_ = std::make_unique<FusedMoe>(*team_, s, p, MoeCapacity{max_tokens, max_rows}, mo);
  // Rank 0's weights only, shared by every rank: only rank 0 computes, the others stage their tokens.
  w0_ = testing::DeviceBuffer(size_t(el) * n0 * H * 2);
  w1_ = testing::DeviceBuffer(size_t(el) * H * fs * 2);
  cudaStream_t s0 = team_->stream(0);
  testing::fill_random_bf16(w0_.get(), size_t(el) * n0 * H, 1.5f / std::sqrt(float(H)), seed_of(o_.seed, model.name, 0, 0), s0);
  testing::fill_random_bf16(w1_.get(), size_t(el) * H * fs, 1.5f / std::sqrt(float(s.ffn)), seed_of(o_.seed, model.name, 1, 0), s0);
  for (int r = 0; r < W; ++r) {
    Rank rank;
    rank.x = testing::DeviceBuffer(size_t(max_tokens) * H * 2);
    rank.ids = testing::DeviceBuffer(size_t(max_tokens) * k * 4);
    rank.gates = testing::DeviceBuffer(size_t(max_tokens) * k * 4);
    rank.out = testing::DeviceBuffer(size_t(max_tokens) * H * 2);
    ranks_.push_back(std::move(rank));
  }
  if (mo.training) {
    grads_.dout = testing::DeviceBuffer(size_t(max_tokens) * H * 2);
    grads_.dx = testing::DeviceBuffer(size_t(max_tokens) * H * 2);
    grads_.dgates = testing::DeviceBuffer(size_t(max_tokens) * k * 4);
    grads_.dw0 = testing::DeviceBuffer(w0_.bytes());  // bf16 weight gradients (BackwardOptions' default)
    grads_.dw1 = testing::DeviceBuffer(w1_.bytes());
    testing::fill_random_bf16(grads_.dout.get(), size_t(max_tokens) * H, 1.0f, seed_of(o_.seed, model.name, 2, 0), s0);
  }
  const float* w0_scales = nullptr;
  const void* w0_gemm = w0_.get();
  if (fp8()) {
    // Layer 0 multiplies W0's e4m3 codes with their 128 x 128 block scales, quantised here once.
    w0_fp8_ = testing::quantize_w0(s, p, w0_.get(), s0);
    w0_scales = w0_fp8_.scale_ptr();
    w0_gemm = w0_fp8_.codes.get();
  }
  COMET_CUDA_CHECK(cudaStreamSynchronize(s0));
  // The baselines' comm kernels run 256-wide tiles' instances when comet is timed at 192 (as before
  // layer 1 had a 192-wide tile) or 320 (layer 0's only), so that their records stay comparable across runs.
  const int baseline_tile = o_.tile_n == 192 || o_.tile_n == 320 ? 256 : o_.tile_n;
  SequentialOptions so;
  so.tile_n = baseline_tile;
  seq_ = std::make_unique<SequentialMoe>(*moe_, so);
  ChunkedOptions co;
  co.tile_n = baseline_tile;
  co.comm_blocks = o_.chunk_comm_blocks;
  if (!fp8()) chunked_ = std::make_unique<ChunkedMoe>(*moe_, co);  // bf16 only
  for (int r = 0; r < W; ++r) {
    seq_->set_weights(r, w0_gemm, w1_.get(), w0_scales);
    if (chunked_) chunked_->set_weights(r, w0_.get(), w1_.get());
  }
}

GroupRunner::~GroupRunner() {
  try {
    team_->synchronize();
  } catch (...) {
  }
}

LayerRequest GroupRunner::variant(int tile_n, int n_comm, int layer) const {
  LayerRequest r = LayerRequest::forced(tile_n, n_comm);
  if (o_.m_group > 0) r.m_group = o_.m_group;
  if (o_.m_order && layer == 0) r.m_order = true;
  return r;
}

void GroupRunner::recover() {
  try {
    team_->synchronize();
  } catch (const std::exception&) {
  }
  for (int r = 0; r < layout_.par.world(); ++r) team_->clear_status(r);
}

Timing GroupRunner::time(const std::function<void()>& pre, const std::function<void()>& fn) {
  return timer_.measure(team_->stream(0), warmup_, o_.reps, pre, fn, [&] { moe_->sync_and_check(); });
}

void GroupRunner::stage_case(const CaseInput& in) {
  const int W = layout_.par.world(), H = model_.shape.hidden;
  cudaStream_t s0 = team_->stream(0);
  case_seed_ = seed_of(o_.seed, model_.name + in.routing, in.tokens, 7);
  for (int r = 0; r < W; ++r) {
    ranks_[r].ids.upload((*in.ranks)[r].ids);
    ranks_[r].gates.upload((*in.ranks)[r].gates);
    testing::fill_random_bf16(ranks_[r].x.get(), size_t(in.tokens) * H, 1.0f, case_seed_ + r, s0);
  }
  COMET_CUDA_CHECK(cudaStreamSynchronize(s0));
  for (int r = 0; r < W; ++r) {
    const Rank& d = ranks_[r];
    moe_->engine().stage(r, RankBatch{in.tokens, d.x.get(), d.ids.as<int32_t>(), d.gates.as<float>(), d.out.get()});
  }
  team_->barrier();  // every rank's tokens and routing are in its exported buffers
}

void GroupRunner::add_record(std::vector<Record>& out, Record r, const Timing& t, double flops, bool comm,
                             const CaseRows& c) const {
  // Token rows cross the link once per pull and once per combine: l0 and l1 one of them, fwd and bwd
  // both, fwd+bwd four.
  set_timing(r, t, flops, comm, c);
  out.push_back(r);
}

void GroupRunner::set_timing(Record& r, const Timing& t, double flops, bool comm, const CaseRows& c) const {
  const int passes = r.layer == "fwd+bwd" ? 4 : r.layer == "fwd" || r.layer == "bwd" ? 2 : 1;
  r.median_ms = t.median_ms;
  r.min_ms = t.min_ms;
  r.max_ms = t.max_ms;
  r.samples = t.samples;
  if (flops > 0) r.tflops = tflops(flops, t.median_ms);
  // A pull moves token rows (bf16, or fp8 records), a combine bf16 rows.
  const double bf16_row = 2.0 * model_.shape.hidden;
  const double pull_row = fp8() ? double(fp8::record_bytes(model_.shape.hidden)) : bf16_row;
  const double bytes_per_remote = r.layer == "l0" ? pull_row
                                  : r.layer == "fwd" ? pull_row + bf16_row
                                  : passes * bf16_row;
  if (comm) r.gb_s = gb_s(bytes_per_remote * c.remote, t.median_ms);
  r.rows = c.rows;
  r.link_rows = c.remote;
}

namespace {
// The last record of `layer` from out[first...] that `is` accepts, or null.
template <class Pred>
Record* find_record(std::vector<Record>& out, size_t first, const std::string& layer, Pred is) {
  Record* found = nullptr;
  for (size_t i = first; i < out.size(); ++i)
    if (out[i].layer == layer && is(out[i])) found = &out[i];
  return found;
}
}  // namespace

void GroupRunner::retime_pair(std::vector<Record>& out, size_t first, const std::string& layer,
                              const TimedCall& comet, const TimedCall& sequential, double flops, const CaseRows& c) {
  Record* tuned = find_record(out, first, layer, [](const Record& r) { return r.system == "comet" && r.tuned; });
  Record* seq = find_record(out, first, layer, [](const Record& r) { return r.system == "sequential"; });
  if (tuned && seq) retime(*tuned, *seq, comet, sequential, flops, true, c);
}

void GroupRunner::retime_gemm_pair(std::vector<Record>& out, size_t first, const std::string& layer,
                                   const TimedCall& comet, const TimedCall& cublas, double flops, const CaseRows& c) {
  Record* gemm = find_record(out, first, layer, [](const Record& r) { return r.system == "comet" && r.mode == "gemm_only"; });
  Record* base = find_record(out, first, layer, [](const Record& r) { return r.system == "cublas"; });
  if (gemm && base) retime(*gemm, *base, comet, cublas, flops, false, c);
}

void GroupRunner::retime(Record& a, Record& b, const TimedCall& call_a, const TimedCall& call_b, double flops,
                         bool comm, const CaseRows& c) {
  retime_all({&a, &b}, {call_a, call_b}, flops, comm, c);
}

void GroupRunner::retime_all(const std::vector<Record*>& records, const std::vector<TimedCall>& calls, double flops,
                             bool comm, const CaseRows& c) {
  const std::vector<Timing> t = timer_.measure_rotation(team_->stream(0), warmup_, o_.reps, calls,
                                                        [&] { moe_->sync_and_check(); });
  for (size_t i = 0; i < records.size(); ++i) {
    set_timing(*records[i], t[i], flops, comm, c);
    records[i]->paired = true;
  }
}

std::map<int, int> GroupRunner::chunk_counts_used() {
  std::map<int, int> used_to_requested;
  for (int requested : o_.chunks) {
    chunked_->options().chunks = requested;
    moe_->engine().prepare(0);
    chunked_->setup(0);
    used_to_requested.emplace(chunked_->chunks(0), requested);  // keeps the first that gives a C
  }
  return used_to_requested;
}

// The wave chunk rank 0's plan ran a tuned layer-0 launch with `r0` by (its table's chunk for the case's
// load class), for that launch's records: 0 where it is the default order.
int GroupRunner::tuned_chunk(const CaseInput& in, const LayerRequest& r0) const {
  if (o_.wave_chunk > 0) return o_.wave_chunk;
  const int chunk = moe_->engine().plan_wave_chunk(in.tokens, int(in.stats.rank0_rows), r0);
  return chunk != kDefaultWaveChunk ? chunk : 0;
}

void GroupRunner::trace_layer0(const CaseInput& in, int tile_n, const Timing& gemm, const std::map<int, Timing>& fused,
                               const std::map<int, Timing>& comm, const std::function<void()>& pre,
                               const std::function<std::function<void()>(LayerMode, int)>& run) {
  Layer0Tracer tracer(moe_->engine(), tile_n);
  tracer.trace("gemm_only", 0, gemm.median_ms, pre, run(LayerMode::gemm_only, 0));
  for (const auto& [n, t] : fused) {
    if (n == 0) continue;  // the sequential mode: no comm blocks beside the GEMM
    tracer.trace("fused", n, t.median_ms, pre, run(LayerMode::fused, n));
    const auto c = comm.find(n);
    tracer.trace("comm_only", n, c == comm.end() ? 0.0 : c->second.median_ms, pre, run(LayerMode::comm_only, n));
  }
  const CaseKey k = base(in, "l0", "comet").key;
  std::ostringstream header;
  header << "\"model\": \"" << k.model << "\", \"layout\": \"" << k.layout << "\", \"link\": \"" << k.link
         << "\", \"routing\": \"" << k.routing << "\", \"tokens\": " << k.tokens_per_rank << ", \"pull_order\": \""
         << pull_order_name(o_) << "\", \"wave_chunk\": " << o_.wave_chunk << ", \"rows\": " << in.stats.rank0_rows;
  tracer.write(o_.trace_dir + "/" + k.model + "_" + k.layout + "_" + k.link + "_" + k.routing + "_" +
                   std::to_string(in.tokens) + ".json",
               header.str());
}

Record GroupRunner::base(const CaseInput& in, const std::string& layer, const std::string& system) const {
  Record r;
  r.key = CaseKey{model_.name,    layout_.name, layout_.par.world(), layout_.par.ep, layout_.par.tp,
                  to_string(link_), in.tokens,   in.routing};
  r.layer = layer;
  r.system = system;
  r.dtype = o_.dtype;
  if (system == "comet") r.wave_chunk = o_.wave_chunk;
  if (system == "comet" && o_.pull_order) r.pull_order = pull_order_name(o_);
  r.tile_n = o_.tile_n;
  r.layer_bytes_per_rank = (long long)moe_->device_bytes_per_rank();
  r.rows_cap = moe_->capacity().max_rows_per_rank;
  r.tokens_cap = moe_->capacity().max_tokens_per_rank;
  return r;
}

std::string GroupRunner::check_note(int launch, int tokens) const {
  if (!o_.check_schedule) return "";
  const auto v = moe_->engine().schedule_verdict(0, launch, tokens);
  if (!v) return "+check:none";
  return *v == ScheduleArm::pick ? "+checked:pick" : "+checked:sequential";
}

void GroupRunner::run_case(const CaseInput& in, std::vector<Record>& out) {
  const size_t case_begin = out.size();
  warmup_ = in.warmup;
  stage_case(in);
  MoeEngine& moe = moe_->engine();
  SequentialMoe& seq = *seq_;
  const MoeShape& s = model_.shape;
  const int W = layout_.par.world(), H = s.hidden, fs = layout_.par.ffn_shard(s), tn = o_.tile_n;
  const int tuned_tn = o_.tuned_tile ? 0 : tn;  // the tuned records' width: --tile-n, or the tuner's
  const int n0_cols = is_gated(s.act) ? 2 * fs : fs;
  const Rank& d0 = ranks_[0];
  const RankBatch b0{in.tokens, d0.x.get(), d0.ids.as<int32_t>(), d0.gates.as<float>(), d0.out.get()};

  // Rank 0's plan, a complete A (every remote row pulled) and valid hidden rows for GEMM-only timings.
  seq.prepare(0);
  if (W > 1) moe.layer0(0, LayerMode::comm_only, variant(tn, moe.resident_blocks(0, tn) - 1));
  seq.gemm0(0);
  seq.activation(0);
  moe.sync_and_check();
  const std::vector<int>& er = seq.expert_rows(0);
  const long long rows = std::accumulate(er.begin(), er.end(), 0LL);
  int32_t units = 0, local_units = 0;
  COMET_CUDA_CHECK(cudaMemcpy(&units, moe.plan(0).view().num_units, 4, cudaMemcpyDeviceToHost));
  COMET_CUDA_CHECK(cudaMemcpy(&local_units, moe.plan(0).view().num_local_units, 4, cudaMemcpyDeviceToHost));
  const long long remote = units - local_units;
  if (rows != in.stats.rank0_rows || remote != in.stats.rank0_remote_units)
    std::fprintf(stderr, "  warning: device plan has %lld rows / %lld remote units, host count %lld / %lld\n", rows,
                 remote, in.stats.rank0_rows, in.stats.rank0_remote_units);
  const double flops0 = 2.0 * rows * n0_cols * H, flops1 = 2.0 * rows * H * fs;
  // The backward's fused launches: G W1 (N = F/tp, K = H) and dPre W0 (N = H, K = W0 rows).
  const double flops2 = 2.0 * rows * fs * H, flops3 = 2.0 * rows * H * n0_cols;
  const CaseRows case_rows{rows, remote};
  auto stamp = [&](Record r, const Timing& t, double flops, bool comm) {
    add_record(out, r, t, flops, comm, case_rows);
  };

  const bool L0 = o_.has_layer("l0"), L1 = o_.has_layer("l1"), FWD = o_.has_layer("fwd");
  const bool L2 = o_.has_layer("l2"), L3 = o_.has_layer("l3");
  // The sequential forward also runs in the backward's records (untimed before bwd, timed in fwd+bwd).
  const bool SEQ_FWD = FWD || o_.has_layer("bwd") || o_.has_layer("fwd+bwd");
  const bool want_cublas = o_.has_system("cublas"), want_comet = o_.has_system("comet");
  const bool want_seq = o_.has_system("sequential"), want_chunked = o_.has_system("chunked");
  std::string line;  // the progress line
  auto note = [&](const char* fmt, double a, double b = 0) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), fmt, a, b);
    line += buf;
  };

  // ---- cuBLAS alone on rank 0's exact grouped problems, both paths; the faster one serves the baselines
  // (every run of the sequential forward: a backward-only run left it on the default grouped path,
  // which at 16384 tokens made its training forward 2-2.5x slower and inflated fwd+bwd speed-ups).
  GemmPath best_path[2] = {GemmPath::grouped, GemmPath::grouped};
  for (int layer = 0; layer < 2; ++layer) {
    const bool wanted = layer == 0 ? L0 : L1;
    if (!(want_cublas && wanted) && !((want_seq || want_chunked) && (wanted || SEQ_FWD))) continue;
    Timing t[2];
    for (GemmPath path : {GemmPath::grouped, GemmPath::loop}) {
      (layer == 0 ? seq.options().gemm0 : seq.options().gemm1) = path;
      t[int(path)] = time(nullptr, [&] { layer == 0 ? seq.gemm0(0) : seq.gemm1(0); });
    }
    const GemmPath best = t[1].median_ms < t[0].median_ms ? GemmPath::loop : GemmPath::grouped;
    best_path[layer] = best;
    if (want_cublas && wanted) {
      Record r = base(in, layer == 0 ? "l0" : "l1", "cublas");
      r.cublas_path = to_string(best);
      r.other_path_ms = t[1 - int(best)].median_ms;
      stamp(r, t[int(best)], layer == 0 ? flops0 : flops1, false);
      note(layer == 0 ? " cublas l0 %.3f" : " l1 %.3f", t[int(best)].median_ms);
    }
  }
  seq.options().gemm0 = best_path[0];
  seq.options().gemm1 = best_path[1];
  if (chunked_) {
    chunked_->options().gemm0 = best_path[0];
    chunked_->options().gemm1 = best_path[1];
  }

  // --check-schedule: the check's launches (MoeOptions::check_schedule: 12 per launch, their times read
  // back at later calls) before any tuned timing, so that the tuned records time its verdicts.
  if (o_.check_schedule && want_comet && (L0 || L1 || FWD)) {
    for (int i = 0; i < 30; ++i) {  // each call synchronised: its times are in at the next call's query
      moe.prepare(0, tuned(tuned_tn));
      moe.layer0(0, LayerMode::fused, tuned(tuned_tn));
      moe.layer1(0, LayerMode::fused, tuned(tuned_tn));
      moe.finish(0, b0);
      moe_->sync_and_check();
    }
  }

  // ---- comet: gemm_only, the fused n_comm sweep, comm_only at the best n_comm (or every one).
  int best_n[2] = {moe.options().layer0.n_comm.value_or(0), moe.options().layer1.n_comm.value_or(0)};
  if (want_comet) {
    // The launches by id (comet/tune.hpp): 0, 1 the forward's layers, 2, 3 the backward's fused kernels,
    // which run on a staged backward: one training forward and its output gradients, staged once.
    const bool wanted[kLaunchLayers] = {L0, L1, L2, L3};
    const double launch_flops[kLaunchLayers] = {flops0, flops1, flops2, flops3};
    bool backward_staged = false;
    for (int layer = 0; layer < kLaunchLayers; ++layer) {
      if (!wanted[layer]) continue;
      const std::string name = "l" + std::to_string(layer);
      const double flops = launch_flops[layer];
      const int limit = moe.resident_blocks(layer, tn);
      if (layer >= 2 && !backward_staged) {
        moe.prepare(0, tuned(tuned_tn));
        moe.layer0(0, LayerMode::fused, tuned(tuned_tn));
        moe.layer1(0, LayerMode::fused, tuned(tuned_tn));
        moe.finish(0, b0);
        moe.stage_grad(0, grads_.grad());
        backward_staged = true;
      }
      // A pull re-runs its prepare (a new epoch, its local rows, and the pull refills the rows); a
      // combine needs only a new epoch. (Re-running a backward launch rewrites its own outputs in place:
      // the values drift, the work does not.)
      // --expert-order size: the plan rewritten after each layer-0 prepare (harness/plan_rewrite.hpp).
      auto prepare0 = [&](const LayerRequest& r) {
        moe.prepare(0, r);
        if (o_.expert_by_size) testing::order_smallest_expert_first(moe.plan(0), team_->stream(0));
      };
      auto pre = [&] {
        if (layer == 0) prepare0(moe.options().layer0);  // prepare(0)'s request
        else if (layer == 2) moe.prepare_grad(0);
        else moe.advance_epoch(0);
      };
      auto launch = [&moe, layer, tn](LayerMode mode, const LayerRequest& r) {
        switch (layer) {
          case 0: moe.layer0(0, mode, r); break;
          case 1: moe.layer1(0, mode, r); break;
          case 2: moe.grad_layer1(0, mode, r); break;
          default: moe.grad_layer0(0, mode, r); break;
        }
      };
      auto run = [&](LayerMode mode, int n) {
        return [this, launch, mode, tn, n, layer] { launch(mode, variant(tn, n, layer)); };
      };
      const Timing gemm = time(nullptr, run(LayerMode::gemm_only, 0));
      Record g = base(in, name, "comet");
      g.mode = "gemm_only";
      g.n_comm = 0;
      g.picked_by = to_string(moe.decision(layer, 0, LayerMode::gemm_only, variant(tn, 0)).standalone_gemm);
      stamp(g, gemm, flops, false);
      if (o_.standalone_gemms && layer > 0) {  // each GEMM the launch may run alone: modes gemm_<name>
        std::vector<TimedCall> calls;
        for (StandaloneGemm k : kStandaloneGemms) {
          LayerRequest r = variant(tn, 0);
          r.standalone_gemm = k;
          calls.push_back({nullptr, [launch, r] { launch(LayerMode::gemm_only, r); }});
        }
        // --paired: in rotation (comet-tune compares them: the same clocks for each).
        std::vector<Timing> t;
        if (o_.paired)
          t = timer_.measure_rotation(team_->stream(0), warmup_, o_.reps, calls, [&] { moe_->sync_and_check(); });
        else
          for (const TimedCall& c : calls) t.push_back(time(c.pre, c.fn));
        for (size_t i = 0; i < calls.size(); ++i) {
          Record gk = base(in, name, "comet");
          gk.mode = std::string("gemm_") + to_string(kStandaloneGemms[i]);
          gk.n_comm = 0;
          stamp(gk, t[i], flops, false);
        }
      }
      std::map<int, Timing> fused, comm;
      std::vector<int> swept;
      for (int n : o_.n_comm)
        if (n < limit) swept.push_back(n);
      if (o_.paired && swept.size() > 1) {
        // In rotation, so that the sweep's best point (the tuner's table entry) does not depend on
        // which n_comm ran while the GPU was hotter (it sits at its power cap: clocks drift).
        std::vector<TimedCall> calls;
        for (int n : swept) calls.push_back({pre, run(LayerMode::fused, n)});
        const std::vector<Timing> t = timer_.measure_rotation(team_->stream(0), warmup_, o_.reps, calls,
                                                              [&] { moe_->sync_and_check(); });
        for (size_t i = 0; i < swept.size(); ++i) fused[swept[i]] = t[i];
      } else {
        for (int n : swept) fused[n] = time(pre, run(LayerMode::fused, n));
      }
      if (fused.empty()) continue;
      int best = fused.begin()->first;
      for (const auto& [n, t] : fused)
        if (t.median_ms < fused[best].median_ms) best = n;
      if (layer < 2) best_n[layer] = best;
      for (const auto& [n, t] : fused) {
        if (n == 0 || (!o_.comm_all && n != best)) continue;  // n 0: sequential mode, no comm blocks
        comm[n] = time(pre, run(LayerMode::comm_only, n));
      }
      if (layer == 0 && !o_.trace_dir.empty()) trace_layer0(in, tn, gemm, fused, comm, pre, run);
      for (const auto& [n, t] : comm) {
        Record c = base(in, name, "comet");
        c.mode = "comm_only";
        c.n_comm = n;
        stamp(c, t, 0, true);
      }
      for (const auto& [n, t] : fused) {
        Record f = base(in, name, "comet");
        f.mode = "fused";
        f.n_comm = n;
        f.best = n == best;
        if (moe.decision(layer, 0, LayerMode::fused, variant(tn, n, layer)).m_order) f.tile_order = "m";
        if (comm.count(n)) {
          f.overlap_efficiency = t.median_ms / std::max(gemm.median_ms, comm[n].median_ms);
          f.t_seq_ms = gemm.median_ms + comm[n].median_ms;
        }
        stamp(f, t, flops, true);
      }
      // The tuner's pick for this layer (table, else cost model): a record of its own, "tuned": true.
      // With --adaptive the launch gets n_comm -1, so the kernel may re-pick it from the plan; the record
      // holds the n_comm it ran with.
      const LaunchDecision pick = moe.decision(layer, 0, LayerMode::fused, tuned(tuned_tn));
      const int tn_comm = pick.n_comm;
      if (tn_comm >= 0 && tn_comm < moe.resident_blocks(layer, pick.tile_n)) {
        auto run_tuned = [launch, tuned_tn] { launch(LayerMode::fused, tuned(tuned_tn)); };
        auto run_pick = [launch, &pick] { launch(LayerMode::fused, LayerRequest::forced(pick.tile_n, pick.n_comm)); };
        // Layer 0's plan ordered for the tuned launch (its table's chunk rule), outside the timed region.
        auto pre_tuned = [&] { layer == 0 ? prepare0(tuned(tuned_tn)) : pre(); };
        const Timing t = o_.adaptive                                   ? time(pre_tuned, run_tuned)
                         : fused.count(tn_comm) && pick.tile_n == tn ? fused[tn_comm]
                                                                     : time(pre, run_pick);
        Record f = base(in, name, "comet");
        f.mode = "fused";
        f.n_comm = o_.adaptive ? moe.last_n_comm(0, layer) : tn_comm;
        f.tuned = true;
        f.tile_n = pick.tile_n;
        if (layer == 0 && o_.adaptive) f.wave_chunk = tuned_chunk(in, tuned(tuned_tn));
        f.picked_by = std::string(pick.picked_by) + (o_.adaptive ? "+adaptive" : "") + check_note(layer, in.tokens);
        stamp(f, t, flops, true);
      }
      line += std::string(" | comet ") + name;
      note(" gemm %.3f fused %.3f", gemm.median_ms, fused[best].median_ms);
      if (best > 0)
        note(" (n=%.0f) eff %.2f", best, fused[best].median_ms / std::max(gemm.median_ms, comm[best].median_ms));
      else
        note(" (n=%.0f: sequential mode)", 0, 0);
    }
  }

  // ---- sequential: dispatch + GEMM0 + activation, GEMM1 + combine, each step on the whole GPU.
  if (want_seq && (L0 || L1)) {
    seq.prepare(0);
    if (L0) {
      const Timing t = time([&] { moe.prepare(0); }, [&] { seq.layer0(0); });
      Record r = base(in, "l0", "sequential");
      r.cublas_path = to_string(best_path[0]);
      stamp(r, t, flops0, true);
      note(" | seq l0 %.3f", t.median_ms);
    }
    if (L1) {
      const Timing t = time(nullptr, [&] { seq.layer1(0); });
      Record r = base(in, "l1", "sequential");
      r.cublas_path = to_string(best_path[1]);
      stamp(r, t, flops1, true);
      note(" l1 %.3f", t.median_ms);
    }
  }

  // ---- chunked: each C (as used: at most W-1 remote chunks), the best one per layer reported.
  int best_c = o_.chunks.front();
  if (want_chunked && (L0 || L1 || FWD)) {
    ChunkedMoe& chunked = *chunked_;  // bf16 runs (the options refuse chunked with e4m3)
    struct ChunkTimes {
      int requested = 0;
      Timing l0, l1;
    };
    std::map<int, ChunkTimes> by_used;
    for (const auto& [used, requested] : chunk_counts_used()) {
      chunked.options().chunks = requested;
      moe.prepare(0);
      chunked.setup(0);
      ChunkTimes ct;
      ct.requested = requested;
      if (L0) ct.l0 = time([&] { moe.prepare(0); }, [&] { chunked.layer0(0); });
      if (L1) ct.l1 = time(nullptr, [&] { chunked.layer1(0); });
      by_used[used] = ct;
    }
    for (int layer = 0; layer < 2 && !by_used.empty(); ++layer) {
      if (!(layer == 0 ? L0 : L1)) continue;
      auto pick = [&](const ChunkTimes& c) { return layer == 0 ? c.l0 : c.l1; };
      auto best = by_used.begin();
      for (auto it = by_used.begin(); it != by_used.end(); ++it)
        if (pick(it->second).median_ms < pick(best->second).median_ms) best = it;
      Record r = base(in, layer == 0 ? "l0" : "l1", "chunked");
      r.chunks = best->first;
      r.chunks_requested = best->second.requested;
      r.cublas_path = to_string(best_path[layer]);
      stamp(r, pick(best->second), layer == 0 ? flops0 : flops1, true);
      note(layer == 0 ? " | chunked l0 %.3f (C=%.0f)" : " l1 %.3f (C=%.0f)", pick(best->second).median_ms, best->first);
    }
    // The forward uses the C with the least l0 + l1 time.
    double least = 1e30;
    for (const auto& [used, ct] : by_used) {
      const double sum = ct.l0.median_ms + ct.l1.median_ms;
      if (sum < least) {
        least = sum;
        best_c = ct.requested;
      }
    }
  }

  // The tuned variant of a layer as its tuned records run it: the tuner's request (the kernel may
  // re-pick n_comm) with the adaptive split, else the decision forced.
  auto tuned_request = [&](int layer) {
    if (o_.adaptive) return tuned(tuned_tn);
    const LaunchDecision d = moe.decision(layer, 0, LayerMode::fused, tuned(tuned_tn));
    LayerRequest r = LayerRequest::forced(d.tile_n, d.n_comm);
    r.m_group = d.m_group;
    r.n_group = d.n_group;
    r.standalone_gemm = d.standalone_gemm;
    r.one_launch = d.one_launch;
    return r;
  };
  // The whole forward of rank 0: prepare, layer 0, layer 1, final reduce.
  auto comet_forward = [&](const LayerRequest& r0, const LayerRequest& r1) {
    moe.prepare(0, r0);
    moe.layer0(0, LayerMode::fused, r0);
    moe.layer1(0, LayerMode::fused, r1);
    moe.finish(0, b0);
  };
  auto seq_forward = [&] {
    seq.prepare(0);  // reads the row counts: a host synchronisation inside the timed region
    seq.layer0(0);
    seq.layer1(0);
    moe.finish(0, b0);
  };

  // ---- the whole forward.
  if (FWD) {
    if (want_comet) {
      // The forward with each layer's best n_comm of its sweep: only when both sweeps ran (a fwd-only
      // run has no such pair; its comet record is the tuned one below).
      const int n0 = best_n[0], n1 = best_n[1];
      const bool swept = L0 && L1;
      Timing t;
      if (swept) {
        t = time(nullptr, [&] { comet_forward(variant(tn, n0, 0), variant(tn, n1, 1)); });
        Record r = base(in, "fwd", "comet");
        r.mode = "fused";
        r.n_comm = n0;
        r.n_comm_l1 = n1;
        r.best = true;
        if (moe.decision(0, 0, LayerMode::fused, variant(tn, n0, 0)).m_order) r.tile_order = "m";
        stamp(r, t, flops0 + flops1, true);
        note(" | fwd comet %.3f", t.median_ms);
      }
      // What a user gets without choosing: the tuner's picks for both layers.
      const LaunchDecision t0 = moe.decision(0, 0, LayerMode::fused, tuned(tuned_tn));
      const LaunchDecision t1 = moe.decision(1, 0, LayerMode::fused, tuned(tuned_tn));
      const LayerRequest v0 = tuned_request(0), v1 = tuned_request(1);
      const bool same = swept && !o_.adaptive && t0.n_comm == n0 && t1.n_comm == n1 && t0.tile_n == tn && t1.tile_n == tn;
      const Timing tt = same ? t : time(nullptr, [&] { comet_forward(v0, v1); });
      Record tr = base(in, "fwd", "comet");
      tr.mode = "fused";
      tr.n_comm = o_.adaptive ? moe.last_n_comm(0, 0) : t0.n_comm;
      tr.n_comm_l1 = o_.adaptive ? moe.last_n_comm(0, 1) : t1.n_comm;
      tr.tuned = true;
      tr.tile_n = t0.tile_n;  // layer 0's (layer 1's is in picked_by's decision, not recorded)
      if (o_.adaptive) tr.wave_chunk = tuned_chunk(in, v0);
      tr.picked_by = std::string(t0.picked_by) + "/" + t1.picked_by + (o_.adaptive ? "+adaptive" : "") +
                     check_note(0, in.tokens) + check_note(1, in.tokens);
      stamp(tr, tt, flops0 + flops1, true);
      note(swept ? " tuned %.3f" : " | fwd comet tuned %.3f", tt.median_ms);
    }
    if (want_seq) {
      const Timing t = time(nullptr, seq_forward);
      Record r = base(in, "fwd", "sequential");
      r.cublas_path = std::string(to_string(best_path[0])) + "/" + to_string(best_path[1]);
      stamp(r, t, flops0 + flops1, true);
      note(" seq %.3f", t.median_ms);
    }
    if (want_chunked) {
      ChunkedMoe& chunked = *chunked_;
      chunked.options().chunks = best_c;
      moe.prepare(0);
      chunked.setup(0);  // the host reads the plan once per routing: not part of the timed forward
      const Timing t = time(nullptr, [&] {
        moe.prepare(0);
        chunked.run(0);
        moe.finish(0, b0);
      });
      Record r = base(in, "fwd", "chunked");
      r.chunks = chunked.chunks(0);
      r.chunks_requested = best_c;
      r.cublas_path = std::string(to_string(best_path[0])) + "/" + to_string(best_path[1]);
      stamp(r, t, flops0 + flops1, true);
      note(" chunked %.3f", t.median_ms);
    }
  }
  if (o_.paired && want_comet && want_seq) {
    // The tuned variants as the tuned records ran them, and the baseline's steps as its records did.
    const LayerRequest r0 = tuned_request(0), r1 = tuned_request(1);
    // --one-launch-ab: layer 1's sequential schedule with our GEMM the other way too (one launch <-> two),
    // in the same rotation as the tuned run and the baseline (l1, and the forward with it).
    const LaunchDecision d1 = moe.decision(1, 0, LayerMode::fused, r1);
    const bool ab =
        o_.one_launch_ab && d1.schedule == Schedule::sequential && d1.standalone_gemm == StandaloneGemm::comet;
    LayerRequest r1_other = r1;
    r1_other.one_launch = !d1.one_launch;
    const char* other_mode = d1.one_launch ? "ab_one_launch_off" : "ab_one_launch_on";
    auto retime_ab = [&](const std::string& layer, const TimedCall& comet, const TimedCall& other,
                         const TimedCall& sequential, double flops) {
      if (!ab) return retime_pair(out, case_begin, layer, comet, sequential, flops, case_rows);
      auto tuned_of = [&] {
        return find_record(out, case_begin, layer, [](const Record& r) { return r.system == "comet" && r.tuned; });
      };
      auto seq_of = [&] {
        return find_record(out, case_begin, layer, [](const Record& r) { return r.system == "sequential"; });
      };
      if (!tuned_of() || !seq_of()) return;
      Record alt = *tuned_of();
      alt.tuned = false;
      alt.mode = other_mode;
      out.push_back(alt);  // may move the records: their pointers are taken after it
      retime_all({tuned_of(), &out.back(), seq_of()}, {comet, other, sequential}, flops, true, case_rows);
    };
    if (L0)
      retime_pair(out, case_begin, "l0", {[&] { moe.prepare(0, r0); }, [&] { moe.layer0(0, LayerMode::fused, r0); }},
                  {[&] { moe.prepare(0); }, [&] { seq.layer0(0); }}, flops0, case_rows);
    if (L1)
      retime_ab("l1", {[&] { moe.advance_epoch(0); }, [&] { moe.layer1(0, LayerMode::fused, r1); }},
                {[&] { moe.advance_epoch(0); }, [&] { moe.layer1(0, LayerMode::fused, r1_other); }},
                {nullptr, [&] { seq.layer1(0); }}, flops1);
    if (FWD)
      retime_ab("fwd", {nullptr, [&] { comet_forward(r0, r1); }},
                {nullptr, [&] { comet_forward(r0, r1_other); }}, {nullptr, seq_forward}, flops0 + flops1);
    line += ab ? " | paired, one-launch A/B" : " | paired";
  }
  if (o_.paired && want_comet && want_cublas) {
    // The GEMMs alone, each against cuBLAS's (the faster path, as its record ran). A complete A and
    // valid hidden rows are still in place from the sweeps' last runs; their values do not matter.
    // Layer 1's GEMM is the one its tuned launch runs alone (the table's standalone GEMM where it picked
    // the sequential schedule, else ours).
    if (L0)
      retime_gemm_pair(out, case_begin, "l0", {nullptr, [&] { moe.layer0(0, LayerMode::gemm_only, variant(tn, 0)); }},
                       {nullptr, [&] { seq.gemm0(0); }}, flops0, case_rows);
    if (L1) {  // (not with --tile-n 320: layer 0's alone)
      LayerRequest gemm1 = variant(tn, 0);
      gemm1.standalone_gemm = moe.decision(1, 0, LayerMode::fused, tuned(tuned_tn)).standalone_gemm;
      retime_gemm_pair(out, case_begin, "l1", {nullptr, [&] { moe.layer1(0, LayerMode::gemm_only, gemm1); }},
                       {nullptr, [&] { seq.gemm1(0); }}, flops1, case_rows);
      if (Record* g = find_record(out, case_begin, "l1", [](const Record& r) { return r.system == "comet" && r.mode == "gemm_only"; }))
        g->picked_by = to_string(*gemm1.standalone_gemm);
    }
    if (!want_seq) line += " | paired";
  }
  if (o_.has_backward()) line += run_backward(in, b0, case_rows, out);
  std::fprintf(stderr, "   %s\n", line.c_str());
}

}  // namespace comet::bench
