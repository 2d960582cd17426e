#include "tdist/symmetric_arena.h"

#include <algorithm>

#include "tdist/error.h"

namespace tdist {

SymmetricArena::SymmetricArena(std::size_t capacity) : capacity_(capacity) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

std::size_t SymmetricArena::round_up(std::size_t bytes) {
  // Zero-byte requests still get a distinct block, so every allocation has its own offset.
  std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment;
  return rounded * kAlignment;
}

std::optional<std::size_t> SymmetricArena::allocate(std::size_t bytes) {
  if (bytes > capacity_) return std::nullopt;
  const std::size_t size = round_up(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const std::size_t offset = it->first;
    const std::size_t remaining = it->second - size;
    free_.erase(it);
    if (remaining > 0) free_.emplace(offset + size, remaining);
    used_.emplace(offset, size);
    in_use_ += size;
    return offset;
  }
  return std::nullopt;
}

void SymmetricArena::release(std::size_t offset) {
  auto used = used_.find(offset);
  TDIST_CHECK(used != used_.end(), -1, "SymmetricArena.release",
              "offset " << offset << " is not an allocated block (double free?)");
  std::size_t start = offset;
  std::size_t size = used->second;
  in_use_ -= size;
  used_.erase(used);

  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, size);
}

std::size_t SymmetricArena::largest_free_block() const {
  std::size_t largest = 0;
  for (const auto& [offset, size] : free_) largest = std::max(largest, size);
  return largest;
}

std::size_t SymmetricArena::size_of(std::size_t offset) const {
  auto it = used_.find(offset);
  return it == used_.end() ? 0 : it->second;
}

}  // namespace tdist
