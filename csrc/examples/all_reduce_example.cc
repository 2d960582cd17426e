// The library's one-shot AllReduce run from a C++ program, without Python: TCP bootstrap, runtime,
// symmetric buffers, a prebuilt kernel, checked results. One process per rank:
//
//   python -m triton_dist.tools.prebuild --out prebuilt --world 2 --dtype float32 all_reduce_one_shot
//   export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 TDIST_PREBUILT_DIR=prebuilt
//   export TDIST_NVSHMEM_LIBRARY_DIR=$(python -c 'import triton_dist.nvshmem as n; print(n.library_dir())')
//   RANK=0 ./all_reduce_example & RANK=1 ./all_reduce_example
//
// scripts/cpp-example does all of that (and starts CUDA MPS when the ranks share a GPU). Ranks go to
// GPUs rank % (GPUs): ranks sharing one need MPS, or their kernels, which wait for each other,
// would take turns and never meet. Each rank prints PASS or FAIL; the exit status says the same.
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tdist/bootstrap.h"
#include "tdist/cuda_driver.h"
#include "tdist/device_sharing.h"
#include "tdist/error.h"
#include "tdist/prebuilt_kernel.h"
#include "tdist/runtime.h"
#include "tdist/signal_pad.h"

namespace {

constexpr const char* kKernel = "all_reduce_one_shot";
constexpr const char* kOp = "all_reduce_example";
constexpr int kNumel = 50000;  // not a whole number of tiles: the last one takes the masked path
constexpr int kCalls = 3;      // one epoch each; consecutive calls use the stage buffer's two halves
constexpr int kMaxPrograms = 128;  // program slots per rank in the signal pad (AllReduceContext's default)

std::string env(const char* name, const char* fallback = nullptr) {
  const char* value = std::getenv(name);
  if (value != nullptr) return value;
  if (fallback != nullptr) return fallback;
  throw std::runtime_error(std::string(name) + " is not set (see the comment at the top of all_reduce_example.cc)");
}

// Rank `rank`'s input of call `call`: small integers, whose sums fp32 holds exactly, different on
// every rank, element and call (a misplaced element or a stale half shows).
float input(int rank, int call, int i) { return static_cast<float>((i * 7 + rank * 13 + call * 5) % 251 - 125); }

CUdeviceptr address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// Makes the primary context of this rank's GPU current: NVSHMEM and the kernel's module bind to the
// context current at init. Never released: the runtime's wait-timeout report keeps pinned memory in
// it until the process exits.
CUdevice use_gpu(int rank, int world) {
  const tdist::CudaDriver& cuda = tdist::CudaDriver::get();
  int devices = 0;
  tdist::check_cuda(cuda.device_get_count(&devices), rank, kOp, "cuDeviceGetCount");
  TDIST_CHECK(devices > 0, rank, kOp, "no GPU is visible");
  CUdevice device = 0;
  CUcontext context = nullptr;
  tdist::check_cuda(cuda.device_get(&device, rank % devices), rank, kOp, "cuDeviceGet");
  tdist::check_cuda(cuda.device_primary_ctx_retain(&context, device), rank, kOp, "cuDevicePrimaryCtxRetain");
  tdist::check_cuda(cuda.ctx_set_current(context), rank, kOp, "cuCtxSetCurrent");
  TDIST_CHECK(world <= devices || tdist::mps_state(rank % devices, rank) != tdist::MpsState::kOff, rank, kOp,
              world << " ranks share " << devices << " GPU(s) without CUDA MPS; start the MPS control daemon "
                                                     "(scripts/cpp-example does) or use a GPU per rank");
  return device;
}

// Rank 0 listens at MASTER_ADDR:MASTER_PORT (an IPv4 address of its host), the others connect there.
std::unique_ptr<tdist::Bootstrap> connect(int rank, int world) {
  const std::string host = env("MASTER_ADDR", "127.0.0.1");
  const std::string port = env("MASTER_PORT");
  if (rank == 0) return tdist::TcpBootstrap::create_root(world, host, std::stoi(port));
  return tdist::TcpBootstrap::connect(rank, world, host + ":" + port);
}

// Runs kCalls AllReduces and checks each; true if every element of every call is exact.
bool all_reduce_and_check(tdist::Runtime& runtime, CUdevice device) {
  const tdist::CudaDriver& cuda = tdist::CudaDriver::get();
  const int rank = runtime.rank(), world = runtime.world_size();
  tdist::PrebuiltKernel all_reduce(env("TDIST_PREBUILT_DIR"), kKernel);

  // What the kernel was built for: the world, the tile and the signal layout it assumes.
  const tdist::PrebuiltManifest& manifest = all_reduce.manifest();
  TDIST_CHECK(manifest.constexpr_int("WORLD", kKernel, rank) == world && !manifest.param_types.empty() &&
                  manifest.param_types[0] == "*fp32", rank,
              kOp, "the prebuilt kernel is not for " << world << " ranks of fp32; run the prebuild tool with --world "
                                                     << world << " --dtype float32");
  const int block = static_cast<int>(manifest.constexpr_int("BLOCK", kKernel, rank));
  // The signal layout's stride (program slots per rank), an argument: any grid up to it works.
  const int max_programs = kMaxPrograms;
  const int tiles = (kNumel + block - 1) / block;

  // Collective: every rank allocates the same sizes in the same order. Peers read `stage` and set
  // `signals` (program p of rank r sets signal r * max_programs + p); x, out and the call counter
  // need not be symmetric, the heap is merely the allocator at hand.
  tdist::SymmetricHeap& heap = runtime.heap();
  const std::size_t bytes = kNumel * sizeof(float);
  auto x = heap.allocate(bytes, "x");
  auto out = heap.allocate(bytes, "out");
  auto stage = heap.allocate(2 * std::size_t(tiles) * block * sizeof(float), "stage (two halves)");
  // The call counter: the epoch of the last call, then the count of the running call's programs
  // that have entered. The kernel is its call: it runs at one past the epoch and its last program
  // to enter advances it (call_counter.enter_call), so the host zeroes it once, before the first.
  auto calls = heap.allocate(2 * sizeof(std::uint64_t), "call counter");
  tdist::SignalPad signals(heap, std::size_t(world) * max_programs, "all_reduce_example");

  // Signals start at 0 (epochs start at 1), on every rank before any rank's first signal lands;
  // so does the call counter.
  const std::vector<std::uint64_t> zeros(signals.size(), 0);
  tdist::check_cuda(cuda.memcpy_htod(address(signals.local()), zeros.data(), zeros.size() * sizeof(zeros[0])), rank,
                    kOp, "cuMemcpyHtoD");
  const std::uint64_t no_calls[2] = {0, 0};
  tdist::check_cuda(cuda.memcpy_htod(address(calls->local()), no_calls, sizeof(no_calls)), rank, kOp, "cuMemcpyHtoD");
  // A copy from pageable memory may return before it lands: it must have landed before any peer,
  // let through by the barrier, signals this pad.
  tdist::check_cuda(cuda.ctx_synchronize(), rank, kOp, "cuCtxSynchronize");
  runtime.barrier();

  // Every program waits for the same program of its peers, so all must be resident at once: at
  // most one per SM (under MPS, per SM of this rank's share).
  int sms = 0;
  tdist::check_cuda(cuda.device_get_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), rank, kOp,
                    "cuDeviceGetAttribute");
  // Program p waits for program p of every peer: every rank must launch the same grid, so all take
  // the smallest share any rank has (MPS shares, mixed GPUs).
  for (const std::string& theirs : runtime.bootstrap().allgather(std::to_string(sms))) {
    sms = std::min(sms, std::stoi(theirs));
  }
  const unsigned programs = static_cast<unsigned>(std::min({tiles, max_programs, sms}));

