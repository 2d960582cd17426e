// Stream memory operations: the copy engine cannot execute a release store, so a copy-engine
// producer publishes a chunk by enqueueing a 64-bit write after its copy on the same stream, and
// a consumer stream can be held until a signal reaches a value, without a kernel.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace tdist {

// Enqueues *address = value on `stream`, ordered after the stream's earlier work. The write is
// made visible system-wide (peers read it across NVLink).
void stream_write_value64(CUstream stream, std::uint64_t* address, std::uint64_t value);

// How a stream wait compares the signal with its value.
enum class StreamWait {
  kAtLeast,  // *address >= value: the monotonic epoch convention of signal pads
  kEqual,    // *address == value: flags that take several states
};

// The driver's flags for `wait` (no flush; stream_ops.cc says why).
unsigned stream_wait_flags(StreamWait wait);

// Holds `stream` until the signal at `address` compares true with `value`.
void stream_wait_value64(CUstream stream, const std::uint64_t* address, std::uint64_t value,
                         StreamWait wait = StreamWait::kAtLeast);

// Enqueues a copy-engine copy of `height` rows of `width_bytes` bytes on `stream`: row i goes from
// src + i * src_pitch to dst + i * dst_pitch. Device pointers of this process (a peer's symmetric
// memory mapped here included, which the copy reaches over NVLink); no SM runs it, so it overlaps a
// kernel that holds every SM. Throws when the pitches are smaller than the row or the driver
// refuses the copy.
void stream_copy_2d(CUstream stream, void* dst, std::size_t dst_pitch, const void* src,
                    std::size_t src_pitch, std::size_t width_bytes, std::size_t height);

// The driver's description of that copy, for callers that enqueue it later (StreamSchedule).
// Throws, naming `op`, when a pitch is smaller than the row.
CUDA_MEMCPY2D device_copy_2d(const char* op, void* dst, std::size_t dst_pitch, const void* src,
                             std::size_t src_pitch, std::size_t width_bytes, std::size_t height);

}  // namespace tdist
