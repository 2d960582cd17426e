// Whether processes share a GPU through CUDA MPS: the one mode in which several ranks may use
// one device, because only under MPS do kernels of different processes run at the same time (a
// kernel that waits for another process's kernel otherwise waits for ever).
#pragma once

namespace tdist {

// What the driver says of a device's sharing.
enum class MpsState {
  kOff,      // contexts on this device are not shared: processes take turns on it
  kOn,       // contexts on this device are clients of an MPS server
  kUnknown,  // the driver is too old to say (CU_DEVICE_ATTRIBUTE_MPS_ENABLED is CUDA 12.3+)
};

// Asks the driver (cuInit must be possible); `rank` and the device name the error if it fails.
MpsState mps_state(int device, int rank);

}  // namespace tdist
