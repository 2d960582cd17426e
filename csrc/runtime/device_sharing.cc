#include "tdist/device_sharing.h"

#include "tdist/cuda_driver.h"
#include "tdist/error.h"

namespace tdist {

MpsState mps_state(int device, int rank) {
  const CudaDriver& cuda = CudaDriver::get();
  CUdevice handle = 0;
  check_cuda(cuda.device_get(&handle, device), rank, "init", "cuDeviceGet");
  int enabled = 0;
  const CUresult result = cuda.device_get_attribute(&enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, handle);
  // Drivers older than the attribute reject its number; that says nothing about MPS.
  if (result == CUDA_ERROR_INVALID_VALUE) return MpsState::kUnknown;
  check_cuda(result, rank, "init", "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED)");
  return enabled != 0 ? MpsState::kOn : MpsState::kOff;
}

}  // namespace tdist
