// Signal pads: symmetric arrays of uint64 flags with a per-call epoch. A producer sets slot i to
// the current epoch when tile i is ready; a consumer waits for >= epoch. Because epochs only grow,
// no kernel has to reset the pad between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tdist/signal_names.h"
#include "tdist/symmetric_heap.h"

namespace tdist {

// A symmetric array of signals and the epoch of the call being prepared (file notes).
class SignalPad {
 public:
  // Collective: allocates `num_signals` uint64 slots on every rank. The caller zeroes them on
  // the device before first use (the heap hands out uninitialised memory). `owner` (and its
  // `regions`) name the pad's signals in wait-timeout reports while the pad lives (SignalNames).
  SignalPad(SymmetricHeap& heap, std::size_t num_signals, std::string owner = "",
            std::vector<SignalRegion> regions = {});
  ~SignalPad();
  SignalPad(const SignalPad&) = delete;
  SignalPad& operator=(const SignalPad&) = delete;

  // This rank's signals.
  std::uint64_t* local() const { return static_cast<std::uint64_t*>(block_->local()); }
  // Rank `pe`'s signals, mapped here (same node).
  std::uint64_t* peer(int pe) const { return static_cast<std::uint64_t*>(block_->peer(pe)); }
  // Number of signals.
  std::size_t size() const { return num_signals_; }
  // The symmetric allocation holding them.
  const std::shared_ptr<SymmetricBlock>& block() const { return block_; }

  // The epoch of the call being prepared: 1 for the first call, then 2, 3, ... Every rank must
  // call this once per collective call, so that all ranks agree on the value.
  std::uint64_t next_epoch() { return ++epoch_; }
  // The epoch next_epoch() returned last (0 before the first call).
  std::uint64_t epoch() const { return epoch_; }

 private:
  std::shared_ptr<SymmetricBlock> block_;
  std::size_t num_signals_;
  std::uint64_t names_id_ = 0;  // SignalNames::add's, 0 when unnamed
  std::uint64_t epoch_ = 0;
};

}  // namespace tdist
