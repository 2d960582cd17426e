#include "tdist/cuda_driver.h"

#include <memory>
#include <mutex>

#include "tdist/error.h"
#include "tdist/shared_library.h"

namespace tdist {

const CudaDriver& CudaDriver::get() {
  static std::once_flag once;
  static std::unique_ptr<SharedLibrary> library;
  static CudaDriver driver;
  std::call_once(once, [] {
    library = std::make_unique<SharedLibrary>(
        std::vector<std::string>{"libcuda.so.1", "libcuda.so"},
        "No NVIDIA driver was found (libcuda.so.1). triton_dist needs a CUDA GPU for this "
        "call; the CPU self-check runs without one.");
    library->bind(driver.init, "cuInit");
    library->bind(driver.get_error_string, "cuGetErrorString");
    library->bind(driver.ctx_get_device, "cuCtxGetDevice");
    library->bind(driver.device_get, "cuDeviceGet");
    library->bind(driver.device_get_attribute, "cuDeviceGetAttribute");
    // The _v2 stream memory operations are the ones cuda.h maps these names to since CUDA 11.7.
    library->bind(driver.stream_write_value64, "cuStreamWriteValue64_v2");
    library->bind(driver.stream_wait_value64, "cuStreamWaitValue64_v2");
    library->bind(driver.memcpy_2d_async, "cuMemcpy2DAsync_v2");
    library->bind(driver.memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
    library->bind(driver.stream_batch_mem_op, "cuStreamBatchMemOp_v2");
    library->bind(driver.module_get_global, "cuModuleGetGlobal_v2");
    library->bind(driver.memcpy_htod, "cuMemcpyHtoD_v2");
    library->bind(driver.mem_host_alloc, "cuMemHostAlloc");
    library->bind(driver.mem_host_get_device_pointer, "cuMemHostGetDevicePointer_v2");
    library->bind(driver.mem_free_host, "cuMemFreeHost");
    library->bind(driver.launch_kernel_ex, "cuLaunchKernelEx");
    library->bind(driver.tensor_map_encode_tiled, "cuTensorMapEncodeTiled");
    library->bind(driver.module_load_data, "cuModuleLoadData");
    library->bind(driver.module_get_function, "cuModuleGetFunction");
    library->bind(driver.module_unload, "cuModuleUnload");
    library->bind(driver.func_set_attribute, "cuFuncSetAttribute");
    library->bind(driver.memcpy_dtoh, "cuMemcpyDtoH_v2");
    library->bind(driver.ctx_synchronize, "cuCtxSynchronize");
    library->bind(driver.ctx_set_current, "cuCtxSetCurrent");
    library->bind(driver.device_get_count, "cuDeviceGetCount");
    library->bind(driver.device_primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    library->bind(driver.stream_get_ctx, "cuStreamGetCtx");
    library->bind(driver.ctx_push_current, "cuCtxPushCurrent_v2");
    library->bind(driver.ctx_pop_current, "cuCtxPopCurrent_v2");
    library->bind(driver.stream_is_capturing, "cuStreamIsCapturing");
    library->bind(driver.stream_create, "cuStreamCreate");
    library->bind(driver.stream_destroy, "cuStreamDestroy_v2");
    library->bind(driver.stream_begin_capture, "cuStreamBeginCapture_v2");
    library->bind(driver.stream_end_capture, "cuStreamEndCapture");
    library->bind(driver.graph_instantiate, "cuGraphInstantiateWithFlags");
    library->bind(driver.graph_launch, "cuGraphLaunch");
    library->bind(driver.graph_destroy, "cuGraphDestroy");
    library->bind(driver.graph_exec_destroy, "cuGraphExecDestroy");
    check_cuda(driver.init(0), -1, "cuda_driver", "cuInit");
  });
  return driver;
}

void check_cuda(CUresult result, int rank, const std::string& op, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* message = nullptr;
  CudaDriver::get().get_error_string(result, &message);
  TDIST_FAIL(rank, op, call << " failed: " << (message ? message : "unknown error") << " (CUresult "
                            << static_cast<int>(result) << ")");
}

}  // namespace tdist
