// A fixed sequence of stream operations (waits, writes, copies) recorded once and enqueued with
// one call. Copy-engine protocols enqueue a few operations per chunk and destination; from Python
// that cost ~15 µs of host time each (measured: 1.3-3.2 ms per GEMM+ReduceScatter call), longer
// than the GEMM they overlap at small M. Recorded once per shape, the same sequence costs only the
// driver calls, and consecutive waits/writes share one cuStreamBatchMemOp.
//
// Even those driver calls were most of an eager GEMM+ReduceScatter's host time: its two schedules
// took ~450 µs a call under cProfile (one H100, two ranks under MPS, 2026-12-07; 318 µs per
// gemm_rs call unprofiled). So, when asked (enqueue's `as_graph`; Python: the
// Config.stream_schedule_graphs switch), a schedule of kGraphMinDriverCalls or more is captured
// once per (context, stream) into a CUDA graph and each enqueue is one cuGraphLaunch: the same
// operations in the same order on that stream. One graph per stream, because launches of one
// executable graph wait for each other whatever their streams, which would order streams that the
// operations alone leave independent. Not yet the default: whether the driver runs a captured
// peer copy on a copy engine, as it runs cuMemcpyDtoDAsync, is unverified, and a copy that needs
// SMs would wait behind a GEMM that holds every SM while it waits for that copy. Inside a capture,
// where graphs fail, or past kMaxGraphs streams, the operations are enqueued one by one as before.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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

  // No operations.
  StreamSchedule() = default;
  // A copy records the same operations and makes its own graphs (file notes: one per stream).
  StreamSchedule(const StreamSchedule& other) : steps_(other.steps_), operations_(other.operations_) {}
  // As the copy constructor: the operations, not the graphs.
  StreamSchedule& operator=(const StreamSchedule& other) {
    if (this != &other) {
      steps_ = other.steps_;
      operations_ = other.operations_;
      graphs_.clear();
    }
    return *this;
  }

  // Enqueues every recorded operation on `stream`, in order (file notes: as one graph launch
  // where `as_graph`, launches_as_graph() and `stream` is not capturing). Safe under stream
  // capture. A stream's graph is made at its first such enqueue; recording discards them all. Not
  // thread-safe (Python calls it under the GIL).
  void enqueue(CUstream stream, bool as_graph = false) const;

  // Fewest driver calls for which enqueue() launches a graph: below, the calls cost no more.
  static constexpr std::size_t kGraphMinDriverCalls = 3;
  // Most (context, stream) graphs kept per schedule; more streams enqueue one by one.
  static constexpr std::size_t kMaxGraphs = 4;

  // Operations recorded.
  std::size_t size() const { return operations_; }
  // Driver calls enqueue() makes for them (waits and writes in a row share one) when it does
  // not launch a graph.
  std::size_t driver_calls() const { return steps_.size(); }
  // Whether an enqueue outside stream capture is one graph launch.
  bool launches_as_graph() const { return steps_.size() >= kGraphMinDriverCalls; }
  // Graphs made so far (one per stream enqueued on as a graph).
  std::size_t graphs() const { return graphs_.size(); }
  // Why graphs stopped serving this schedule (the failed capture, instantiation or launch, with
  // the driver's error), or empty: graph enqueues fall back to one by one silently, and a
  // benchmark needs to tell the two apart.
  const std::string& graph_failure() const { return graph_failure_; }

 private:
  struct Copy1D {
    CUdeviceptr dst, src;
    std::size_t bytes;
  };
  using MemOpBatch = std::vector<CUstreamBatchMemOpParams>;
  using Step = std::variant<MemOpBatch, Copy1D, CUDA_MEMCPY2D>;

  // The operations as an instantiated graph for one stream of one context; destroys it (ignoring
  // errors: the context may be gone at exit).
  struct Graph {
    CUcontext context = nullptr;
    CUstream stream = nullptr;
    CUgraphExec exec = nullptr;
    Graph() = default;
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph();
  };

  void add_memop(const CUstreamBatchMemOpParams& op);
  void discard_graphs() {
    graphs_.clear();
    graphs_failed_ = false;
    graph_failure_.clear();
  }
  void enqueue_each(CUstream stream) const;
  // `stream`'s graph, captured now if it has none; null where graphs cannot serve it.
  const Graph* graph_for(CUstream stream) const;
  std::unique_ptr<Graph> capture(CUcontext context, CUstream stream) const;

  std::vector<Step> steps_;
  std::size_t operations_ = 0;
  mutable std::vector<std::unique_ptr<Graph>> graphs_;  // per (context, stream); see kMaxGraphs
  mutable bool graphs_failed_ = false;  // a capture or launch failed: enqueue one by one from then on
  mutable std::string graph_failure_;  // what failed (graph_failure())
};

}  // namespace tdist
