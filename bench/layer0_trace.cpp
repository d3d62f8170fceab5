#include "layer0_trace.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "comet/common.hpp"
#include "comet/plan.hpp"

namespace comet::bench {
namespace {

template <class T>
void put_array(std::ostream& os, const char* name, const T* v, size_t n) {
  os << ",\n\"" << name << "\": [";
  for (size_t i = 0; i < n; ++i) os << (i ? "," : "") << v[i];
  os << "]";
}

}  // namespace

Layer0Tracer::Layer0Tracer(MoeEngine& moe, int tile_n) : moe_(moe), tile_n_(tile_n) {
  layout_.max_blocks = moe.resident_blocks(0, tile_n);
  layout_.max_tiles = moe.capacity().max_rows_per_rank / kernels::kTileM + 1;
  layout_.n_blocks = (moe.w0_shard_rows() + tile_n - 1) / tile_n;
  stamps_ = testing::DeviceBuffer(layout_.words() * sizeof(unsigned long long));
  layout_.stamps = stamps_.as<unsigned long long>();
}

void Layer0Tracer::trace(const std::string& mode, int n_comm, double median_ms, const std::function<void()>& pre,
                         const std::function<void()>& launch) {
  pre();
  moe_.sync_and_check();
  stamps_.fill_bytes(0);
  moe_.set_layer0_trace(0, layout_);
  try {
    launch();
    moe_.sync_and_check();
  } catch (...) {
    moe_.set_layer0_trace(0, {});
    throw;
  }
  moe_.set_layer0_trace(0, {});
  runs_.push_back(Run{mode, n_comm, median_ms, stamps_.download<unsigned long long>(layout_.words())});
}

// Stamps as ns after the launch's first block start; -1 where no event was stamped.
void Layer0Tracer::write(const std::string& path, const std::string& header) const {
  const HostPlan plan = moe_.plan(0).to_host(moe_.team().stream(0));
  const PlanView& v = plan.view();
  const int tiles = std::min(*v.num_tiles, layout_.max_tiles);
  std::ostringstream os;
  os << "{" << header << ",\n\"tile_m\": " << kernels::kTileM << ", \"tile_n\": " << tile_n_
     << ", \"n_blocks\": " << layout_.n_blocks << ", \"num_tiles\": " << tiles
     << ", \"num_units\": " << *v.num_units << ", \"num_local_units\": " << *v.num_local_units;
  put_array(os, "tile_expert", v.tile_expert, tiles);
  put_array(os, "tile_rows", v.tile_rows, tiles);
  put_array(os, "tile_remote_rows", v.tile_remote_rows, tiles);
  put_array(os, "tile_order", v.tile_order, tiles);
  os << ",\n\"runs\": [";
  for (size_t r = 0; r < runs_.size(); ++r) {
    const Run& run = runs_[r];
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < layout_.max_blocks; ++b)
      if (run.stamps[2 * b]) t0 = std::min(t0, run.stamps[2 * b]);
    auto rel = [&](size_t i) { return run.stamps[i] ? (long long)(run.stamps[i] - t0) : -1ll; };
    std::vector<long long> start, end, ready, wait_begin, wait_end, wait_block;
    for (int b = 0; b < layout_.max_blocks; ++b) {
      start.push_back(rel(2 * b));
      end.push_back(rel(2 * b + 1));
    }
    for (int m = 0; m < tiles; ++m) ready.push_back(rel(layout_.ready_at(m)));
    for (int m = 0; m < tiles; ++m)
      for (int n = 0; n < layout_.n_blocks; ++n) {
        const size_t at = layout_.wait_at(m, n);
        wait_begin.push_back(rel(at));
        wait_end.push_back(rel(at + 1));
        wait_block.push_back(run.stamps[at + 1] ? (long long)run.stamps[at + 2] : -1ll);
      }
    os << (r ? "," : "") << "\n{\"mode\": \"" << run.mode << "\", \"n_comm\": " << run.n_comm
       << ", \"median_ms\": " << run.median_ms;
    put_array(os, "block_start", start.data(), start.size());
    put_array(os, "block_end", end.data(), end.size());
    put_array(os, "ready", ready.data(), ready.size());
    put_array(os, "wait_begin", wait_begin.data(), wait_begin.size());
    put_array(os, "wait_end", wait_end.data(), wait_end.size());
    put_array(os, "wait_block", wait_block.data(), wait_block.size());
    os << "}";
  }
  os << "]}\n";
  std::ofstream f(path);
  COMET_REQUIRE(f.good(), "comet-bench --trace: cannot write ", path);
  f << os.str();
}

}  // namespace comet::bench
