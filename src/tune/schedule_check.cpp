// The schedule check's bookkeeping (schedule_check.hpp).
#include "tune/schedule_check.hpp"

#include <algorithm>

#include "comet/common.hpp"

namespace comet {

namespace {

float median_of(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

ScheduleCheck::ScheduleCheck(int samples, double margin) : samples_(samples), margin_(margin) {
  COMET_REQUIRE(samples >= 1 && margin >= 0.0 && margin < 1.0, "ScheduleCheck: samples must be >= 1 and margin in ",
                "[0, 1), got ", samples, " and ", margin);
}

ScheduleCheck::Next ScheduleCheck::next(const ScheduleCheckKey& key) {
  State& s = states_[key];
  if (s.verdict) return {*s.verdict, false};
  // The arm that has run fewer launches (the pick on a tie), while either owes some: warm-up + samples.
  const int owed = samples_ + 1;
  Arm& p = s.arm[int(ScheduleArm::pick)];
  Arm& q = s.arm[int(ScheduleArm::sequential)];
  if (p.issued >= owed && q.issued >= owed) return {ScheduleArm::pick, false};  // times still on their way
  const ScheduleArm a = (q.issued < p.issued || p.issued >= owed) ? ScheduleArm::sequential : ScheduleArm::pick;
  Arm& arm = s.arm[int(a)];
  const bool timed = arm.issued > 0;  // the first launch of an arm is its warm-up
  ++arm.issued;
  return {a, timed};
}

void ScheduleCheck::add(const ScheduleCheckKey& key, ScheduleArm arm, float ms) {
  State& s = states_[key];
  if (s.verdict) return;
  s.arm[int(arm)].ms.push_back(ms);
  decide(s);
}

void ScheduleCheck::drop(const ScheduleCheckKey& key, ScheduleArm arm) {
  State& s = states_[key];
  if (s.verdict) return;
  Arm& a = s.arm[int(arm)];
  if (a.issued > 1) --a.issued;  // run another timed launch of this arm
}

void ScheduleCheck::decide(State& s) const {
  const Arm& p = s.arm[int(ScheduleArm::pick)];
  const Arm& q = s.arm[int(ScheduleArm::sequential)];
  if (int(p.ms.size()) < samples_ || int(q.ms.size()) < samples_) return;
  s.median[0] = median_of(p.ms);
  s.median[1] = median_of(q.ms);
  s.verdict = s.median[1] < (1.0 - margin_) * s.median[0] ? ScheduleArm::sequential : ScheduleArm::pick;
}

std::optional<ScheduleArm> ScheduleCheck::verdict(const ScheduleCheckKey& key) const {
  const auto it = states_.find(key);
  return it == states_.end() ? std::nullopt : it->second.verdict;
}

std::optional<std::pair<float, float>> ScheduleCheck::medians(const ScheduleCheckKey& key) const {
  const auto it = states_.find(key);
  if (it == states_.end() || !it->second.verdict) return std::nullopt;
  return std::make_pair(it->second.median[0], it->second.median[1]);
}

}  // namespace comet
