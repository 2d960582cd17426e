// The few CUDA driver entry points the core needs, resolved from libcuda.so.1 at first use.
#pragma once

#include <cuda.h>

#include <string>

namespace tdist {

// The driver's functions the core calls, each the entry point of the same name (the _v2 ones
// where cuda.h maps the name to them).
struct CudaDriver {
  decltype(&cuInit) init;                                          // cuInit
  decltype(&cuGetErrorString) get_error_string;                    // cuGetErrorString
  decltype(&cuCtxGetDevice) ctx_get_device;                        // cuCtxGetDevice
  decltype(&cuDeviceGet) device_get;                               // cuDeviceGet
  decltype(&cuDeviceGetAttribute) device_get_attribute;            // cuDeviceGetAttribute
  decltype(&cuStreamWriteValue64) stream_write_value64;            // cuStreamWriteValue64_v2
  decltype(&cuStreamWaitValue64) stream_wait_value64;              // cuStreamWaitValue64_v2
  decltype(&cuMemcpy2DAsync) memcpy_2d_async;                      // cuMemcpy2DAsync_v2
  decltype(&cuMemcpyDtoDAsync) memcpy_dtod_async;                  // cuMemcpyDtoDAsync_v2
  decltype(&cuStreamBatchMemOp) stream_batch_mem_op;               // cuStreamBatchMemOp_v2
  decltype(&cuModuleGetGlobal) module_get_global;                  // cuModuleGetGlobal_v2
  decltype(&cuMemcpyHtoD) memcpy_htod;                             // cuMemcpyHtoD_v2
  decltype(&cuMemHostAlloc) mem_host_alloc;                        // cuMemHostAlloc
  decltype(&cuMemHostGetDevicePointer) mem_host_get_device_pointer;  // cuMemHostGetDevicePointer_v2
  decltype(&cuMemFreeHost) mem_free_host;                          // cuMemFreeHost
  decltype(&cuLaunchKernelEx) launch_kernel_ex;                    // cuLaunchKernelEx
  decltype(&cuTensorMapEncodeTiled) tensor_map_encode_tiled;       // cuTensorMapEncodeTiled
  // Loading prebuilt kernels and running them from a C++ program (prebuilt_kernel.h).
  decltype(&cuModuleLoadData) module_load_data;                    // cuModuleLoadData
  decltype(&cuModuleGetFunction) module_get_function;              // cuModuleGetFunction
  decltype(&cuModuleUnload) module_unload;                         // cuModuleUnload
  decltype(&cuFuncSetAttribute) func_set_attribute;                // cuFuncSetAttribute
  decltype(&cuMemcpyDtoH) memcpy_dtoh;                             // cuMemcpyDtoH_v2
  decltype(&cuCtxSynchronize) ctx_synchronize;                     // cuCtxSynchronize
  decltype(&cuCtxSetCurrent) ctx_set_current;                      // cuCtxSetCurrent
  decltype(&cuDeviceGetCount) device_get_count;                    // cuDeviceGetCount
  decltype(&cuDevicePrimaryCtxRetain) device_primary_ctx_retain;   // cuDevicePrimaryCtxRetain
  // A StreamSchedule's operations captured once into a CUDA graph (stream_schedule.h).
  decltype(&cuStreamGetCtx) stream_get_ctx;                        // cuStreamGetCtx
  decltype(&cuCtxPushCurrent) ctx_push_current;                    // cuCtxPushCurrent_v2
  decltype(&cuCtxPopCurrent) ctx_pop_current;                      // cuCtxPopCurrent_v2
  decltype(&cuStreamIsCapturing) stream_is_capturing;              // cuStreamIsCapturing
  decltype(&cuStreamCreate) stream_create;                         // cuStreamCreate
  decltype(&cuStreamDestroy) stream_destroy;                       // cuStreamDestroy_v2
  decltype(&cuStreamBeginCapture) stream_begin_capture;            // cuStreamBeginCapture_v2
  decltype(&cuStreamEndCapture) stream_end_capture;                // cuStreamEndCapture
  decltype(&cuGraphInstantiateWithFlags) graph_instantiate;        // cuGraphInstantiateWithFlags
  decltype(&cuGraphLaunch) graph_launch;                           // cuGraphLaunch
  decltype(&cuGraphDestroy) graph_destroy;                         // cuGraphDestroy
  decltype(&cuGraphExecDestroy) graph_exec_destroy;                // cuGraphExecDestroy

  // Loads libcuda.so.1 once per process; throws Error when no driver is installed.
  static const CudaDriver& get();
};

// Throws Error("<prefix>: <call> failed: <driver's message> (CUresult n)") when result != success.
void check_cuda(CUresult result, int rank, const std::string& op, const char* call);

}  // namespace tdist
