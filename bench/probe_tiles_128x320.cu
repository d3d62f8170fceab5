// The probe's expert GEMM on cooperative 128 x 320 tiles (probe_tiles.hpp).
#include "probe_tile_schedules.cuh"

namespace comet::bench::probe_tiles {

ExpertSchedule expert_128x320() { return expert_schedule<CooperativeTile<128, 320>>("coop128x320_n"); }

}  // namespace comet::bench::probe_tiles
