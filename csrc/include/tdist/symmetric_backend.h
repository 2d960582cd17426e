// The transport under the symmetric heap. NVSHMEM is the first implementation; a native CUDA-IPC
// heap will be the second, so nothing above this interface may name NVSHMEM.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

#include "tdist/module_ptx.h"

namespace tdist {

// What the heap needs of a transport: one reservation, peers' bases, a stream barrier, module
// set-up, teardown.
class SymmetricBackend {
 public:
  virtual ~SymmetricBackend() = default;
  // The transport's name, for messages ("NVSHMEM").
  virtual std::string name() const = 0;

  // Collective: reserves `bytes` of device memory at the same offset on every rank and returns
  // this rank's base. Called once, by the heap, which sub-allocates inside it.
  virtual void* reserve(std::size_t bytes) = 0;

  // Base of `pe`'s reserved range as mapped into this process, or nullptr when `pe` cannot be
  // reached with loads and stores (another node).
  virtual void* peer_base(int pe) = 0;

  // Stream-ordered barrier across all ranks (also completes this rank's outstanding puts).
  virtual void barrier_all_on_stream(CUstream stream) = 0;

  // Prepares a module that Triton or NVRTC loaded for device-side calls into this backend.
  // Returns false when the module does not use the backend (nothing to do).
  virtual bool initialize_module(CUmodule module, const ModulePtx& ptx) = 0;

  // Undoes initialize_module (which returned true) for a module about to be unloaded: a module
  // that its owner unloads, unlike Triton's, must not stay known to the transport.
  virtual void finalize_module(CUmodule module) { (void)module; }

  // Collective: releases the reservation and the transport.
  virtual void finalize() = 0;
};

}  // namespace tdist
