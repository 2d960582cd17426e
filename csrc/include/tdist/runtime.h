// The process-wide runtime: bootstrap, local world, symmetric backend and heap, created by one
// collective init() and torn down by one collective finalize().
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tdist/bootstrap.h"
#include "tdist/local_world.h"
#include "tdist/symmetric_backend.h"
#include "tdist/symmetric_heap.h"

namespace tdist {

// What Runtime::init needs besides a bootstrap.
struct RuntimeOptions {
  // Bytes of symmetric memory every rank reserves (the same on every rank).
  std::size_t heap_bytes = 1ull << 30;
  // 0: discover from host names; > 0: declare (see local_world.h).
  int local_world_size = 0;
  // Where libnvshmem_host.so.3 lives (see NvshmemOptions).
  std::string nvshmem_library_dir;
  // finalize() keeps NVSHMEM up for the next init() of the same processes (NvshmemOptions).
  bool keep_nvshmem = false;
};

// The one runtime of a process, between init() and finalize().
class Runtime {
 public:
  // Collective. `backend` is for tests and other transports; null selects NVSHMEM. Throws if the
  // runtime is already initialised.
  static Runtime& init(std::unique_ptr<Bootstrap> bootstrap, const RuntimeOptions& options,
                       std::unique_ptr<SymmetricBackend> backend = nullptr);
  // Throws "not initialised" naming the fix when init() has not run.
  static Runtime& get();
  // Whether init() has run and finalize() has not.
  static bool initialized();
  // Collective: barrier, then backend teardown. Symmetric tensors still alive afterwards keep
  // their (now invalid) addresses; using them is an error the heap reports.
  static void finalize();

  // This rank (the bootstrap's).
  int rank() const { return bootstrap_->rank(); }
  // Number of ranks.
  int world_size() const { return bootstrap_->world_size(); }
  // This rank's place among the nodes, discovered or declared at init.
  const LocalWorld& local_world() const { return local_world_; }
  // The host exchange init was given.
  Bootstrap& bootstrap() { return *bootstrap_; }
  // The transport that maps peers' memory (NVSHMEM unless init was given another).
  SymmetricBackend& backend() { return *backend_; }
  // The symmetric heap every collective allocation comes from.
  SymmetricHeap& heap() { return *heap_; }

  // Sets up a module Triton loaded: the backend's device state (if the module uses the backend)
  // and the address of the wait-timeout report (if it has a timed-out-wait path). True if either.
  // A later init() gives the modules that use the backend the new backend's state.
  bool initialize_module(CUmodule module, const ModulePtx& ptx);
  // Before its owner unloads a module set up by initialize_module (a prebuilt kernel's; Triton
  // never unloads): the backend releases the module, and a later init() no longer sets it up.
  // Also valid after finalize(), when only the latter is left to do.
  static void release_module(CUmodule module);

  // Host-side barrier over the bootstrap (does not order GPU work).
  void barrier() { bootstrap_->barrier(); }

 private:
  Runtime() = default;
  std::unique_ptr<Bootstrap> bootstrap_;
  LocalWorld local_world_;
  std::unique_ptr<SymmetricBackend> backend_;
  std::shared_ptr<SymmetricHeap> heap_;
};

}  // namespace tdist
