// The symmetric heap: one backend reservation, sub-allocated identically on every rank.
//
// Allocation is collective: every rank passes the same size in the same order, and the heap
// checks that through the bootstrap before touching its bookkeeping, so a mismatch is an Error on
// every rank (naming each rank's size), never a heap whose offsets differ between ranks.
//
// Freeing is local and never blocks: when the last reference to a block dies (a torch tensor
// being collected, at any time, in any order across ranks), its offset is only queued. The next
// collective allocation exchanges the queues and returns to the free list the blocks that every
// rank has released, so reuse stays symmetric and no process can hang at exit in a free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tdist/bootstrap.h"
#include "tdist/symmetric_arena.h"
#include "tdist/symmetric_backend.h"

namespace tdist {

class SymmetricHeap;

// One symmetric allocation. Lives as long as any tensor viewing it.
class SymmetricBlock {
 public:
  // Made by SymmetricHeap::allocate: `bytes` at `offset` of `heap`, at `local` on this rank.
  SymmetricBlock(std::shared_ptr<SymmetricHeap> heap, std::size_t offset, std::size_t bytes,
                 void* local);
  ~SymmetricBlock();
  SymmetricBlock(const SymmetricBlock&) = delete;
  SymmetricBlock& operator=(const SymmetricBlock&) = delete;

  // This rank's copy.
  void* local() const { return local_; }
  // Bytes asked for.
  std::size_t bytes() const { return bytes_; }
  // Offset from the heap's base, the same on every rank.
  std::size_t offset() const { return offset_; }
  // This block as `pe` maps it into this process; throws if `pe` is out of range or unreachable.
  void* peer(int pe) const;

 private:
  std::shared_ptr<SymmetricHeap> heap_;
  std::size_t offset_;
  std::size_t bytes_;
  void* local_;
};

// A snapshot of the heap's bookkeeping (SymmetricHeap::stats).
struct SymmetricHeapStats {
  std::size_t capacity = 0;          // bytes reserved
  std::size_t bytes_in_use = 0;      // bytes of live blocks (rounded sizes)
  std::size_t live_allocations = 0;  // blocks not yet reclaimed
  std::size_t pending_releases = 0;  // blocks dropped here, waiting for every rank to drop them
};

// The symmetric heap: collective, size-checked allocations inside one reservation, freed once
// every rank has dropped them (file notes).
class SymmetricHeap : public std::enable_shared_from_this<SymmetricHeap> {
 public:
  // Collective: reserves `capacity` bytes through the backend. Both references must outlive the
  // heap (the Runtime owns all three).
  static std::shared_ptr<SymmetricHeap> create(Bootstrap& bootstrap, SymmetricBackend& backend,
                                               std::size_t capacity);

  // Collective. `what` describes the request in errors ("symm_empty((4096, 4096), bfloat16)").
  std::shared_ptr<SymmetricBlock> allocate(std::size_t bytes, const std::string& what);

  // Address of the same byte on `pe`, as mapped into this process. Throws if `local` is not in
  // the heap, `pe` is out of range, or `pe` is on another node.
  void* peer_address(const void* local, int pe) const;
  // The live block holding [ptr, ptr + bytes); throws the "not a symmetric tensor" error when
  // there is none (outside the heap, or in a block already released).
  std::shared_ptr<SymmetricBlock> block_containing(const void* ptr, std::size_t bytes,
                                                   const std::string& op) const;
  // True when [ptr, ptr + bytes) lies inside the heap's reservation.
  bool contains(const void* ptr, std::size_t bytes) const;
  // Offset of `ptr` from this rank's base; throws the "not a symmetric tensor" error otherwise.
  std::size_t offset_of(const void* ptr, std::size_t bytes, const std::string& op) const;

  // The current bookkeeping.
  SymmetricHeapStats stats() const;
  // This rank.
  int rank() const { return rank_; }
  // Number of ranks sharing the heap.
  int world_size() const { return world_size_; }
  // This rank's base of the reservation.
  void* base() const { return base_; }

  // Called from SymmetricBlock's destructor: queue only, see the file comment.
  void release_later(std::size_t offset);
  // After close() the reservation is gone: releases are dropped and allocation throws.
  void close();

 private:
  SymmetricHeap(Bootstrap& bootstrap, SymmetricBackend& backend, std::size_t capacity);
  void reclaim_released_everywhere(const std::vector<std::set<std::size_t>>& released);

  // Touched only while open: after close() the runtime may have destroyed both.
  Bootstrap& bootstrap_;
  SymmetricBackend& backend_;
  const int rank_;
  const int world_size_;
  std::byte* base_ = nullptr;
  std::vector<std::byte*> peer_bases_;
  mutable std::mutex mutex_;  // guards everything below
  SymmetricArena arena_;
  std::set<std::size_t> pending_release_;
  std::map<std::size_t, std::weak_ptr<SymmetricBlock>> live_;  // by offset
  std::uint64_t allocation_count_ = 0;
  bool closed_ = false;
};

}  // namespace tdist
