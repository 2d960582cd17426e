// The few CUDA driver entry points the core needs, resolved from libcuda.so.1 at first use.
#pragma once

#include <cuda.h>

#include <string>

namespace tdist {

struct CudaDriver {
  decltype(&cuInit) init;
  decltype(&cuGetErrorString) get_error_string;
  decltype(&cuCtxGetDevice) ctx_get_device;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuDeviceGetAttribute) device_get_attribute;
  decltype(&cuStreamWriteValue64) stream_write_value64;
  decltype(&cuStreamWaitValue64) stream_wait_value64;
  decltype(&cuMemcpy2DAsync) memcpy_2d_async;
  decltype(&cuMemcpyDtoDAsync) memcpy_dtod_async;
  decltype(&cuStreamBatchMemOp) stream_batch_mem_op;
  decltype(&cuModuleGetGlobal) module_get_global;
  decltype(&cuMemcpyHtoD) memcpy_htod;
  decltype(&cuMemHostAlloc) mem_host_alloc;
  decltype(&cuMemHostGetDevicePointer) mem_host_get_device_pointer;
  decltype(&cuMemFreeHost) mem_free_host;

  // Loads libcuda.so.1 once per process; throws Error when no driver is installed.
  static const CudaDriver& get();
};

// Throws Error("<prefix>: <call> failed: <driver's message> (CUresult n)") when result != success.
void check_cuda(CUresult result, int rank, const std::string& op, const char* call);

}  // namespace tdist
