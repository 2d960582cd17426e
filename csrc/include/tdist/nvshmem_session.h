// Whether an init() brings NVSHMEM up, reuses the instance an earlier finalize() kept, or must
// first take that instance down. Kept only when asked (NvshmemOptions::keep_between_inits): each
// NVSHMEM init and finalize leaves about 1.1 MiB of GPU memory behind (measured on one H200, 150
// cycles at worlds 1 and 2, as much with no op as with ops), which a program that initialises
// many times cannot afford; the price is that NVSHMEM and its whole heap stay up after finalize().
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace tdist {

// An NVSHMEM instance this process brought up.
struct NvshmemSession {
  // Every rank's host name and process id, in rank order: the processes NVSHMEM connected.
  std::string members;
  // The heap NVSHMEM was sized for (NvshmemOptions::heap_bytes).
  std::size_t heap_bytes = 0;
  // Between the init() that uses it and that init's finalize().
  bool in_use = false;
};

// How an init() starts NVSHMEM.
enum class NvshmemStart {
  kInitialise,    // no instance: bring NVSHMEM up
  kReuse,         // the kept instance serves: same processes, a heap that fits
  kReinitialise,  // same processes, a larger heap: take the kept one down (collective), then up
};

// This process's entry of NvshmemSession::members.
std::string this_process_member();

// The members string of a world from every rank's this_process_member(), in rank order.
std::string join_members(const std::vector<std::string>& per_rank);

// What an init() does, or why it cannot.
struct NvshmemPlan {
  // The path init() takes (meaningless when refused).
  NvshmemStart start = NvshmemStart::kInitialise;
  // Non-empty where init() can do nothing (the message's body: what and the fix).
  std::string refusal;
};

// The plan of an init() of `members` needing `heap_bytes` given the `kept` instance (none:
// nullopt). Refused where the kept instance is still in use (an earlier init() failed part-way)
// or connects other processes (NVSHMEM cannot be taken down without them), and where an instance
// to be kept past finalize (`keep_past_finalize`) would not be the process's first
// (`brought_up_before`: NVSHMEM was up once and taken down). Not thrown: every rank learns every
// rank's plan first (a rank that threw alone would leave its peers waiting).
NvshmemPlan plan_nvshmem_start(const std::optional<NvshmemSession>& kept, const std::string& members,
                               std::size_t heap_bytes, bool keep_past_finalize = false,
                               bool brought_up_before = false);

}  // namespace tdist
