#include "tdist/signal_pad.h"

#include <string>
#include <utility>

namespace tdist {

SignalPad::SignalPad(SymmetricHeap& heap, std::size_t num_signals, std::string owner,
                     std::vector<SignalRegion> regions)
    : block_(heap.allocate(num_signals * sizeof(std::uint64_t),
                           "SignalPad(" + std::to_string(num_signals) + ")")),
      num_signals_(num_signals) {
  if (!owner.empty()) {
    names_id_ = SignalNames::get().add(reinterpret_cast<std::uint64_t>(local()), num_signals,
                                       sizeof(std::uint64_t), std::move(owner), std::move(regions));
  }
}

SignalPad::~SignalPad() {
  if (names_id_ != 0) SignalNames::get().remove(reinterpret_cast<std::uint64_t>(local()), names_id_);
}

}  // namespace tdist
