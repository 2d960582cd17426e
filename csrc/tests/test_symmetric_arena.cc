#include <gtest/gtest.h>

#include <random>

#include "tdist/error.h"
#include "tdist/symmetric_arena.h"

namespace tdist {
namespace {

constexpr std::size_t A = SymmetricArena::kAlignment;

TEST(SymmetricArena, FirstFitAlignedAndDisjoint) {
  SymmetricArena arena(64 * A);
  auto a = arena.allocate(1);
  auto b = arena.allocate(A + 1);
  auto c = arena.allocate(0);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, A);
  EXPECT_EQ(*c, 3 * A);
  EXPECT_EQ(arena.bytes_in_use(), 4 * A);
  EXPECT_EQ(arena.size_of(*b), 2 * A);
}

TEST(SymmetricArena, ReleaseMergesNeighbours) {
  SymmetricArena arena(8 * A);
  auto a = arena.allocate(2 * A), b = arena.allocate(2 * A), c = arena.allocate(4 * A);
  ASSERT_TRUE(a && b && c);
  EXPECT_FALSE(arena.allocate(1).has_value());
  arena.release(*a);
  arena.release(*c);
  EXPECT_EQ(arena.largest_free_block(), 4 * A);
  arena.release(*b);
  EXPECT_EQ(arena.largest_free_block(), 8 * A);
  EXPECT_EQ(arena.bytes_in_use(), 0u);
  EXPECT_EQ(arena.allocate(8 * A).value(), 0u);
}

TEST(SymmetricArena, DoubleFreeIsAnError) {
  SymmetricArena arena(8 * A);
  auto a = arena.allocate(A);
  arena.release(*a);
  EXPECT_THROW(arena.release(*a), Error);
  EXPECT_THROW(arena.release(12345), Error);
}

TEST(SymmetricArena, TooLargeFails) {
  SymmetricArena arena(8 * A);
  EXPECT_FALSE(arena.allocate(8 * A + 1).has_value());
  EXPECT_FALSE(arena.allocate(~std::size_t{0}).has_value());
}

// Two arenas fed the same sequence must agree on every offset: that is the symmetry guarantee.
TEST(SymmetricArena, SameSequenceSameOffsetsUnderRandomChurn) {
  SymmetricArena x(1 << 20), y(1 << 20);
  std::mt19937 rng(7);
  std::vector<std::size_t> live;
  for (int i = 0; i < 5000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      std::size_t k = rng() % live.size();
      x.release(live[k]);
      y.release(live[k]);
      live.erase(live.begin() + k);
    } else {
      std::size_t bytes = rng() % 20000;
      auto ox = x.allocate(bytes), oy = y.allocate(bytes);
      ASSERT_EQ(ox, oy);
      if (ox) live.push_back(*ox);
    }
    ASSERT_EQ(x.bytes_in_use(), y.bytes_in_use());
  }
  for (auto o : live) x.release(o);
  EXPECT_EQ(x.bytes_in_use(), 0u);
  EXPECT_EQ(x.largest_free_block(), x.capacity());
}

}  // namespace
}  // namespace tdist
