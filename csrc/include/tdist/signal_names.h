// Names of the signal pads' address ranges, so that a timed-out wait's report says whose signal it
// waited on ("signal 5 of AllGatherGemmContext's pad: ack[1]") and not only an address. A
// SignalPad names its range for as long as it lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tdist {

// A named run of a pad's signals: signals [first, first + count) are name[0], name[1], ...
struct SignalRegion {
  // What the report calls the region's signals ("ready": ready[0], ready[1], ...).
  std::string name;
  // The region's first signal, as an index into the pad.
  std::size_t first = 0;
  // How many signals the region holds.
  std::size_t count = 0;
};

// The process's named signal ranges (file notes). Thread-safe: the wait-timeout watcher reads it.
class SignalNames {
 public:
  // The process's names, created on first use and never destroyed (the watcher may read them
  // until the process exits).
  static SignalNames& get();

  // Names the `count` signals of `signal_bytes` each at `base` as `owner`'s, with `regions`
  // (indices into the range). Naming a base again replaces its names.
  void add(std::uint64_t base, std::size_t count, std::size_t signal_bytes, std::string owner,
           std::vector<SignalRegion> regions);
  // Forgets the names of the range at `base` (nothing if it has none).
  void remove(std::uint64_t base);
  // "signal I of OWNER's pad" and ": REGION[J]" where a region holds it; "" for an unnamed address.
  std::string name_of(std::uint64_t address) const;

 private:
  struct Range {
    std::size_t count;
    std::size_t signal_bytes;
    std::string owner;
    std::vector<SignalRegion> regions;
  };
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Range> ranges_;  // by base address
};

}  // namespace tdist
