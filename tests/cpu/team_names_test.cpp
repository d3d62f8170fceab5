// The Team's names as options and messages take them: links and symmetric heaps round-trip, unknown
// names are refused naming the choices.
#include <gtest/gtest.h>

#include "comet/team.hpp"
#include "support/expect_invalid.hpp"

using namespace comet;

TEST(TeamNames, LinksAndHeapsRoundTrip) {
  for (Link l : {Link::device, Link::host}) EXPECT_EQ(parse_link(to_string(l)), l);
  for (SymmetricHeap h : {SymmetricHeap::cuda_ipc, SymmetricHeap::nvshmem}) EXPECT_EQ(parse_heap(to_string(h)), h);
  EXPECT_STREQ(to_string(WaitSite::peer_failed), "peer_failed");
}

TEST(TeamNames, UnknownNamesAreRefused) {
  comet::testing::expect_invalid([] { parse_heap("shmem"); }, "expected 'cuda_ipc' or 'nvshmem'");
  comet::testing::expect_invalid([] { parse_link("nvlink"); }, "expected 'device' or 'host'");
}
