#include "tools/fuzz/fuzz_draw.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <sstream>

namespace comet::fuzz {
namespace {

using testing::RoutingKind;

// A generator per (seed, stream) so that a family and each of its batches draw independently.
std::mt19937_64 generator(uint64_t seed, uint64_t stream) {
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(stream), uint32_t(stream >> 32)};
  return std::mt19937_64(seq);
}

template <class T>
T pick(std::mt19937_64& rng, const std::vector<T>& values) {
  return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
}

int uniform_int(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
bool chance(std::mt19937_64& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// A layer request: the tuner's choice (every field empty) or a forced variant.
LayerRequest draw_request(std::mt19937_64& rng, int layer) {
  LayerRequest r;
  if (chance(rng, 0.5)) return r;
  r.tile_n = layer == 0 ? pick<int>(rng, {128, 192, 256}) : pick<int>(rng, {128, 256});
  r.n_comm = pick<int>(rng, {0, 1, 2, 3, 4, 8, 16});
  if (chance(rng, 0.5)) r.m_group = pick<int>(rng, {1, 2, 3, 5});
  if (layer == 1 && chance(rng, 0.5)) r.n_group = pick<int>(rng, {1, 2, 3});
  return r;
}

}  // namespace

const char* to_string(Fault f) {
  switch (f) {
    case Fault::none: return "none";
    case Fault::duplicate_id: return "duplicate_id";
    case Fault::id_out_of_range: return "id_out_of_range";
    case Fault::tokens_over_capacity: return "tokens_over_capacity";
    case Fault::gate_not_finite: return "gate_not_finite";
  }
  return "?";
}

Family draw_family(uint64_t seed) {
  auto rng = generator(seed, 0);
  for (;;) {
    Family f;
    f.seed = seed;
    const int W = pick<int>(rng, {1, 2, 2, 4, 4, 4, 8, 8, 8});
    std::vector<int> tps;
    for (int tp = 1; tp <= W; tp *= 2) tps.push_back(tp);
    f.par.tp = chance(rng, 0.5) ? 1 : pick(rng, tps);
    f.par.ep = W / f.par.tp;
    const int El = pick<int>(rng, {1, 1, 2, 2, 3, 4, 4, 8, 32});
    MoeShape& s = f.shape;
    s.num_experts = f.par.ep * El;
    const int kmax = std::min(s.num_experts, kMaxTopK);
    s.topk = std::min(kmax, pick<int>(rng, {1, 2, 2, 4, 8, kmax, uniform_int(rng, 1, kmax)}));
    s.act = pick<Activation>(rng, {Activation::swiglu, Activation::swiglu, Activation::gelu, Activation::silu});
    s.hidden = chance(rng, 0.15) ? 8 * uniform_int(rng, 1, 128) : pick<int>(rng, {64, 128, 256, 384, 512, 1024});
    const int Fs = chance(rng, 0.15) ? 8 * uniform_int(rng, 1, 48) : pick<int>(rng, {16, 64, 128, 176, 256});
    s.ffn = Fs * f.par.tp;
    const double row_work = double(s.hidden) * (s.w0_rows() + s.ffn);
    if (double(s.num_experts) * row_work > 4e7) continue;  // the full weights stay small on the host
    const int cap_wanted = pick<int>(rng, {1, 7, 64, 128, 200, 300, 512});
    const int cap_budget = int(kMaxReferenceWork / (double(W) * s.topk * row_work));
    f.max_tokens = std::min(cap_wanted, cap_budget);
    if (f.max_tokens < 1) continue;
    if (chance(rng, 0.2)) {
      // Tight: room for half the worst case's routed rows and half a tile of padding per expert; busy
      // or skewed batches are refused.
      const int worst = W * f.max_tokens * std::min(s.topk, El);
      f.max_rows = std::max(1, worst / 2 + El * 64);
    }
    f.link = chance(rng, 0.4) ? Link::host : Link::device;
    MoeOptions& o = f.options;
    o.layer0 = draw_request(rng, 0);
    o.layer1 = draw_request(rng, 1);
    o.adaptive_split = chance(rng, 0.5);
    o.batch_invariant = chance(rng, 0.2);
    o.dispatch_store_lag = pick<int>(rng, {1, 2, 4, 8});
    o.training = chance(rng, 0.4);
    f.grad_type = chance(rng, 0.5) ? GradType::f32 : GradType::bf16;
    // fp8 layer 0 (forward only, H a multiple of 128, its one tile) in about a quarter of the families
    // that can have it, drawn from a stream of its own so that the draws above, and so every seed's
    // family from before fp8 existed, stay as they were.
    auto fp8_rng = generator(seed, ~uint64_t(0));
    if (!o.training && s.hidden % 128 == 0 && chance(fp8_rng, 0.25)) {
      o.dtype = DType::e4m3;
      if (o.layer0.tile_n) o.layer0.tile_n = 128;
    }
    // Training families take the activation-backward epilogue half the time, from a stream of its own
    // for the same reason.
    auto act_rng = generator(seed, ~uint64_t(1));
    f.fused_activation = o.training && chance(act_rng, 0.5);
    // Layer 0's 320-wide tile in place of a forced 256 a third of the time (bf16), likewise.
    auto tile_rng = generator(seed, ~uint64_t(2));
    if (o.dtype == DType::bf16 && o.layer0.tile_n == 256 && chance(tile_rng, 1.0 / 3)) o.layer0.tile_n = 320;
    // The schedule check (its first launches alternate the fused pick and the sequential schedule, so a
    // family's batches run both against the reference) in a quarter of the families, likewise; not with
    // batch_invariant, whose bitwise comparisons across batches it is not made for.
    auto check_rng = generator(seed, ~uint64_t(3));
    o.check_schedule = !o.batch_invariant && chance(check_rng, 0.25);
    // Layer 1's forced sequential schedule on cuBLAS's GEMM (StandaloneGemm::cublas: the plan's rows read
    // back to the host before the launch) in a third of the families that force it, likewise.
    auto gemm_rng = generator(seed, ~uint64_t(4));
    if (o.layer1.n_comm == 0 && chance(gemm_rng, 1.0 / 3)) o.layer1.standalone_gemm = StandaloneGemm::cublas;
    // Layer 0's forced fused schedule with its tiles in m order (LayerRequest::m_order) in a third of the
    // families that force it, likewise.
    auto order_rng = generator(seed, ~uint64_t(5));
    if (o.layer0.n_comm.value_or(0) > 0 && chance(order_rng, 1.0 / 3)) o.layer0.m_order = true;
    // The plan's chunked wave order (MoeOptions::wave_chunk): 0 (the default), 1, 2, 3 or 8, its own stream.
    auto chunk_rng = generator(seed, ~uint64_t(6));
    o.wave_chunk = pick<int>(chunk_rng, {0, 1, 2, 3, 8});
    // The comm blocks' pull order (MoeOptions::pull_order): each in half the families, its own stream.
    auto pull_rng = generator(seed, ~uint64_t(7));
    o.pull_order = chance(pull_rng, 0.5) ? PullOrder::expert : PullOrder::source;
    return f;
  }
}

Batch draw_batch(const Family& f, int index, bool faults) {
  auto rng = generator(f.seed, uint64_t(index) + 1);
  Batch b;
  b.seed = f.seed * 1000003ull + uint64_t(index);
  const int W = f.par.world(), T = f.max_tokens;
  b.tokens.assign(W, 0);
  switch (uniform_int(rng, 0, 9)) {
    case 0: case 1: case 2: case 3:  // each rank anything in [0, T]
      for (int& t : b.tokens) t = uniform_int(rng, 0, T);
      break;
    case 4: case 5:  // full
      std::fill(b.tokens.begin(), b.tokens.end(), T);
      break;
    case 6:  // one rank has every token
      b.tokens[uniform_int(rng, 0, W - 1)] = T;
      break;
    case 7:  // nobody has a token
      break;
    case 8:  // single tokens
      for (int& t : b.tokens) t = uniform_int(rng, 0, 1);
      break;
    default:  // some ranks empty, the others anything
      for (int& t : b.tokens) t = chance(rng, 0.5) ? 0 : uniform_int(rng, 1, T);
  }
  const int El = f.par.local_experts(f.shape), k = f.shape.topk;
  std::vector<RoutingKind> kinds{RoutingKind::uniform, RoutingKind::uniform, RoutingKind::zipf, RoutingKind::zipf,
                                 RoutingKind::one_expert};
  if (k <= El) kinds.insert(kinds.end(), {RoutingKind::local_only, RoutingKind::one_group});
  b.routing = pick(rng, kinds);
  b.hot = b.routing == RoutingKind::one_group ? uniform_int(rng, 0, f.par.ep - 1)
                                              : uniform_int(rng, 0, f.shape.num_experts - 1);
  b.ids_type = chance(rng, 0.5) ? IdType::i64 : IdType::i32;

  if (chance(rng, 0.08) && faults) {
    std::vector<int> with_tokens;
    for (int r = 0; r < W; ++r)
      if (b.tokens[r] > 0) with_tokens.push_back(r);
    std::vector<Fault> possible{Fault::tokens_over_capacity};
    if (!with_tokens.empty()) possible.insert(possible.end(), {Fault::id_out_of_range, Fault::gate_not_finite});
    if (!with_tokens.empty() && k >= 2) possible.push_back(Fault::duplicate_id);
    b.fault = pick(rng, possible);
    if (b.fault == Fault::tokens_over_capacity) {
      b.fault_rank = uniform_int(rng, 0, W - 1);
      b.tokens[b.fault_rank] = T + 1;
    } else {
      b.fault_rank = pick(rng, with_tokens);
      b.fault_token = uniform_int(rng, 0, b.tokens[b.fault_rank] - 1);
      b.fault_slot = uniform_int(rng, b.fault == Fault::duplicate_id ? 1 : 0, k - 1);
      b.fault_id = chance(rng, 0.5) ? f.shape.num_experts + uniform_int(rng, 0, 3) : -uniform_int(rng, 1, 1000);
    }
  }
  return b;
}

std::vector<testing::RankRouting> make_batch_routing(const Family& f, const Batch& b) {
  auto routing = testing::make_routing(f.shape, f.par, b.tokens, b.routing, b.seed, b.hot);
  const int k = f.shape.topk;
  int32_t* ids = routing[b.fault_rank].ids.data() + size_t(b.fault_token) * k;
  if (b.fault == Fault::duplicate_id) ids[b.fault_slot] = ids[b.fault_slot - 1];
  if (b.fault == Fault::id_out_of_range) ids[b.fault_slot] = b.fault_id;
  if (b.fault == Fault::gate_not_finite) {
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};
    routing[b.fault_rank].gates[size_t(b.fault_token) * k + b.fault_slot] = bad[(b.seed >> 3) % 3];
  }
  return routing;
}

int rows_needed(const Family& f, const std::vector<testing::RankRouting>& routing, int ep_group) {
  const int El = f.par.local_experts(f.shape), e0 = ep_group * El;
  std::vector<int> count(El, 0);
  for (const auto& r : routing)
    for (int32_t id : r.ids)
      if (id >= e0 && id < e0 + El) ++count[id - e0];
  int rows = 0;
  for (int c : count) rows += (c + 127) / 128 * 128;
  return rows;
}

namespace {

std::string describe(const LayerRequest& r) {
  if (!r.tile_n && !r.n_comm) return "tuned";
  std::ostringstream os;
  os << "tile " << r.tile_n.value_or(0) << " n_comm " << r.n_comm.value_or(-1);
  if (r.m_group) os << " m_group " << *r.m_group;
  if (r.n_group) os << " n_group " << *r.n_group;
  if (r.m_order.value_or(false)) os << " m_order";
  if (r.standalone_gemm) os << " gemm " << to_string(*r.standalone_gemm);
  return os.str();
}

}  // namespace

std::string describe(const Family& f) {
  std::ostringstream os;
  const MoeShape& s = f.shape;
  os << "family " << f.seed << ": H " << s.hidden << " F " << s.ffn << " E " << s.num_experts << " k " << s.topk << " "
     << to_string(s.act) << ", ep " << f.par.ep << " x tp " << f.par.tp << ", " << (f.link == Link::host ? "host" : "device")
     << " link, T_cap " << f.max_tokens << ", rows cap " << (f.max_rows ? std::to_string(f.max_rows) : "worst case")
     << ", layer 0 " << describe(f.options.layer0) << ", layer 1 " << describe(f.options.layer1)
     << (f.options.adaptive_split ? ", adaptive" : "") << (f.options.batch_invariant ? ", batch-invariant" : "")
     << ", store lag " << f.options.dispatch_store_lag << ", wave chunk " << f.options.wave_chunk
     << (f.options.pull_order == PullOrder::expert ? ", pulls by expert" : ", pulls by source")
     << (f.options.training ? (f.grad_type == GradType::f32 ? ", training (f32 grads)" : ", training (bf16 grads)") : "")
     << (f.options.dtype == DType::e4m3 ? ", fp8 layer 0" : "")
     << (f.fused_activation ? ", activation backward in the epilogue" : "")
     << (f.options.check_schedule ? ", schedule check" : "");
  return os.str();
}

std::string describe(const Batch& b) {
  std::ostringstream os;
  os << "tokens [";
  for (size_t r = 0; r < b.tokens.size(); ++r) os << (r ? " " : "") << b.tokens[r];
  os << "], " << testing::to_string(b.routing) << " (hot " << b.hot << "), ids "
     << (b.ids_type == IdType::i64 ? "int64" : "int32");
  if (b.fault != Fault::none) {
    os << ", fault " << to_string(b.fault) << " at rank " << b.fault_rank;
    if (b.fault != Fault::tokens_over_capacity) os << " token " << b.fault_token << " slot " << b.fault_slot;
  }
  return os.str();
}

}  // namespace comet::fuzz
