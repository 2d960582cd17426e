// A fixed sequence of stream operations (waits, writes, copies) recorded once and enqueued with
// one call. Copy-engine protocols enqueue a few operations per chunk and destination; from Python
// that cost ~15 µs of host time each (measured: 1.3-3.2 ms per GEMM+ReduceScatter call), longer
// than the GEMM they overlap at small M. Recorded once per shape, the same sequence costs only the
// driver calls, and consecutive waits/writes share one cuStreamBatchMemOp.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <variant>
#include <vector>

#include "tdist/stream_ops.h"

namespace tdist {

// Stream operations recorded in order and enqueued together (file notes).
class StreamSchedule {
 public:
  // cuStreamBatchMemOp takes fewer than 256 operations per call.
  static constexpr std::size_t kMaxBatch = 255;

  // Hold the stream until the signal compares true (stream_wait_value64's semantics).
  void wait_value64(const std::uint64_t* address, std::uint64_t value,
                    StreamWait wait = StreamWait::kAtLeast);
  // *address = value after a system-scope barrier (stream_write_value64's semantics).
  void write_value64(std::uint64_t* address, std::uint64_t value);
  // `bytes` contiguous bytes, device to device (a peer's mapped symmetric memory included).
  void copy(void* dst, const void* src, std::size_t bytes);
  // `height` rows of `width_bytes` (stream_copy_2d's semantics); throws when a pitch is below the row.
  void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t width_bytes, std::size_t height);

  // Enqueues every recorded operation on `stream`, in order. Safe under stream capture.
  void enqueue(CUstream stream) const;

  // Operations recorded.
  std::size_t size() const { return operations_; }
  // Driver calls enqueue() makes for them (waits and writes in a row share one).
  std::size_t driver_calls() const { return steps_.size(); }

 private:
  struct Copy1D {
    CUdeviceptr dst, src;
    std::size_t bytes;
  };
  using MemOpBatch = std::vector<CUstreamBatchMemOpParams>;
  using Step = std::variant<MemOpBatch, Copy1D, CUDA_MEMCPY2D>;

  void add_memop(const CUstreamBatchMemOpParams& op);

  std::vector<Step> steps_;
  std::size_t operations_ = 0;
};

}  // namespace tdist
