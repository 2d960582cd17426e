#include <gtest/gtest.h>

#include "tdist/error.h"
#include "tdist/local_world.h"

namespace tdist {
namespace {

TEST(LocalWorld, FromHostNames) {
  std::vector<std::string> hosts = {"a", "a", "b", "b", "b", "c"};
  auto w = compute_local_world(hosts, 3, 0);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 3);
  EXPECT_EQ(w.node, 1);
  EXPECT_EQ(w.num_nodes, 3);
  auto last = compute_local_world(hosts, 5, 0);
  EXPECT_EQ(last.local_rank, 0);
  EXPECT_EQ(last.local_world_size, 1);
  EXPECT_EQ(last.node, 2);
}

TEST(LocalWorld, DeclaredSizeMakesSmallerNodes) {
  std::vector<std::string> hosts(4, "one-host");
  auto w = compute_local_world(hosts, 2, 1);
  EXPECT_EQ(w.local_rank, 0);
  EXPECT_EQ(w.local_world_size, 1);
  EXPECT_EQ(w.node, 2);
  EXPECT_EQ(w.num_nodes, 4);
  EXPECT_THROW(compute_local_world(hosts, 0, 3), Error);
}

TEST(LocalWorld, InterleavedHostsAreRejected) {
  std::vector<std::string> hosts = {"a", "b", "a", "b"};
  EXPECT_THROW(compute_local_world(hosts, 0, 0), Error);
}

TEST(LocalWorld, RankOutOfRange) {
  EXPECT_THROW(compute_local_world({"a"}, 1, 0), Error);
}

}  // namespace
}  // namespace tdist
