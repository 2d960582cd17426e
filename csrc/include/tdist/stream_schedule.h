// A fixed sequence of stream operations (waits, writes, copies) recorded once and enqueued with
// one call. Copy-engine protocols enqueue a few operations per chunk and destination; from Python
// that cost ~15 µs of host time each (measured: 1.3-3.2 ms per GEMM+ReduceScatter call), longer
// than the GEMM they overlap at small M. Recorded once per shape, the same sequence costs only the
// driver calls, and consecutive waits/writes share one cuStreamBatchMemOp.
//
// Even those driver calls were most of an eager GEMM+ReduceScatter's host time: its two schedules
// took ~450 µs a call under cProfile (one H100, two ranks under MPS, 2026-12-07; 318 µs per
// gemm_rs call unprofiled). So a schedule of kGraphMinDriverCalls or more is captured once into a
// CUDA graph and each enqueue is one cuGraphLaunch: the same operations in the same order on the
// same stream (a launch is ordered behind the stream's earlier work and behind earlier launches of
// its graph). Inside a capture the operations are enqueued one by one as before and become the
// caller's graph nodes.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
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

  // Enqueues every recorded operation on `stream`, in order (file notes: as one graph launch
  // where launches_as_graph() and `stream` is not capturing). Safe under stream capture. The
  // graph is made at the first such enqueue in the current context; operations recorded after it
  // discard it.
  void enqueue(CUstream stream) const;

  // Fewest driver calls for which enqueue() launches a graph: below, the calls cost no more.
  static constexpr std::size_t kGraphMinDriverCalls = 3;

  // Operations recorded.
  std::size_t size() const { return operations_; }
  // Driver calls enqueue() makes for them (waits and writes in a row share one) when it does
  // not launch a graph.
  std::size_t driver_calls() const { return steps_.size(); }
  // Whether an enqueue outside stream capture is one graph launch.
  bool launches_as_graph() const { return steps_.size() >= kGraphMinDriverCalls; }

 private:
  struct Copy1D {
    CUdeviceptr dst, src;
    std::size_t bytes;
  };
  using MemOpBatch = std::vector<CUstreamBatchMemOpParams>;
  using Step = std::variant<MemOpBatch, Copy1D, CUDA_MEMCPY2D>;

  // The operations as an instantiated graph of one context; destroys it (ignoring errors: the
  // context may be gone at exit).
  struct Graph {
    CUcontext context = nullptr;
    CUgraphExec exec = nullptr;
    Graph() = default;
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph();
  };

  void add_memop(const CUstreamBatchMemOpParams& op);
  void enqueue_each(CUstream stream) const;
  std::shared_ptr<Graph> capture(CUcontext context) const;

  std::vector<Step> steps_;
  std::size_t operations_ = 0;
  // Shared by copies of the schedule (same operations); reset by every recording call.
  mutable std::shared_ptr<Graph> graph_;
};

}  // namespace tdist
