// Offset bookkeeping for the symmetric heap: a deterministic first-fit allocator over one
// address range. Every rank runs the same sequence of allocate/reclaim calls on it, so every
// rank computes the same offsets; that is what makes an allocation symmetric.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace tdist {

class SymmetricArena {
 public:
  // 512 B keeps vectorised and TMA accesses aligned at any offset; 128 B is the TMA minimum.
  static constexpr std::size_t kAlignment = 512;

  explicit SymmetricArena(std::size_t capacity);

  // First fit, so the result depends only on the call sequence. nullopt when no block fits.
  std::optional<std::size_t> allocate(std::size_t bytes);
  // Returns a block to the free list, merging neighbours. Throws Error for unknown offsets.
  void release(std::size_t offset);

  std::size_t capacity() const { return capacity_; }
  std::size_t bytes_in_use() const { return in_use_; }
  std::size_t largest_free_block() const;
  std::size_t size_of(std::size_t offset) const;  // 0 if not allocated
  std::size_t live_allocations() const { return used_.size(); }

  static std::size_t round_up(std::size_t bytes);

 private:
  std::size_t capacity_;
  std::size_t in_use_ = 0;
  std::map<std::size_t, std::size_t> free_;  // offset -> size
  std::map<std::size_t, std::size_t> used_;  // offset -> size
};

}  // namespace tdist
