#include "tdist/stream_ops.h"

#include "tdist/cuda_driver.h"

namespace tdist {

void stream_write_value64(CUstream stream, std::uint64_t* address, std::uint64_t value) {
  // Default flags: the write is preceded by a system-scope memory barrier, so the data written by
  // earlier work on this stream is visible before the flag.
  check_cuda(CudaDriver::get().stream_write_value64(
                 stream, reinterpret_cast<CUdeviceptr>(address), value, 0),
             -1, "stream_write_value64", "cuStreamWriteValue64");
}

void stream_wait_value64(CUstream stream, const std::uint64_t* address, std::uint64_t value) {
  // No CU_STREAM_WAIT_VALUE_FLUSH: few platforms support it, and peers publish over NVLink with
  // a system-scope barrier before the flag (stream_write_value64, release stores), which already
  // orders their data before it.
  check_cuda(CudaDriver::get().stream_wait_value64(
                 stream, reinterpret_cast<CUdeviceptr>(address), value,
                 CU_STREAM_WAIT_VALUE_GEQ),
             -1, "stream_wait_value64", "cuStreamWaitValue64");
}

}  // namespace tdist
