#include <gtest/gtest.h>

#include <atomic>
#include <random>

#include "tdist/error.h"
#include "tdist/symmetric_heap.h"
#include "thread_world.h"

namespace tdist {
namespace {

using testing::HostBackend;
using testing::run_ranks;
using testing::ThreadBootstrap;
using testing::ThreadExchange;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Each rank: its own bootstrap, backend and heap, as in separate processes.
struct Rank {
  Rank(ThreadExchange& exchange, int rank, int world, std::size_t capacity)
      : bootstrap(exchange, rank, world), heap(SymmetricHeap::create(bootstrap, backend, capacity)) {}
  ThreadBootstrap bootstrap;
  HostBackend backend;
  std::shared_ptr<SymmetricHeap> heap;
};

TEST(SymmetricHeap, CollectiveAllocationsGetTheSameOffsets) {
  constexpr int kWorld = 4;
  ThreadExchange exchange(kWorld);
  std::vector<std::vector<std::size_t>> offsets(kWorld);
  run_ranks(kWorld, [&](int r) {
    Rank me(exchange, r, kWorld, 1 << 20);
    std::vector<std::shared_ptr<SymmetricBlock>> keep;
    for (std::size_t bytes : {100, 4096, 1, 70000, 0}) {
      keep.push_back(me.heap->allocate(bytes, "test"));
      offsets[r].push_back(keep.back()->offset());
      EXPECT_EQ(keep.back()->bytes(), bytes);
    }
  });
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(offsets[r], offsets[0]);
}

TEST(SymmetricHeap, SizeMismatchIsAnErrorOnEveryRankNamingEachSize) {
  constexpr int kWorld = 3;
  ThreadExchange exchange(kWorld);
  std::atomic<int> errors{0};
  run_ranks(kWorld, [&](int r) {
    Rank me(exchange, r, kWorld, 1 << 20);
    try {
      me.heap->allocate(r == 1 ? 2048 : 1024, "symm_empty((256,), float32)");
      ADD_FAILURE() << "rank " << r << " allocated despite the mismatch";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_TRUE(contains(msg, "rank 0: 1024 B")) << msg;
      EXPECT_TRUE(contains(msg, "rank 1: 2048 B")) << msg;
      EXPECT_TRUE(contains(msg, "[rank " + std::to_string(r) + "]")) << msg;
      EXPECT_TRUE(contains(msg, "symm_empty((256,), float32)")) << msg;
      ++errors;
    }
    // Nothing was allocated, and the heap still works afterwards.
    EXPECT_EQ(me.heap->stats().bytes_in_use, 0u);
    auto ok = me.heap->allocate(64, "after");
    EXPECT_EQ(ok->offset(), 0u);
  });
  EXPECT_EQ(errors.load(), kWorld);
}

TEST(SymmetricHeap, ExhaustionSaysHowToEnlarge) {
  ThreadExchange exchange(1);
  Rank me(exchange, 0, 1, 1 << 16);
  auto a = me.heap->allocate(1 << 15, "a");
  try {
    me.heap->allocate(1 << 16, "big");
    FAIL() << "expected exhaustion";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "exhausted")) << e.what();
    EXPECT_TRUE(contains(e.what(), "TRITON_DIST_SYMMETRIC_HEAP_SIZE")) << e.what();
  }
}

TEST(SymmetricHeap, FreesAreReusedOnlyOnceEveryRankReleased) {
  constexpr int kWorld = 2;
  ThreadExchange exchange(kWorld);
  std::vector<std::size_t> reused(kWorld);
  run_ranks(kWorld, [&](int r) {
    Rank me(exchange, r, kWorld, 1 << 20);
    auto a = me.heap->allocate(4096, "a");
    const std::size_t a_offset = a->offset();
    // Only rank 0 drops `a` before the next allocation: it must not be reused yet.
    if (r == 0) a.reset();
    auto b = me.heap->allocate(4096, "b");
    EXPECT_NE(b->offset(), a_offset);
    a.reset();
    EXPECT_EQ(me.heap->stats().pending_releases, 1u);
    auto c = me.heap->allocate(4096, "c");  // both released `a` now
    reused[r] = c->offset();
    EXPECT_EQ(c->offset(), a_offset);
    EXPECT_EQ(me.heap->stats().pending_releases, 0u);
  });
  EXPECT_EQ(reused[0], reused[1]);
}

TEST(SymmetricHeap, RandomFreeOrderStaysSymmetric) {
  constexpr int kWorld = 3;
  ThreadExchange exchange(kWorld);
  std::vector<std::vector<std::size_t>> offsets(kWorld);
  run_ranks(kWorld, [&](int r) {
    Rank me(exchange, r, kWorld, 1 << 22);
    std::mt19937 rng(100 + r);  // each rank frees in its own order
    std::vector<std::shared_ptr<SymmetricBlock>> live;
    for (int i = 0; i < 300; ++i) {
      while (!live.empty() && rng() % 2) live.erase(live.begin() + rng() % live.size());
      live.push_back(me.heap->allocate(512 + (i * 7919) % 30000, "churn"));
      offsets[r].push_back(live.back()->offset());
    }
  });
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(offsets[r], offsets[0]);
}

TEST(SymmetricHeap, PeerAddressAndValidation) {
  ThreadExchange exchange(1);
  Rank me(exchange, 0, 1, 1 << 16);
  auto a = me.heap->allocate(1024, "a");
  auto* p = static_cast<std::byte*>(a->local());
  EXPECT_EQ(me.heap->peer_address(p + 10, 0), p + 10);
  EXPECT_THROW(me.heap->peer_address(p, 1), Error);
  EXPECT_THROW(me.heap->peer_address(p, -1), Error);
  int not_symmetric = 0;
  try {
    me.heap->peer_address(&not_symmetric, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "not on the symmetric heap")) << e.what();
  }
  EXPECT_EQ(me.heap->block_containing(p + 100, 900, "t"), a);
  EXPECT_THROW(me.heap->block_containing(p + 100, 1000, "t"), Error);
  a.reset();
  EXPECT_THROW(me.heap->block_containing(p, 8, "t"), Error);
}

TEST(SymmetricHeap, ClosedHeapRefusesAndDropsReleases) {
  ThreadExchange exchange(1);
  Rank me(exchange, 0, 1, 1 << 16);
  auto a = me.heap->allocate(1024, "a");
  me.heap->close();
  a.reset();  // must not touch the (conceptually destroyed) backend
  EXPECT_EQ(me.heap->stats().pending_releases, 0u);
  EXPECT_THROW(me.heap->allocate(8, "late"), Error);
}

TEST(SymmetricHeap, DifferentHeapSizesAreRejected) {
  constexpr int kWorld = 2;
  ThreadExchange exchange(kWorld);
  std::atomic<int> errors{0};
  run_ranks(kWorld, [&](int r) {
    ThreadBootstrap bootstrap(exchange, r, kWorld);
    HostBackend backend;
    try {
      SymmetricHeap::create(bootstrap, backend, r == 0 ? 4096 : 8192);
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "same heap size")) << e.what();
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), kWorld);
}

}  // namespace
}  // namespace tdist
