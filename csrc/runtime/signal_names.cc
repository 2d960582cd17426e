#include "tdist/signal_names.h"

#include <iterator>
#include <utility>

namespace tdist {

SignalNames& SignalNames::get() {
  // Never destroyed: the wait-timeout watcher's last look runs in an atexit handler, which may
  // come after static destructors.
  static SignalNames* names = new SignalNames();
  return *names;
}

std::uint64_t SignalNames::add(std::uint64_t base, std::size_t count, std::size_t signal_bytes,
                               std::string owner, std::vector<SignalRegion> regions, std::string noun) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t id = next_id_++;
  ranges_[base] = Range{count, signal_bytes, std::move(owner), std::move(regions), std::move(noun), id};
  return id;
}

void SignalNames::remove(std::uint64_t base, std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto named = ranges_.find(base);
  if (named != ranges_.end() && named->second.id == id) ranges_.erase(named);
}

std::string SignalNames::name_of(std::uint64_t address) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto after = ranges_.upper_bound(address);  // the first range starting past the address
  if (after == ranges_.begin()) return "";
  const auto& [base, range] = *std::prev(after);
  const std::uint64_t offset = address - base;
  if (range.signal_bytes == 0 || offset >= range.count * range.signal_bytes) return "";
  const std::size_t index = offset / range.signal_bytes;
  std::string name = "signal " + std::to_string(index) + " of " + range.owner + "'s " + range.noun;
  for (const SignalRegion& region : range.regions) {
    if (index >= region.first && index < region.first + region.count) {
      return name + ": " + region.name + "[" + std::to_string(index - region.first) + "]";
    }
  }
  return name;
}

}  // namespace tdist
