#include "tdist/signal_pad.h"

#include <string>

namespace tdist {

SignalPad::SignalPad(SymmetricHeap& heap, std::size_t num_signals)
    : block_(heap.allocate(num_signals * sizeof(std::uint64_t),
                           "SignalPad(" + std::to_string(num_signals) + ")")),
      num_signals_(num_signals) {}

}  // namespace tdist
