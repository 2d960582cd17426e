// Offset bookkeeping for the symmetric heap: a deterministic first-fit allocator over one
// address range. Every rank runs the same sequence of allocate/reclaim calls on it, so every
// rank computes the same offsets; that is what makes an allocation symmetric.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace tdist {

// The allocator of the heap's offsets (file notes); knows nothing of memory itself.
class SymmetricArena {
 public:
  // 512 B keeps vectorised and TMA accesses aligned at any offset; 128 B is the TMA minimum.
  static constexpr std::size_t kAlignment = 512;

  // An arena of `capacity` bytes, all free.
  explicit SymmetricArena(std::size_t capacity);

  // First fit, so the result depends only on the call sequence. nullopt when no block fits.
  std::optional<std::size_t> allocate(std::size_t bytes);
  // Returns a block to the free list, merging neighbours. Throws Error for unknown offsets.
  void release(std::size_t offset);

  // Bytes the arena manages.
  std::size_t capacity() const { return capacity_; }
  // Bytes of live allocations (rounded sizes).
  std::size_t bytes_in_use() const { return in_use_; }
  // The largest allocation that would succeed now.
  std::size_t largest_free_block() const;
  // The rounded size of the allocation at `offset`; 0 if none starts there.
  std::size_t size_of(std::size_t offset) const;
  // Number of live allocations.
  std::size_t live_allocations() const { return used_.size(); }

  // `bytes` rounded up to kAlignment (at least one unit).
  static std::size_t round_up(std::size_t bytes);

 private:
  std::size_t capacity_;
  std::size_t in_use_ = 0;
  std::map<std::size_t, std::size_t> free_;  // offset -> size
  std::map<std::size_t, std::size_t> used_;  // offset -> size
};

}  // namespace tdist
