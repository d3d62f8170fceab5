// The probe's expert GEMM on cooperative 256 x 128 tiles (probe_tiles.hpp).
#include "probe_tile_schedules.cuh"

namespace comet::bench::probe_tiles {

ExpertSchedule expert_256x128() { return expert_schedule<CooperativeTile<256, 128>>("coop256x128_n"); }

}  // namespace comet::bench::probe_tiles
