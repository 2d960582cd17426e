#include "tdist/runtime.h"

#include <mutex>
#include <vector>

#include "tdist/error.h"
#include "tdist/nvshmem_backend.h"
#include "tdist/wait_timeout_report.h"

namespace tdist {
namespace {

std::mutex g_mutex;
// Deliberately leaked at exit: destroying it would run backend teardown after CUDA and NVSHMEM
// have started their own, and a collective teardown can hang on a peer that already left.
Runtime* g_runtime = nullptr;
// Modules set up with a backend's device state. Triton never unloads a module, and a kernel
// loaded before finalize() would otherwise run after the next init() with the state of the
// torn-down backend (its heap, its peers' mappings): init() sets each of them up again.
std::vector<CUmodule> g_modules_using_backend;

}  // namespace

Runtime& Runtime::init(std::unique_ptr<Bootstrap> bootstrap, const RuntimeOptions& options,
                       std::unique_ptr<SymmetricBackend> backend) {
  std::lock_guard<std::mutex> lock(g_mutex);
  TDIST_CHECK(bootstrap != nullptr, -1, "init", "no bootstrap was given");
  const int rank = bootstrap->rank();
  TDIST_CHECK(g_runtime == nullptr, rank, "init",
              "the runtime is already initialised; call finalize() before init() again");
  TDIST_CHECK(options.heap_bytes > 0, rank, "init", "the heap size must be positive");

  auto runtime = std::unique_ptr<Runtime>(new Runtime());
  runtime->local_world_ = discover_local_world(*bootstrap, options.local_world_size);
  if (backend == nullptr) {
    NvshmemOptions nvshmem;
    nvshmem.library_dir = options.nvshmem_library_dir;
    nvshmem.heap_bytes = options.heap_bytes;
    nvshmem.keep_between_inits = options.keep_nvshmem;
    backend = std::make_unique<NvshmemBackend>(*bootstrap, nvshmem);
  }
  runtime->backend_ = std::move(backend);
  runtime->bootstrap_ = std::move(bootstrap);
  runtime->heap_ =
      SymmetricHeap::create(*runtime->bootstrap_, *runtime->backend_, options.heap_bytes);
  for (CUmodule module : g_modules_using_backend) {
    runtime->backend_->initialize_module(module, ModulePtx());
  }
  g_runtime = runtime.release();
  return *g_runtime;
}

Runtime& Runtime::get() {
  std::lock_guard<std::mutex> lock(g_mutex);
  TDIST_CHECK(g_runtime != nullptr, -1, "runtime",
              "triton_dist is not initialised: call triton_dist.init() first (under torchrun, or "
              "with a torch ProcessGroup)");
  return *g_runtime;
}

bool Runtime::initialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_runtime != nullptr;
}

bool Runtime::initialize_module(CUmodule module, const ModulePtx& ptx) {
  const bool uses_backend = backend_->initialize_module(module, ptx);
  if (uses_backend) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_modules_using_backend.push_back(module);
  }
  const bool reports_timeouts = WaitTimeoutReport::get(rank()).install(module, ptx, rank());
  return uses_backend || reports_timeouts;
}

void Runtime::release_module(CUmodule module) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (std::erase(g_modules_using_backend, module) == 0) return;
  if (g_runtime != nullptr) g_runtime->backend_->finalize_module(module);
}

void Runtime::finalize() {
  std::lock_guard<std::mutex> lock(g_mutex);
  TDIST_CHECK(g_runtime != nullptr, -1, "finalize", "triton_dist is not initialised");
  std::unique_ptr<Runtime> runtime(g_runtime);
  g_runtime = nullptr;
  runtime->bootstrap_->barrier();
  runtime->heap_->close();
  runtime->backend_->finalize();
}

}  // namespace tdist
