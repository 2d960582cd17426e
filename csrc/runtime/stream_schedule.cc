#include "tdist/stream_schedule.h"

#include <cstring>

#include "tdist/cuda_driver.h"
#include "tdist/error.h"
#include "tdist/stream_ops.h"

namespace tdist {

StreamSchedule::Graph::~Graph() {
  if (exec != nullptr) CudaDriver::get().graph_exec_destroy(exec);
}

void StreamSchedule::add_memop(const CUstreamBatchMemOpParams& op) {
  discard_graphs();
  ++operations_;
  if (!steps_.empty()) {
    if (auto* batch = std::get_if<MemOpBatch>(&steps_.back()); batch && batch->size() < kMaxBatch) {
      batch->push_back(op);
      return;
    }
  }
  steps_.emplace_back(MemOpBatch{op});
}

void StreamSchedule::wait_value64(const std::uint64_t* address, std::uint64_t value, StreamWait wait) {
  CUstreamBatchMemOpParams op;
  std::memset(&op, 0, sizeof(op));
  op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
  op.waitValue.address = reinterpret_cast<CUdeviceptr>(address);
  op.waitValue.value64 = value;
  op.waitValue.flags = stream_wait_flags(wait);
  add_memop(op);
}

void StreamSchedule::write_value64(std::uint64_t* address, std::uint64_t value) {
  CUstreamBatchMemOpParams op;
  std::memset(&op, 0, sizeof(op));
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  op.writeValue.address = reinterpret_cast<CUdeviceptr>(address);
  op.writeValue.value64 = value;
  // Default flags: a system-scope barrier first, so the stream's earlier copies are visible
  // before the flag (CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER would break the publish protocol).
  op.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  add_memop(op);
}

void StreamSchedule::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  discard_graphs();
  ++operations_;
  steps_.emplace_back(Copy1D{reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes});
}

void StreamSchedule::copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                             std::size_t width_bytes, std::size_t height) {
  if (width_bytes == 0 || height == 0) return;
  discard_graphs();
  steps_.emplace_back(device_copy_2d("StreamSchedule.copy_2d", dst, dst_pitch, src, src_pitch, width_bytes, height));
  ++operations_;
}

void StreamSchedule::enqueue(CUstream stream, bool as_graph) const {
  if (steps_.empty()) return;
  if (as_graph && launches_as_graph() && !graphs_failed_) {
    if (const Graph* graph = graph_for(stream)) {
      // A failed launch enqueues nothing, so the operations can still go one by one.
      const CUresult launched = CudaDriver::get().graph_launch(graph->exec, stream);
      if (launched == CUDA_SUCCESS) return;
      graphs_failed_ = true;
      graph_failure_ = "cuGraphLaunch returned CUresult " + std::to_string(static_cast<int>(launched));
    }
  }
  enqueue_each(stream);
}

const StreamSchedule::Graph* StreamSchedule::graph_for(CUstream stream) const {
  const CudaDriver& driver = CudaDriver::get();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  check_cuda(driver.stream_is_capturing(stream, &status), -1, "StreamSchedule.enqueue", "cuStreamIsCapturing");
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) return nullptr;  // the caller's capture takes the operations
  // The stream's own context: the graph must be instantiated where the stream launches it.
  CUcontext context = nullptr;
  check_cuda(driver.stream_get_ctx(stream, &context), -1, "StreamSchedule.enqueue", "cuStreamGetCtx");
  for (const auto& graph : graphs_)
    if (graph->context == context && graph->stream == stream) return graph.get();
  if (graphs_.size() >= kMaxGraphs) return nullptr;
  try {
    graphs_.push_back(capture(context, stream));
  } catch (const Error& error) {
    // A driver that cannot capture or instantiate these operations: the one-by-one path, which
    // needs neither, serves every later call.
    graphs_failed_ = true;
    graph_failure_ = error.what();
    return nullptr;
  }
  return graphs_.back().get();
}

std::unique_ptr<StreamSchedule::Graph> StreamSchedule::capture(CUcontext context, CUstream stream) const {
  const CudaDriver& driver = CudaDriver::get();
  const char* op = "StreamSchedule.enqueue (capturing its graph)";
  // In the stream's context, on a private stream, so that nothing else is captured with the
  // operations; relaxed mode, so that other threads' CUDA calls meanwhile are not refused.
  check_cuda(driver.ctx_push_current(context), -1, op, "cuCtxPushCurrent");
  struct ContextGuard {
    ~ContextGuard() {
      CUcontext popped = nullptr;
      CudaDriver::get().ctx_pop_current(&popped);
    }
  } context_guard;
  CUstream private_stream = nullptr;
  check_cuda(driver.stream_create(&private_stream, CU_STREAM_NON_BLOCKING), -1, op, "cuStreamCreate");
  struct StreamGuard {
    CUstream stream;
    ~StreamGuard() { CudaDriver::get().stream_destroy(stream); }
  } stream_guard{private_stream};
  check_cuda(driver.stream_begin_capture(private_stream, CU_STREAM_CAPTURE_MODE_RELAXED), -1, op,
             "cuStreamBeginCapture");
  CUgraph graph = nullptr;
  try {
    enqueue_each(private_stream);
  } catch (...) {
    driver.stream_end_capture(private_stream, &graph);
    if (graph != nullptr) driver.graph_destroy(graph);
    throw;
  }
  check_cuda(driver.stream_end_capture(private_stream, &graph), -1, op, "cuStreamEndCapture");
  struct GraphGuard {
    CUgraph graph;
    ~GraphGuard() { CudaDriver::get().graph_destroy(graph); }
  } graph_guard{graph};
  auto result = std::make_unique<Graph>();
  check_cuda(driver.graph_instantiate(&result->exec, graph, 0), -1, op, "cuGraphInstantiateWithFlags");
  result->context = context;
  result->stream = stream;
  return result;
}

void StreamSchedule::enqueue_each(CUstream stream) const {
  const CudaDriver& driver = CudaDriver::get();
  for (const Step& step : steps_) {
    if (const auto* batch = std::get_if<MemOpBatch>(&step)) {
      // The driver takes a non-const array but does not modify it.
      check_cuda(driver.stream_batch_mem_op(stream, static_cast<unsigned>(batch->size()),
                                            const_cast<CUstreamBatchMemOpParams*>(batch->data()), 0),
                 -1, "StreamSchedule.enqueue", "cuStreamBatchMemOp");
    } else if (const auto* copy = std::get_if<Copy1D>(&step)) {
      check_cuda(driver.memcpy_dtod_async(copy->dst, copy->src, copy->bytes, stream), -1,
                 "StreamSchedule.enqueue", "cuMemcpyDtoDAsync");
    } else {
      check_cuda(driver.memcpy_2d_async(&std::get<CUDA_MEMCPY2D>(step), stream), -1,
                 "StreamSchedule.enqueue", "cuMemcpy2DAsync");
    }
  }
}

}  // namespace tdist
