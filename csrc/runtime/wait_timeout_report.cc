#include "tdist/wait_timeout_report.h"

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "tdist/cuda_driver.h"
#include "tdist/error.h"
#include "tdist/signal_names.h"

namespace tdist {
namespace {

// The reporting GPU thread lingers 100 ms between publishing and trapping (support_library.py):
// polling ten times as often prints the report before the host sees the kernel's error.
constexpr auto kPollInterval = std::chrono::milliseconds(10);

}  // namespace

WaitTimeoutReport& WaitTimeoutReport::get(int rank) {
  static std::once_flag once;
  static WaitTimeoutReport* report = nullptr;
  std::call_once(once, [rank] {
    report = new WaitTimeoutReport(rank);
    std::atexit([] { report->stop_watching(); });
  });
  return *report;
}

WaitTimeoutReport::WaitTimeoutReport(int rank) {
  const CudaDriver& cuda = CudaDriver::get();
  void* host = nullptr;
  // Portable: mapped in every context of the process; device-mapped: the GPU stores to it directly.
  check_cuda(cuda.mem_host_alloc(&host, sizeof(WaitTimeoutRecord),
                                 CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
             rank, "wait_timeout_report", "cuMemHostAlloc");
  host_ = static_cast<WaitTimeoutRecord*>(host);
  *host_ = WaitTimeoutRecord{};
  CUresult mapped = cuda.mem_host_get_device_pointer(&device_, host, 0);
  if (mapped != CUDA_SUCCESS) {
    cuda.mem_free_host(host);
    host_ = nullptr;
    check_cuda(mapped, rank, "wait_timeout_report", "cuMemHostGetDevicePointer");
  }
  owner_pid_ = getpid();
  watcher_ = std::thread([this] { watch(); });
}

WaitTimeoutReport::~WaitTimeoutReport() {
  // Unreachable by design (get() never deletes); kept so that the class owns what it allocates.
  stop_watching();
  if (watcher_.joinable()) watcher_.detach();  // a forked child's copy of the parent's thread
  if (host_ != nullptr) CudaDriver::get().mem_free_host(host_);
}

void WaitTimeoutReport::stop_watching() {
  // A forked child has no watcher thread to join (only the forking thread survives a fork).
  if (getpid() != owner_pid_) return;
  stop_.store(true);
  if (watcher_.joinable()) watcher_.join();
  print_if_published();  // published after the watcher's last look
}

bool WaitTimeoutReport::print_if_published() {
  if (printed_) return true;
  // The GPU publishes with a release store after a system fence; acquire pairs with it.
  if (std::atomic_ref<std::uint32_t>(host_->published).load(std::memory_order_acquire) == 0) return false;
  std::fprintf(stderr, "%s\n", describe(*host_, SignalNames::get().name_of(host_->signal_address)).c_str());
  std::fflush(stderr);
  printed_ = true;
  return true;
}

bool WaitTimeoutReport::install(CUmodule module, const ModulePtx& ptx, int rank) const {
  if (!ptx.may_declare(kWaitReportSymbol)) return false;
  CUdeviceptr slot = 0;
  std::size_t size = 0;
  CUresult found = CudaDriver::get().module_get_global(&slot, &size, module, kWaitReportSymbol);
  if (found == CUDA_ERROR_NOT_FOUND) return false;
  check_cuda(found, rank, "initialize_module", "cuModuleGetGlobal(triton_dist_wait_report)");
  TDIST_CHECK(size == sizeof(std::uint64_t), rank, "initialize_module",
              kWaitReportSymbol << " is " << size << " B, expected 8: a module built by another "
                                   "triton_dist version? Clear the Triton cache");
  const std::uint64_t address = device_;
  check_cuda(CudaDriver::get().memcpy_htod(slot, &address, sizeof(address)), rank,
             "initialize_module", "cuMemcpyHtoD(triton_dist_wait_report)");
  return true;
}

std::string WaitTimeoutReport::describe(const WaitTimeoutRecord& r, const std::string& signal_name) {
  if (r.published == 0) return "";
  char text[320];
  std::snprintf(text, sizeof(text),
                "triton_dist: rank %d: wait timed out after %" PRIu64 " ns on signal %d at 0x%" PRIx64
                ": expected %s %" PRIu64 ", observed %" PRIu64,
                r.rank, r.waited_ns, r.signal_index, r.signal_address,
                r.comparison == kWaitEqual ? "==" : ">=", r.expected, r.observed);
  std::string message = text;
  if (!signal_name.empty()) message += " (" + signal_name + ")";
  return message + "; the kernel traps: its peer never signalled, or signalled another epoch";
}

void WaitTimeoutReport::watch() {
  while (!stop_.load()) {
    std::this_thread::sleep_for(kPollInterval);
    // After a report the kernel traps: the context is lost, no second report can follow.
    if (print_if_published()) return;
  }
}

}  // namespace tdist
