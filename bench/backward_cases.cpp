// The backward's records of a case (bench/README.md). A backward consumes its forward's saved
// activations (the pre-activations and hidden rows become their gradients), so every timed backward
// follows a training forward of the same system, re-run untimed before each repeat; "fwd+bwd" times the
// pair. Both systems run rank 0's steps only, as the forward records do: the other ranks' exported rows
// are whatever they staged, which costs the same to pull.
#include <map>
#include <string>
#include <utility>

#include "group_runner.hpp"

namespace comet::bench {

std::string GroupRunner::run_backward(const CaseInput& in, const RankBatch& b0, const CaseRows& c,
                                      std::vector<Record>& out) {
  MoeEngine& moe = moe_->engine();
  SequentialMoe& seq = *seq_;
  const MoeShape& s = model_.shape;
  const int H = s.hidden, fs = layout_.par.ffn_shard(s), n0 = is_gated(s.act) ? 2 * fs : fs;
  // The forward's two GEMMs, and the backward's four: D = G W1_e and dW1 of layer 1's shape, dA = dPre W0_e
  // and dW0 of layer 0's, over rank 0's real rows.
  const double flops_fwd = 2.0 * c.rows * (double(n0) * H + double(H) * fs);
  const double flops_wgrad = flops_fwd, flops_bwd = 2 * flops_fwd;
  const bool BWD = o_.has_layer("bwd"), PAIR = o_.has_layer("fwd+bwd");
  const RankGrad g0 = grads_.grad();
  BackwardOptions bo{};  // bf16 weight gradients, overwritten
  bo.weight_grad_kernel = o_.wgrad_kernel;
  // The "wgrad comet" records: one per kernel a table pick can name (mode gemm_only: the persistent
  // kernel). A cooperative pick runs each of the two GEMMs on the tile the planner gives its N
  // (LaunchPlanner::picked_weight_grad_tiles: 128 x 320 on a narrow N), so its record times that pair;
  // a pick of grouped_320 runs the same pair, so it has no record of its own.
  const std::pair<WeightGradKernel, const char*> wgrad_kernels[] = {
      {WeightGradKernel::persistent, "gemm_only"},
      {WeightGradKernel::grouped, "grouped"},
      {WeightGradKernel::grouped_cooperative, "grouped_cooperative"}};
  std::string line;
  auto note = [&](const char* fmt, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), fmt, v);
    line += buf;
  };

  // ---- comet: the engine's fused steps as MoeEngine::backward runs them, on the tuner's picks (the
  // tiles too with --tuned-tile, as the forward records; else --tile-n's for every launch).
  LayerRequest pick;
  if (!o_.tuned_tile) pick.tile_n = o_.tile_n;
  auto comet_forward = [&] {
    moe.prepare(0);
    moe.layer0(0, LayerMode::fused, pick);
    moe.layer1(0, LayerMode::fused, pick);
    moe.finish(0, b0);
  };
  auto comet_backward = [&] {  // MoeEngine::backward's steps for rank 0 (its weight gradients on the side stream)
    moe.stage_grad(0, g0);
    moe.grad_steps(0, g0, bo, pick, pick);
    moe.finish_grad(0, g0);
  };
  BackwardOptions bo_act = bo;  // --fused-activation-grad: the activation's backward in the epilogue
  bo_act.fused_activation = true;
  auto comet_backward_act = [&] {
    moe.stage_grad(0, g0);
    moe.grad_steps(0, g0, bo_act, pick, pick);
    moe.finish_grad(0, g0);
  };
  // Where the records that --paired re-times in rotation are (index in `out`; -1: not made).
  long comet_bwd = -1, comet_pair = -1, seq_bwd = -1, seq_pair = -1, act_bwd = -1, act_ref = -1, chunked_bwd = -1;
  TimedCall chunked_call;  // the chunked backward at its best C, for the rotation
  if (o_.has_system("comet")) {
    auto& forward = comet_forward;
    auto& backward = comet_backward;
    if (o_.check_schedule) {  // the check's launches before any timing (--check-schedule; run_case has the forward's)
      for (int i = 0; i < 30; ++i) {  // each step synchronised, as in run_case
        forward();
        backward();
        moe_->sync_and_check();
      }
    }
    auto up_to_gates = [&] {
      moe.stage_grad(0, g0);
      moe.prepare_grad(0);
      moe.grad_layer1(0, LayerMode::fused, pick);
      moe.grad_gates(0);
    };
    // The backward's two fused launches are the planner's launches 2 (backward of layer 1, layer 0's kind
    // of kernel) and 3 (backward of layer 0): n_comm is the first's, n_comm_l1 the second's.
    auto fused_record = [&](const char* layer, const Timing& t, double flops) {
      Record r = base(in, layer, "comet");
      r.mode = "fused";
      r.tuned = true;
      r.n_comm = moe.last_n_comm(0, 2);
      r.n_comm_l1 = moe.last_n_comm(0, 3);
      r.tile_n = moe.decision(2, 0, LayerMode::fused, pick).tile_n;  // launch 3's may differ (not recorded)
      r.picked_by = std::string(moe.decision(2, 0, LayerMode::fused, pick).picked_by) + "/" +
                    moe.decision(3, 0, LayerMode::fused, pick).picked_by + (o_.adaptive ? "+adaptive" : "") +
                    "+wgrad:" + to_string(moe.planner().weight_grad_kernel(in.tokens, bo.weight_grad_kernel, fs)) + "/" +
                    to_string(moe.planner().weight_grad_kernel(in.tokens, bo.weight_grad_kernel, H)) +
                    (moe.cublas_backward(0) ? "+cublas" : "") + check_note(2, in.tokens) + check_note(3, in.tokens);
      add_record(out, r, t, flops, true, c);
    };
    if (BWD) {
      const Timing t = time(forward, backward);
      fused_record("bwd", t, flops_bwd);
      comet_bwd = long(out.size()) - 1;
      note(" | bwd comet %.3f", t.median_ms);
    }
    if (BWD) {
      // The same steps with the weight gradients on the rank's stream after the fused launches: what
      // running them beside grad_layer0 (the side stream) gains or costs.
      const Timing t = time(forward, [&] {
        moe.stage_grad(0, g0);
        moe.prepare_grad(0);
        moe.grad_layer1(0, LayerMode::fused, pick);
        moe.grad_gates(0);
        moe.grad_layer0(0, LayerMode::fused, pick);
        moe.grad_weights1(0, g0, bo);
        moe.grad_weights0(0, g0, bo);
        moe.finish_grad(0, g0);
      });
      Record r = base(in, "bwd", "comet");
      r.mode = "serial";
      add_record(out, r, t, flops_bwd, true, c);
      note(" | bwd comet serial %.3f", t.median_ms);
    }
    if (BWD && o_.fused_activation_grad) {
      // The A/B of BackwardOptions::fused_activation: mode fused_act against the same backward with the
      // two-pass activation backward (mode two_pass), a pair of their own for --paired.
      Record r = base(in, "bwd", "comet");
      r.mode = "fused_act";
      const Timing t = time(forward, comet_backward_act);
      add_record(out, r, t, flops_bwd, true, c);
      act_bwd = long(out.size()) - 1;
      r.mode = "two_pass";
      add_record(out, r, time(forward, backward), flops_bwd, true, c);
      act_ref = long(out.size()) - 1;
      note(" | bwd comet fused_act %.3f", t.median_ms);
    }
    if (PAIR) {
      const Timing t = time(nullptr, [&] {
        forward();
        backward();
      });
      fused_record("fwd+bwd", t, flops_fwd + flops_bwd);
      comet_pair = long(out.size()) - 1;
      note(" | fwd+bwd comet %.3f", t.median_ms);
    }
    // Its weight-gradient kernels alone, where the backward runs them (after the gate partials): the
    // persistent kernel (mode gemm_only) and CUTLASS's grouped GEMMs (modes grouped, grouped_cooperative),
    // each GEMM on the kernel a table pick of the mode runs for its N (dW1: F / tp, dW0: H).
    // With --paired in rotation (comet-tune --wgrad-runs picks among them), else one after another; a
    // kernel the case refuses drops the rotation and is reported.
    std::vector<TimedCall> wgrad_calls;
    for (const auto& [kernel, mode] : wgrad_kernels) {
      BackwardOptions w1 = bo, w0 = bo;
      w1.weight_grad_kernel = moe.planner().picked_weight_grad_tiles(kernel, fs);
      w0.weight_grad_kernel = moe.planner().picked_weight_grad_tiles(kernel, H);
      wgrad_calls.push_back({[&] {
                               forward();
                               up_to_gates();
                             },
                             [&, w1, w0] {
                               moe.grad_weights1(0, g0, w1);
                               moe.grad_weights0(0, g0, w0);
                             }});
    }
    std::vector<Timing> wgrad_times;
    if (o_.paired) {
      try {
        wgrad_times = timer_.measure_rotation(team_->stream(0), warmup_, o_.reps, wgrad_calls,
                                              [&] { moe_->sync_and_check(); });
      } catch (const InvalidArgument&) {
        wgrad_times.clear();  // timed one by one below, where the refusal is reported
      }
    }
    for (size_t i = 0; i < wgrad_calls.size(); ++i) {
      const auto& [kernel, mode] = wgrad_kernels[i];
      Timing t;
      if (!wgrad_times.empty()) {
        t = wgrad_times[i];
      } else {
        try {
          t = time(wgrad_calls[i].pre, wgrad_calls[i].fn);
        } catch (const InvalidArgument& e) {  // a variant the case cannot run: say so, keep the case's other records
          line += std::string(" | wgrad comet ") + mode + " refused (" + e.what() + ")";
          continue;
        }
      }
      Record r = base(in, "wgrad", "comet");
      r.mode = mode;
      r.paired = !wgrad_times.empty();
      add_record(out, r, t, flops_wgrad, false, c);
      line += std::string(" | wgrad comet ") + (kernel == WeightGradKernel::persistent ? "" : std::string(mode) + " ");
      note("%.3f", t.median_ms);
    }
    // Its two data-gradient GEMMs with comm off (D = G W1_e with the activation's backward, dA = dPre W0_e),
    // on the picks the backward runs: what the backward's GEMMs cost against cuBLAS's ("dgrad" cublas).
    auto time_dgrad = [&](const LayerRequest& r, bool fused_act) {
      return time(
          [&] {
            forward();
            moe.stage_grad(0, g0);
            moe.prepare_grad(0);
          },
          [&] {
            moe.grad_layer1(0, LayerMode::gemm_only, r, fused_act);
            moe.grad_layer0(0, LayerMode::gemm_only, r);
          });
    };
    const Timing td = time_dgrad(pick, false);
    Record rd = base(in, "dgrad", "comet");
    rd.mode = "gemm_only";
    rd.picked_by = std::string(to_string(moe.decision(2, 0, LayerMode::gemm_only, pick).standalone_gemm)) + "/" +
                   to_string(moe.decision(3, 0, LayerMode::gemm_only, pick).standalone_gemm);
    add_record(out, rd, td, flops_wgrad, false, c);
    note(" | dgrad comet %.3f", td.median_ms);
    // --standalone-gemms: each standalone GEMM both launches may run (modes gemm_<name>).
    for (StandaloneGemm k : kStandaloneGemms) {
      if (!o_.standalone_gemms) break;
      LayerRequest r = pick;
      r.standalone_gemm = k;
      const Timing tk = time_dgrad(r, false);
      Record rk = base(in, "dgrad", "comet");
      rk.mode = std::string("gemm_") + to_string(k);
      add_record(out, rk, tk, flops_wgrad, false, c);
      line += std::string(" | dgrad ") + to_string(k) + " ";
      note("%.3f", tk.median_ms);
    }
    if (o_.fused_activation_grad) {  // the same with the activation's backward in the epilogue
      const Timing ta = time_dgrad(pick, true);
      rd.picked_by = "fused_act";
      add_record(out, rd, ta, flops_wgrad, false, c);
      note(" | dgrad comet fused_act %.3f", ta.median_ms);
    }
  }

  // ---- sequential (its forward, then its backward) and cuBLAS's weight-gradient GEMMs alone.
  const bool want_seq = o_.has_system("sequential"), want_cublas = o_.has_system("cublas");
  const bool want_chunked = o_.has_system("chunked") && chunked_ && BWD;
  if (!want_seq && !want_cublas && !want_chunked) return line;
  auto seq_forward = [&] {
    seq.prepare(0);
    seq.layer0(0);
    seq.layer1(0);
    moe.finish(0, b0);
  };
  auto seq_backward = [&] {
    moe.stage_grad(0, g0);
    seq.prepare_grad(0);  // reads the row counts: a host synchronisation inside the timed region
    seq.grad_layer1(0, g0, bo);
    seq.grad_layer0(0, g0, bo);
    moe.finish_grad(0, g0);
  };
  // One untimed pass leaves the backward's GEMM problems set up and its operands valid: the GEMMs alone
  // below re-run on them (each overwrites its output, so re-running is harmless).
  auto& forward = seq_forward;
  auto& backward = seq_backward;
  forward();
  backward();
  moe.sync_and_check();
  if (want_seq || want_chunked) {
    // The backward's data GEMMs (D = G W1_e, dA = dPre W0_e) through the faster cuBLAS path of each, for
    // both baselines (the chunked one takes the sequential one's paths below).
    for (GemmPath* path : {&seq.options().grad1, &seq.options().grad0}) {
      Timing t[2];
      for (GemmPath p : {GemmPath::grouped, GemmPath::loop}) {
        *path = p;
        t[int(p)] = time(nullptr, [&] { path == &seq.options().grad1 ? seq.grad_gemm1(0) : seq.grad_gemm0(0); });
      }
      *path = t[1].median_ms < t[0].median_ms ? GemmPath::loop : GemmPath::grouped;
    }
  }
  if (want_seq) {
    const std::string fwd_paths = std::string(to_string(seq.options().gemm0)) + "/" + to_string(seq.options().gemm1);
    const std::string bwd_paths = std::string(to_string(seq.options().grad1)) + "/" + to_string(seq.options().grad0);
    if (BWD) {
      const Timing t = time(forward, backward);
      Record r = base(in, "bwd", "sequential");
      r.cublas_path = bwd_paths;
      add_record(out, r, t, flops_bwd, true, c);
      seq_bwd = long(out.size()) - 1;
      note(" | bwd seq %.3f", t.median_ms);
    }
    if (PAIR) {
      const Timing t = time(nullptr, [&] {
        forward();
        backward();
      });
      Record r = base(in, "fwd+bwd", "sequential");
      r.cublas_path = fwd_paths + "/" + bwd_paths;
      add_record(out, r, t, flops_fwd + flops_bwd, true, c);
      seq_pair = long(out.size()) - 1;
      note(" | fwd+bwd seq %.3f", t.median_ms);
    }
  }
  if (want_chunked) {
    // ChunkedMoe's backward (after its own untimed forward), each C of --chunks as used, the best kept;
    // its cuBLAS paths are the sequential backward's (the faster of each, chosen above).
    ChunkedMoe& chunked = *chunked_;
    chunked.options().grad1 = seq.options().grad1;
    chunked.options().grad0 = seq.options().grad0;
    auto chunked_forward = [&] {
      moe.prepare(0);
      chunked.setup(0);
      chunked.run(0);
      moe.finish(0, b0);
    };
    auto chunked_backward = [&] {
      moe.stage_grad(0, g0);
      chunked.prepare_grad(0);  // reads the plan: a host synchronisation inside the timed region, as seq's
      chunked.run_backward(0, g0, bo);
      moe.finish_grad(0, g0);
    };
    std::map<int, std::pair<int, Timing>> by_used;  // used C -> (requested C, time)
    for (const auto& [used, requested] : chunk_counts_used()) {
      chunked.options().chunks = requested;  // chunked_forward sets it up
      by_used[used] = {requested, time(chunked_forward, chunked_backward)};
    }
    auto best = by_used.begin();
    for (auto it = by_used.begin(); it != by_used.end(); ++it)
      if (it->second.second.median_ms < best->second.second.median_ms) best = it;
    if (best != by_used.end()) {
      Record r = base(in, "bwd", "chunked");
      r.chunks = best->first;
      r.chunks_requested = best->second.first;
      r.cublas_path = std::string(to_string(chunked.options().grad1)) + "/" + to_string(chunked.options().grad0);
      add_record(out, r, best->second.second, flops_bwd, true, c);
      chunked_bwd = long(out.size()) - 1;
      const int best_requested = best->second.first;
      chunked_call = {[&chunked, chunked_forward, best_requested] {
                        chunked.options().chunks = best_requested;
                        chunked_forward();
                      },
                      chunked_backward};
      note(" | bwd chunked %.3f", best->second.second.median_ms);
    }
  }
  if (want_cublas) {
    const Timing t = time(nullptr, [&] {
      seq.grad_wgrad1(0, g0, bo);
      seq.grad_wgrad0(0, g0, bo);
    });
    Record r = base(in, "wgrad", "cublas");
    r.cublas_path = "loop";
    add_record(out, r, t, flops_wgrad, false, c);
    note(" | wgrad cublas %.3f", t.median_ms);
    const Timing td = time(nullptr, [&] {
      seq.grad_gemm1(0);
      seq.grad_activation(0);
      seq.grad_gemm0(0);
    });
    Record rd = base(in, "dgrad", "cublas");
    rd.cublas_path = std::string(to_string(seq.options().grad1)) + "/" + to_string(seq.options().grad0);
    add_record(out, rd, td, flops_wgrad, false, c);
    note(" | dgrad cublas %.3f", td.median_ms);
  }
  if (o_.paired) {
    // comet's and the sequential backward (each after its own untimed forward), and the chunked one at
    // its best C where it ran, and the two pairs, in rotation, as the forward's --paired records are.
    if (comet_bwd >= 0 && seq_bwd >= 0 && chunked_bwd >= 0)
      retime_all({&out[comet_bwd], &out[seq_bwd], &out[chunked_bwd]},
                 {{comet_forward, comet_backward}, {seq_forward, seq_backward}, chunked_call}, flops_bwd, true, c);
    else if (comet_bwd >= 0 && seq_bwd >= 0)
      retime(out[comet_bwd], out[seq_bwd], {comet_forward, comet_backward}, {seq_forward, seq_backward}, flops_bwd,
             true, c);
    if (comet_pair >= 0 && seq_pair >= 0)
      retime(out[comet_pair], out[seq_pair], {nullptr, [&] { comet_forward(); comet_backward(); }},
             {nullptr, [&] { seq_forward(); seq_backward(); }}, flops_fwd + flops_bwd, true, c);
    if (act_bwd >= 0)
      retime(out[act_bwd], out[act_ref], {comet_forward, comet_backward_act}, {comet_forward, comet_backward},
             flops_bwd, true, c);
    if (comet_bwd >= 0 || comet_pair >= 0) line += " | paired";
  }
  return line;
}

}  // namespace comet::bench
