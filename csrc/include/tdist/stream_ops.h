// Stream memory operations: the copy engine cannot execute a release store, so a copy-engine
// producer publishes a chunk by enqueueing a 64-bit write after its copy on the same stream, and
// a consumer stream can be held until a signal reaches a value, without a kernel.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace tdist {

// Enqueues *address = value on `stream`, ordered after the stream's earlier work. The write is
// made visible system-wide (peers read it across NVLink).
void stream_write_value64(CUstream stream, std::uint64_t* address, std::uint64_t value);

// Holds `stream` until *address >= value (the monotonic epoch convention of signal pads).
void stream_wait_value64(CUstream stream, const std::uint64_t* address, std::uint64_t value);

}  // namespace tdist