  CUstream stream = nullptr;  // the default stream
  std::vector<float> host(kNumel);
  long wrong = 0;
  // Every rank makes every call, whatever it found: a rank that stopped early would leave its peers
  // waiting for its signals until their wait timeout.
  for (int call = 0; call < kCalls; ++call) {
    for (int i = 0; i < kNumel; ++i) host[i] = input(rank, call, i);
    tdist::check_cuda(cuda.memcpy_htod(address(x->local()), host.data(), bytes), rank, kOp, "cuMemcpyHtoD");
    all_reduce.launch({programs, 1, 1}, stream,
                      {tdist::pointer_arg(x->local()), tdist::pointer_arg(out->local()),
                       tdist::pointer_arg(stage->local()), tdist::pointer_arg(signals.local()), tdist::i32_arg(kNumel),
                       tdist::pointer_arg(calls->local()), tdist::i32_arg(tiles), tdist::i32_arg(max_programs)});
    tdist::check_cuda(cuda.ctx_synchronize(), rank, kOp, "cuCtxSynchronize (the kernel failed)");
    tdist::check_cuda(cuda.memcpy_dtoh(host.data(), address(out->local()), bytes), rank, kOp, "cuMemcpyDtoH");
    for (int i = 0; i < kNumel; ++i) {
      float expected = 0;
      for (int r = 0; r < world; ++r) expected += input(r, call, i);
      if (host[i] != expected && wrong++ == 0) {
        std::printf("rank %d: call %d: out[%d] = %g, expected %g\n", rank, call, i, host[i], expected);
      }
    }
  }
  std::printf("rank %d: %s %s of %d fp32 over %d ranks, %d calls, %u programs (%ld wrong)\n", rank,
              wrong == 0 ? "PASS" : "FAIL", kKernel, kNumel, world, kCalls, programs, wrong);
  return wrong == 0;
}

}  // namespace

int main() {
  int rank = -1;
  try {
    rank = std::stoi(env("RANK"));
    const int world = std::stoi(env("WORLD_SIZE"));
    const CUdevice device = use_gpu(rank, world);
    tdist::RuntimeOptions options;
    options.heap_bytes = 64ull << 20;
    options.nvshmem_library_dir = env("TDIST_NVSHMEM_LIBRARY_DIR", "");
    tdist::Runtime& runtime = tdist::Runtime::init(connect(rank, world), options);
    const bool passed = all_reduce_and_check(runtime, device);
    tdist::Runtime::finalize();  // collective: after every rank's last call
    return passed ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: FAIL: %s\n", rank, error.what());
    return 1;
  }
}
