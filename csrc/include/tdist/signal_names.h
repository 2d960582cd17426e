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

  // Names the `count` signals of `signal_bytes` each at `base` as `owner`'s `noun` (a pad, or a
  // buffer whose words are waited on), with `regions` (indices into the range). Naming a base
  // again replaces its names. Returns the naming's id, for remove.
  std::uint64_t add(std::uint64_t base, std::size_t count, std::size_t signal_bytes, std::string owner,
                    std::vector<SignalRegion> regions, std::string noun = "pad");
  // Forgets the names of the range at `base` if `id` (add's) still names it: memory freed and
  // allocated again at the same base has been named anew, and the old owner's late removal must
  // not erase that. Nothing if the base has no names.
  void remove(std::uint64_t base, std::uint64_t id);
  // "signal I of OWNER's NOUN" and ": REGION[J]" where a region holds it; "" for an unnamed address.
  std::string name_of(std::uint64_t address) const;

 private:
  struct Range {
    std::size_t count;
    std::size_t signal_bytes;
    std::string owner;
    std::vector<SignalRegion> regions;
    std::string noun;
    std::uint64_t id;
  };
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Range> ranges_;  // by base address
  std::uint64_t next_id_ = 1;
};

}  // namespace tdist
