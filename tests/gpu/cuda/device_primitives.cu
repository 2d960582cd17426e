// CUDA C++ kernels built on tdist/device.cuh, with extern "C" launchers for ctypes
// (tests/gpu/test_device_cuh.py compiles this with nvcc and drives it from every rank).
//
// Launchers take addresses as uintptr_t, the SymmetricMap as a pointer to its bytes (built by
// triton_dist.device_map.symmetric_map_bytes()), and a cudaStream_t as uintptr_t; they return the
// cudaError_t of the launch (0 on success).

#include <cuda_runtime.h>

#include <cstdint>

#include "tdist/device.cuh"

namespace dev = tdist::device;

namespace {

// The value element `i` of tile `tile` holds in epoch `epoch`: a stale tile (earlier epoch), a
// tile read before its stores landed, or one from the wrong place cannot match.
__host__ __device__ inline std::uint64_t tile_value(std::uint64_t epoch, int tile, int i) {
  return (epoch << 32) | (static_cast<std::uint64_t>(tile) << 16) | static_cast<std::uint64_t>(i);
}

// One CTA per tile: store the tile into rank `pe`'s inbox, then publish it.
// Epoch 0 returns at once: it loads the module without touching memory.
__global__ void produce_tiles(std::uint64_t* inbox, std::uint64_t* signals, int pe, int tile_elems,
                              std::uint64_t epoch, dev::SymmetricMap map) {
  if (epoch == 0) return;
  const int tile = blockIdx.x;
  std::uint64_t* remote =
      dev::symm_at(inbox + static_cast<std::size_t>(tile) * tile_elems, pe, map);
  for (int i = dev::tid(); i < tile_elems; i += blockDim.x) {
    // Relaxed (strong) stores: the release in notify_block is what orders them before the signal.
    dev::st<dev::Scope::sys, dev::Semantic::relaxed>(remote + i, tile_value(epoch, tile, i));
  }
  dev::notify_block(signals + tile, pe, epoch, dev::SignalOp::set, map);
}

// One CTA per tile: wait for the tile's signal to reach `epoch`, then copy the tile out.
__global__ void consume_tiles(const std::uint64_t* inbox, const std::uint64_t* signals,
                              std::uint64_t* out, int tile_elems, std::uint64_t epoch,
                              std::uint64_t timeout_ns, dev::SymmetricMap map) {
  if (epoch == 0) return;
  const int tile = blockIdx.x;
  dev::wait_block(signals + tile, 1, epoch, dev::Scope::sys, timeout_ns, map);
  const std::size_t offset = static_cast<std::size_t>(tile) * tile_elems;
  for (int i = dev::tid(); i < tile_elems; i += blockDim.x) out[offset + i] = inbox[offset + i];
}

// Ranks 0 and 1 bounce a flag `rounds` times: rank 0 sets the peer's flag to v and waits for its
// own to reach v; rank 1 waits, then answers. One thread; rounds == 0 only loads the module.
__global__ void ping_pong(std::uint64_t* flag, int rounds, std::uint64_t timeout_ns,
                          dev::SymmetricMap map) {
  const int me = dev::rank(map);
  const int peer = 1 - me;
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t v = static_cast<std::uint64_t>(r) + 1;
    if (me == 0) {
      dev::notify(flag, peer, v, dev::SignalOp::set, map);
      dev::wait(flag, 1, v, dev::Scope::sys, timeout_ns, map);
    } else {
      dev::wait(flag, 1, v, dev::Scope::sys, timeout_ns, map);
      dev::notify(flag, peer, v, dev::SignalOp::set, map);
    }
  }
}

// Waits with a timeout on a signal that nobody sets.
__global__ void wait_forever(const std::uint64_t* signal, std::uint64_t expected,
                             std::uint64_t timeout_ns, int rank) {
  dev::wait(signal, 1, expected, dev::Scope::sys, timeout_ns, rank);
}

dev::SymmetricMap load_map(const void* map_bytes) {
  dev::SymmetricMap map;
  std::memcpy(&map, map_bytes, sizeof(map));
  return map;
}

cudaStream_t as_stream(std::uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

template <class T>
T* as_ptr(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace

extern "C" {

// sizeof(SymmetricMap), so the Python side can check that its layout agrees.
int tdist_test_symmetric_map_size() { return static_cast<int>(sizeof(dev::SymmetricMap)); }

const char* tdist_test_error_name(int error) {
  return cudaGetErrorName(static_cast<cudaError_t>(error));
}

int tdist_test_produce(std::uintptr_t inbox, std::uintptr_t signals, int pe, int num_tiles,
                       int tile_elems, std::uint64_t epoch, const void* map_bytes,
                       std::uintptr_t stream) {
  produce_tiles<<<num_tiles, 256, 0, as_stream(stream)>>>(as_ptr<std::uint64_t>(inbox),
                                                          as_ptr<std::uint64_t>(signals), pe,
                                                          tile_elems, epoch, load_map(map_bytes));
  return static_cast<int>(cudaGetLastError());
}

int tdist_test_consume(std::uintptr_t inbox, std::uintptr_t signals, std::uintptr_t out,
                       int num_tiles, int tile_elems, std::uint64_t epoch, std::uint64_t timeout_ns,
                       const void* map_bytes, std::uintptr_t stream) {
  consume_tiles<<<num_tiles, 256, 0, as_stream(stream)>>>(
      as_ptr<const std::uint64_t>(inbox), as_ptr<const std::uint64_t>(signals),
      as_ptr<std::uint64_t>(out), tile_elems, epoch, timeout_ns, load_map(map_bytes));
  return static_cast<int>(cudaGetLastError());
}

int tdist_test_ping_pong(std::uintptr_t flag, int rounds, std::uint64_t timeout_ns,
                         const void* map_bytes, std::uintptr_t stream) {
  ping_pong<<<1, 1, 0, as_stream(stream)>>>(as_ptr<std::uint64_t>(flag), rounds, timeout_ns,
                                            load_map(map_bytes));
  return static_cast<int>(cudaGetLastError());
}

// Self-contained (no triton_dist runtime): on `device`, a signal holding `current` is waited on for
// `expected` with `timeout_ns`; returns the error of the synchronisation that follows (a trap
// gives cudaErrorLaunchFailure or similar, never 0 unless the signal was already high enough).
int tdist_test_wait_timeout(int device, std::uint64_t current, std::uint64_t expected,
                            std::uint64_t timeout_ns, int rank) {
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) return static_cast<int>(err);
  std::uint64_t* signal = nullptr;
  if ((err = cudaMalloc(&signal, sizeof(*signal))) != cudaSuccess) return static_cast<int>(err);
  if ((err = cudaMemcpy(signal, &current, sizeof(current), cudaMemcpyHostToDevice)) !=
      cudaSuccess) {
    return static_cast<int>(err);
  }
  wait_forever<<<1, 1>>>(signal, expected, timeout_ns, rank);
  if ((err = cudaGetLastError()) != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(cudaDeviceSynchronize());
}

}  // extern "C"
