#include "tdist/stream_ops.h"

#include <cstring>

#include "tdist/cuda_driver.h"
#include "tdist/error.h"

namespace tdist {

void stream_write_value64(CUstream stream, std::uint64_t* address, std::uint64_t value) {
  // Default flags: the write is preceded by a system-scope memory barrier, so the data written by
  // earlier work on this stream is visible before the flag.
  check_cuda(CudaDriver::get().stream_write_value64(
                 stream, reinterpret_cast<CUdeviceptr>(address), value, 0),
             -1, "stream_write_value64", "cuStreamWriteValue64");
}

unsigned stream_wait_flags(StreamWait wait) {
  // No CU_STREAM_WAIT_VALUE_FLUSH: few platforms support it, and peers publish over NVLink with
  // a system-scope barrier before the flag (stream_write_value64, release stores), which already
  // orders their data before it.
  return wait == StreamWait::kEqual ? CU_STREAM_WAIT_VALUE_EQ : CU_STREAM_WAIT_VALUE_GEQ;
}

void stream_wait_value64(CUstream stream, const std::uint64_t* address, std::uint64_t value,
                         StreamWait wait) {
  check_cuda(CudaDriver::get().stream_wait_value64(
                 stream, reinterpret_cast<CUdeviceptr>(address), value, stream_wait_flags(wait)),
             -1, "stream_wait_value64", "cuStreamWaitValue64");
}

CUDA_MEMCPY2D device_copy_2d(const char* op, void* dst, std::size_t dst_pitch, const void* src,
                             std::size_t src_pitch, std::size_t width_bytes, std::size_t height) {
  if (dst_pitch < width_bytes || src_pitch < width_bytes) {
    TDIST_FAIL(-1, op,
               "pitches (dst " << dst_pitch << ", src " << src_pitch << " bytes) must be at least the row ("
                               << width_bytes << " bytes): pass the row stride of each 2-D region");
  }
  CUDA_MEMCPY2D copy;
  std::memset(&copy, 0, sizeof(copy));
  copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = reinterpret_cast<CUdeviceptr>(src);
  copy.srcPitch = src_pitch;
  copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
  copy.dstPitch = dst_pitch;
  copy.WidthInBytes = width_bytes;
  copy.Height = height;
  return copy;
}

void stream_copy_2d(CUstream stream, void* dst, std::size_t dst_pitch, const void* src,
                    std::size_t src_pitch, std::size_t width_bytes, std::size_t height) {
  if (width_bytes == 0 || height == 0) return;
  const CUDA_MEMCPY2D copy =
      device_copy_2d("stream_copy_2d", dst, dst_pitch, src, src_pitch, width_bytes, height);
  check_cuda(CudaDriver::get().memcpy_2d_async(&copy, stream), -1, "stream_copy_2d",
             "cuMemcpy2DAsync");
}

}  // namespace tdist
