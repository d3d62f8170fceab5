// One (model, layout, link) group: the team, the layer and both baselines, built once at the group's
// largest capacity, and the measurements of every case (routing, tokens per rank) run on it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_options.hpp"
#include "bench_routing.hpp"
#include "baselines/baselines.hpp"
#include "comet/fused_moe.hpp"
#include "event_timer.hpp"
#include "models.hpp"
#include "records.hpp"
#include "harness/device_buffer.hpp"
#include "harness/moe_problem.hpp"

namespace comet::bench {

struct CaseInput {
  std::string routing;
  int tokens = 0;
  const std::vector<testing::RankRouting>* ranks = nullptr;  // every rank's routing
  RoutingStats stats;
  int warmup = 0;  // from the time estimate (1 for huge cases)
};

class GroupRunner {
 public:
  GroupRunner(const BenchOptions& options, const Model& model, const Layout& layout, Link link, int max_tokens,
              int max_rows);
  ~GroupRunner();

  // Measures every system and layer the options ask for on one case; appends the records.
  void run_case(const CaseInput& input, std::vector<Record>& out);
  // After a failed case: drains the streams and clears the ranks' device status (a recorded timeout
  // would otherwise fail every later case).
  void recover();

 private:
  bool fp8() const { return o_.dtype == "e4m3"; }
  // A forced launch: this tile and n_comm, m_group the planner's rule or --m-group; layer 0's in m
  // order with --tile-order m.
  LayerRequest variant(int tile_n, int n_comm, int layer = -1) const;
  struct Rank {
    testing::DeviceBuffer x, ids, gates, out;
  };
  // Rank 0's gradients (a layer built for training): dout random, the rest written by the backwards.
  struct Grads {
    testing::DeviceBuffer dout, dx, dgates, dw0, dw1;
    RankGrad grad() const { return RankGrad{dout.get(), dx.get(), dgates.as<float>(), dw0.get(), dw1.get()}; }
  };
  // What every record of a case shares: rank 0's real rows and the token rows that crossed the link.
  struct CaseRows {
    long long rows = 0, remote = 0;
  };
  // Every measurement of a case goes through here (rank 0's stream, median of the options' repeats).
  Timing time(const std::function<void()>& pre, const std::function<void()>& fn);
  void stage_case(const CaseInput& input);
  Record base(const CaseInput& input, const std::string& layer, const std::string& system) const;
  int tuned_chunk(const CaseInput& input, const LayerRequest& r0) const;
  // --check-schedule: what the check settled on for rank 0's launch (a picked_by suffix):
  // "+checked:pick" / "+checked:sequential", "+check:none" where it has no verdict (the pick was not a
  // fused split, or not settled); "" without the option.
  std::string check_note(int launch, int tokens) const;
  // --trace: one traced launch of layer 0 per mode and swept n_comm (`run(mode, n)` makes the launch,
  // `pre` prepares it), written with rank 0's plan to the trace folder (layer0_trace.hpp).
  void trace_layer0(const CaseInput& input, int tile_n, const Timing& gemm, const std::map<int, Timing>& fused,
                    const std::map<int, Timing>& comm, const std::function<void()>& pre,
                    const std::function<std::function<void()>(LayerMode, int)>& run);
  // Appends `r` with the timing, TFLOP/s of `flops` (none when 0) and, when `comm`, GB/s of the rows
  // that crossed the link (once per pull or combine the record's layer runs).
  void add_record(std::vector<Record>& out, Record r, const Timing& t, double flops, bool comm,
                  const CaseRows& c) const;
  void set_timing(Record& r, const Timing& t, double flops, bool comm, const CaseRows& c) const;
  // --paired: the case's tuned comet record and sequential record of `layer` (in out[first, end)),
  // timed again in rotation; both records take the new times.
  void retime_pair(std::vector<Record>& out, size_t first, const std::string& layer, const TimedCall& comet,
                   const TimedCall& sequential, double flops, const CaseRows& c);
  // The same for the GEMMs alone: comet's gemm_only record of `layer` and cuBLAS's.
  void retime_gemm_pair(std::vector<Record>& out, size_t first, const std::string& layer, const TimedCall& comet,
                        const TimedCall& cublas, double flops, const CaseRows& c);
  // Re-times records a and b in rotation (--paired) and marks them paired.
  void retime(Record& a, Record& b, const TimedCall& call_a, const TimedCall& call_b, double flops, bool comm,
              const CaseRows& c);
  // The same for any number of records (records[i] timed by calls[i]).
  void retime_all(const std::vector<Record*>& records, const std::vector<TimedCall>& calls, double flops, bool comm,
                  const CaseRows& c);
  // The chunked baseline's C values as it uses them for this case (at most W-1 remote chunks), each
  // with the first of --chunks that gives it: used C -> requested C. Leaves rank 0 set up for the last.
  std::map<int, int> chunk_counts_used();
  // The backward's records of a case (backward_cases.cpp), after run_case's forward ones: rank 0's
  // staged batch b0. Returns its part of the progress line.
  std::string run_backward(const CaseInput& input, const RankBatch& b0, const CaseRows& c, std::vector<Record>& out);

  const BenchOptions& o_;
  Model model_;
  Layout layout_;
  Link link_;
  std::unique_ptr<LocalTeam> team_;
  std::unique_ptr<FusedMoe> moe_;
  testing::DeviceBuffer w0_, w1_;
  testing::Fp8W0 w0_fp8_;  // --dtype e4m3: W0 quantised (codes, 128 x 128 scales)
  std::vector<Rank> ranks_;
  Grads grads_;
  std::unique_ptr<SequentialMoe> seq_;
  std::unique_ptr<ChunkedMoe> chunked_;
  EventTimer timer_;
  int warmup_ = 0;
  uint64_t case_seed_ = 0;
};

}  // namespace comet::bench
