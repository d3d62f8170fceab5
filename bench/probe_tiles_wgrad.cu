// The probe's weight gradients on cooperative 128 x 320 and 256 x 160 tiles (probe_tiles.hpp), bf16 out.
#include "probe_tile_schedules.cuh"

namespace comet::bench::probe_tiles {

std::vector<WgradSchedule> wgrad_schedules() {
  return {wgrad_schedule<CooperativeTile<128, 320>>("coop128x320_n"), wgrad_schedule<CooperativeTile<256, 160>>("coop256x160_n")};
}

}  // namespace comet::bench::probe_tiles
