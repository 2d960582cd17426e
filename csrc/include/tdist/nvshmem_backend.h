// The NVSHMEM implementation of SymmetricBackend. libnvshmem_host.so.3 comes from the
// nvidia-nvshmem-cu13 wheel and is loaded at run time; NVSHMEM is initialised with its unique-id
// method over our Bootstrap, so users never set NVSHMEM's bootstrap variables.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tdist/bootstrap.h"
#include "tdist/symmetric_backend.h"

namespace tdist {

// Settings of NvshmemBackend.
struct NvshmemOptions {
  // Directory holding libnvshmem_host.so.3 (the wheel's nvidia/nvshmem/lib); empty: let the
  // dynamic loader search.
  std::string library_dir;
  // Bytes the heap will reserve; NVSHMEM's own heap is sized from it.
  std::size_t heap_bytes = 0;
  // finalize() keeps NVSHMEM up for the next init() of the same processes (nvshmem_session.h).
  bool keep_between_inits = false;
};

// NVSHMEM as the symmetric heap's transport (file notes).
class NvshmemBackend final : public SymmetricBackend {
 public:
  // Collective over `bootstrap`. The CUDA device must already be current on the calling thread.
  NvshmemBackend(Bootstrap& bootstrap, const NvshmemOptions& options);
  ~NvshmemBackend() override;

  std::string name() const override { return "NVSHMEM"; }
  void* reserve(std::size_t bytes) override;
  void* peer_base(int pe) override;
  void barrier_all_on_stream(CUstream stream) override;
  bool initialize_module(CUmodule module, const ModulePtx& ptx) override;
  void finalize_module(CUmodule module) override;
  void finalize() override;

  // Where libnvshmem_host.so.3 was loaded from.
  std::string library_path() const;

  struct Api;  // resolved entry points; defined in nvshmem_backend.cc

 private:
  Bootstrap& bootstrap_;
  std::unique_ptr<Api> api_;
  void* base_ = nullptr;
  bool finalized_ = false;
  bool keep_between_inits_ = false;

  // Collective: NVSHMEM's unique-id bring-up, its heap sized for `heap_bytes`.
  void bring_up(std::size_t heap_bytes);
};

}  // namespace tdist
