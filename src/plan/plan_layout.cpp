// The plan's configuration checks, its memory layout (one block carved into 256-byte aligned arrays),
// the messages of its status word, and HostPlan's storage.
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "comet/plan.hpp"

namespace comet {

namespace {

constexpr size_t kArrayAlign = 256;

constexpr size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Walks the arrays in PlanView order, giving each its 256-byte aligned offset from `base` (nullptr
// only measures). Returns the total size. plan_bytes() and carve_plan() share it so they cannot drift.
size_t carve(const PlanConfig& cfg, char* base, PlanView* view) {
  const size_t W = size_t(cfg.world()), El = size_t(cfg.local_experts()), k = size_t(cfg.topk());
  const size_t U = size_t(cfg.max_units()), R = size_t(cfg.cap.max_rows), M = size_t(cfg.max_tiles());
  size_t offset = 0;
  auto take = [&](auto*& ptr, size_t count) {
    using T = std::remove_reference_t<decltype(*ptr)>;
    ptr = base ? reinterpret_cast<T*>(base + offset) : nullptr;
    offset = align_up(offset + count * sizeof(T), kArrayAlign);
  };
  PlanView v;
  take(v.status, kPlanStatusWords);
  take(v.first_error, kPlanStatusWords);
  take(v.src_tokens, W);
  take(v.expert_rows, El);
  take(v.expert_offset, El + 1);
  take(v.segment_offset, El * W);
  take(v.segment_rows, El * W);
  take(v.num_units, 1);
  take(v.num_local_units, 1);
  take(v.unit_src, U);
  take(v.unit_token, U);
  take(v.unit_rows, U * k);
  take(v.unit_gates, U * k);
  take(v.row_unit, R);
  take(v.row_slot, R);
  take(v.num_tiles, 1);
  take(v.tile_expert, M);
  take(v.tile_rows, M);
  take(v.tile_remote_rows, M);
  take(v.tile_key, M);
  take(v.tile_order, M);
  take(v.pull_unit, U);
  if (view) *view = v;
  return offset;
}

}  // namespace

void validate(const WaveChunkRule& rule) {
  COMET_REQUIRE(std::isfinite(rule.expected_rows) && rule.expected_rows >= 0,
                "WaveChunkRule: expected_rows must be finite and >= 0, got ", rule.expected_rows);
  for (int c = 0; c < 4; ++c)
    COMET_REQUIRE(rule.by_load[c] >= 0, "WaveChunkRule: the chunk of load class ", 1 << c, " must be >= 0 (0: none), got ",
                  rule.by_load[c]);
}

void validate(const PlanConfig& cfg) {
  validate(cfg.shape, cfg.par);
  const int W = cfg.world();
  COMET_REQUIRE(cfg.rank >= 0 && cfg.rank < W, "PlanConfig: rank ", cfg.rank, " out of range [0, ", W, ")");
  // 16 and 32 exist for small hand-made tests only; the GEMM tiles are 64, 128 or 256 rows.
  const int tm = cfg.tile_m;
  COMET_REQUIRE(tm == 16 || tm == 32 || tm == 64 || tm == 128 || tm == 256,
                "PlanConfig: tile_m must be 64, 128 or 256 (16 and 32 for tests), got ", tm);
  COMET_REQUIRE(cfg.cap.max_tokens_per_rank > 0, "PlanConfig: max_tokens_per_rank must be positive, got ",
                cfg.cap.max_tokens_per_rank);
  COMET_REQUIRE(cfg.cap.max_rows > 0, "PlanConfig: max_rows must be positive, got ", cfg.cap.max_rows);
  COMET_REQUIRE(cfg.cap.max_rows % tm == 0, "PlanConfig: max_rows (", cfg.cap.max_rows,
                ") must be a multiple of tile_m (", tm, ")");
  COMET_REQUIRE(cfg.wave_chunk >= 1, "PlanConfig: wave_chunk must be >= 1, got ", cfg.wave_chunk);
  COMET_REQUIRE(cfg.pull_order == PullOrder::source || cfg.pull_order == PullOrder::expert,
                "PlanConfig: pull_order must be source (0) or expert (1), got ", int(cfg.pull_order));
  validate(cfg.chunk_rule);
  // The device builder's first-error key has 22 bits for the source rank.
  COMET_REQUIRE(W <= 65536, "PlanConfig: at most 65536 ranks are supported, got ", W);
  const int El = cfg.local_experts();
  COMET_REQUIRE(El <= 1024, "PlanConfig: at most 1024 local experts per rank are supported, got ", El);
  // Every row index, unit index and padded total must fit an int32 (the plan's arrays are int32).
  const long long worst_rows = (long long)W * cfg.cap.max_tokens_per_rank * cfg.topk() + (long long)El * tm;
  COMET_REQUIRE(worst_rows < INT_MAX, "PlanConfig: W * max_tokens_per_rank * k (", worst_rows,
                " with padding) overflows int32");
}

size_t plan_bytes(const PlanConfig& cfg) { return carve(cfg, nullptr, nullptr); }

PlanView carve_plan(const PlanConfig& cfg, void* base) {
  PlanView v;
  carve(cfg, static_cast<char*>(base), &v);
  return v;
}

std::string describe_plan_error(const int32_t* status, int num_experts) {
  using detail::concat;
  switch (static_cast<PlanError>(status[0])) {
    case PlanError::ok:
      return "routing plan: no error";
    case PlanError::expert_out_of_range:
      if (num_experts > 0)
        return concat("routing: expert id ", status[4], " out of range [0, ", num_experts, ") at rank ", status[1],
                      ", token ", status[2], ", slot ", status[3]);
      return concat("routing: expert id ", status[4], " out of range at rank ", status[1], ", token ", status[2],
                    ", slot ", status[3]);
    case PlanError::duplicate_expert:
      return concat("routing: duplicate expert id ", status[4], " at rank ", status[1], ", token ", status[2],
                    ", slot ", status[3], " (an earlier slot of the token chose it too)");
    case PlanError::rows_over_capacity:
      return concat("routing: the plan needs ", status[1], " rows (expert segments padded to tile_m), more than max_rows = ",
                    status[2]);
    case PlanError::gate_not_finite: {
      float gate = 0;
      std::memcpy(&gate, &status[4], sizeof(gate));
      return concat("routing: gate weight ", gate, " at rank ", status[1], ", token ", status[2], ", slot ", status[3],
                    " (gate weights must be finite)");
    }
    case PlanError::tokens_over_capacity:
      return concat("routing: rank ", status[1], " has ", status[2], " tokens, outside [0, ", status[3],
                    "] (max_tokens_per_rank)");
  }
  return concat("routing plan: unknown error code ", status[0]);
}

// The host copy needs no 256-byte alignment of its base: carve_plan's offsets are relative, and the
// elements only need their natural alignment, which operator new gives.
HostPlan::HostPlan(const PlanConfig& cfg) : cfg_(cfg), storage_(plan_bytes(cfg)) {
  view_ = carve_plan(cfg_, storage_.data());
}

HostPlan::HostPlan(const HostPlan& other) : cfg_(other.cfg_), storage_(other.storage_) {
  if (!storage_.empty()) view_ = carve_plan(cfg_, storage_.data());
}

HostPlan& HostPlan::operator=(const HostPlan& other) {
  if (this != &other) {
    cfg_ = other.cfg_;
    storage_ = other.storage_;
    view_ = storage_.empty() ? PlanView{} : carve_plan(cfg_, storage_.data());
  }
  return *this;
}

HostPlan::HostPlan(HostPlan&& other) noexcept
    : cfg_(other.cfg_), storage_(std::move(other.storage_)), view_(other.view_) {
  other.storage_.clear();
  other.view_ = PlanView{};
}

HostPlan& HostPlan::operator=(HostPlan&& other) noexcept {
  if (this != &other) {
    cfg_ = other.cfg_;
    storage_ = std::move(other.storage_);
    view_ = other.view_;
    other.storage_.clear();
    other.view_ = PlanView{};
  }
  return *this;
}

}  // namespace comet
