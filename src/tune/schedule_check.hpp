// MoeOptions::check_schedule: the layer checks the launch planner's fused picks against the sequential
// schedule on its own first calls. The table's picks were measured on other machines (an H200 and an
// H100, their links emulated) and the cost model's are predictions; on a node whose link or GPU differs,
// a fused pick can lose to running the communication and the GEMM one after the other. So for each
// (launch, token bucket) whose pick is a fused split, the first calls alternate between that pick and
// the sequential schedule of the same launch, time both with CUDA events, and from then on run the one
// whose median was lower (the sequential one only if it was faster by the margin).
//
// This class is the bookkeeping alone (no CUDA): which arm the next launch runs, whether it is timed,
// and the verdict once the times are in. The engine (src/ops/launch_timer.hpp) records the events and
// hands the times back, possibly several calls later: it never waits for them.
#pragma once

#include <compare>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace comet {

enum class ScheduleArm : int { pick = 0, sequential = 1 };

struct ScheduleCheckKey {
  int launch = 0;         // the planner's launch id (comet/tune.hpp: 0, 1 forward, 2, 3 backward)
  int tokens_bucket = 0;  // tune.hpp: tokens_bucket(tokens per rank)
  auto operator<=>(const ScheduleCheckKey&) const = default;
};

class ScheduleCheck {
 public:
  // samples: timed launches per arm that decide (after one untimed warm-up launch of each);
  // margin: how much faster the sequential schedule's median must be to replace the pick.
  explicit ScheduleCheck(int samples = 5, double margin = 0.02);

  struct Next {
    ScheduleArm arm = ScheduleArm::pick;
    bool timed = false;  // record this launch's time and give it to add()
  };
  // What the next launch of `key` runs. Before a verdict the arms alternate (each arm's first launch a
  // warm-up, untimed); once both arms have had their launches, the pick runs untimed until their times
  // are in; then the verdict, untimed, for good.
  Next next(const ScheduleCheckKey& key);
  // A timed launch's milliseconds (in any order; one that comes after the verdict is dropped).
  void add(const ScheduleCheckKey& key, ScheduleArm arm, float ms);
  // Forget a timed launch whose time will never come (its events could not be read): the arm owes one.
  void drop(const ScheduleCheckKey& key, ScheduleArm arm);

  std::optional<ScheduleArm> verdict(const ScheduleCheckKey& key) const;
  // The medians a verdict was made from (ms; empty before it).
  std::optional<std::pair<float, float>> medians(const ScheduleCheckKey& key) const;

  int samples() const { return samples_; }

 private:
  struct Arm {
    int issued = 0;  // launches run, warm-up included
    std::vector<float> ms;
  };
  struct State {
    Arm arm[2];
    std::optional<ScheduleArm> verdict;
    float median[2] = {0.f, 0.f};
  };
  void decide(State& s) const;

  int samples_;
  double margin_;
  std::map<ScheduleCheckKey, State> states_;
};

}  // namespace comet
