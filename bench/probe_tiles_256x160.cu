// The probe's expert GEMM on cooperative 256 x 160 tiles (probe_tiles.hpp).
#include "probe_tile_schedules.cuh"

namespace comet::bench::probe_tiles {

ExpertSchedule expert_256x160() { return expert_schedule<CooperativeTile<256, 160>>("coop256x160_n"); }

}  // namespace comet::bench::probe_tiles
