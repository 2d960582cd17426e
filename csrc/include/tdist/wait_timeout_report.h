// Where a Triton kernel's timed-out wait leaves its report: a record in pinned host memory that
// the GPU writes through its mapping before it traps, printed to stderr by a host thread.
//
// Why not printf on the device: vprintf is a function call, and ptxas serialises every wgmma of a
// kernel that contains a call (warning C7510), which cost the waiting GEMMs 15-20 % of their time.
// The report path of triton_dist.language's support library is calls-free: stores to this record,
// a system fence, a trap. Each module Triton loads gets the record's device address written into
// its `triton_dist_wait_report` global (initialize_module).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "tdist/module_ptx.h"

namespace tdist {

// The record's layout, shared with the support library's LLVM IR (language/support_library.py).
struct WaitTimeoutRecord {
  std::uint32_t claimed;    // 0 -> 1 by the first reporting thread (atom.cas, system scope)
  std::uint32_t published;  // set last, after a system fence, once the fields below are written
  std::int32_t rank;              // the rank whose wait timed out
  std::int32_t signal_index;      // which of the wait's signals (0 for a wait on one)
  std::uint64_t signal_address;   // its device address
  std::uint64_t expected;         // the value waited for
  std::uint64_t observed;         // the value last read
  std::uint64_t waited_ns;        // how long the thread spun
  std::uint32_t comparison;       // how the wait compared: kWaitAtLeast or kWaitEqual
  std::uint32_t reserved;         // padding to 8 bytes
};
static_assert(sizeof(WaitTimeoutRecord) == 56, "the support library's IR assumes this layout");

// WaitTimeoutRecord::comparison, as triton_dist.language's dl.wait(cmp=...) writes it.
inline constexpr std::uint32_t kWaitAtLeast = 0;  // cmp="ge": signal >= expected
inline constexpr std::uint32_t kWaitEqual = 1;    // cmp="eq": signal == expected

// The global each triton_dist.jit module carries: the record's device address (0: no report).
inline constexpr const char* kWaitReportSymbol = "triton_dist_wait_report";

// The process's record and the thread that prints it (file notes).
class WaitTimeoutReport {
 public:
  // The process's report, created on first use (needs a current CUDA context), and its watcher.
  // Deliberately never destroyed: loaded modules keep its address until the process exits. The
  // watcher stops at exit (an atexit handler, which runs before the CUDA driver tears down the
  // context that owns the record's pinned memory).
  static WaitTimeoutReport& get(int rank);

  // Writes the record's address into `module`'s kWaitReportSymbol; false if it has none.
  bool install(CUmodule module, const ModulePtx& ptx, int rank) const;

  // The message for a published record, or "" (also used by tests). `signal_name`: what the
  // signal is (SignalNames::name_of its address), "" if nobody named it.
  static std::string describe(const WaitTimeoutRecord& record, const std::string& signal_name = "");

  WaitTimeoutReport(const WaitTimeoutReport&) = delete;
  WaitTimeoutReport& operator=(const WaitTimeoutReport&) = delete;
  ~WaitTimeoutReport();

 private:
  explicit WaitTimeoutReport(int rank);
  void watch();
  void stop_watching();
  // Prints the record once it is published (once per process); true if it has been printed.
  bool print_if_published();

  WaitTimeoutRecord* host_ = nullptr;
  CUdeviceptr device_ = 0;
  std::atomic<bool> stop_{false};
  std::thread watcher_;
  int owner_pid_ = 0;
  // Touched by the watcher, then (after joining it) by stop_watching: never at the same time.
  bool printed_ = false;
};

}  // namespace tdist
