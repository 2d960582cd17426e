#include "tdist/nvshmem_backend.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "tdist/cuda_driver.h"
#include "tdist/error.h"
#include "tdist/nvshmem_session.h"
#include "tdist/shared_library.h"

namespace tdist {
namespace {

// NVSHMEM 3.x host ABI, from its public headers (nvshmem_uniqueid.h, nvshmem_types.h). Only the
// unique-id path is used; versions are stamped as NVSHMEM's own initialisers do.
struct UniqueId {
  int version = (1 << 16) + 128;
  char internal[124] = {};
};
static_assert(sizeof(UniqueId) == 128);

struct UniqueIdArgs {
  int version;
  UniqueId* id;
  int myrank;
  int nranks;
};
static_assert(sizeof(UniqueIdArgs) == 24);

struct InitArgs {
  int version;
  UniqueIdArgs uid_args;
  char content[96];
};
static_assert(sizeof(InitArgs) == 128);

struct InitAttr {
  int version;
  void* mpi_comm;
  InitArgs args;
};
static_assert(sizeof(InitAttr) == 144);

InitAttr make_init_attr() {
  InitAttr attr{};
  attr.version = (1 << 16) + sizeof(InitAttr);
  attr.args.version = (1 << 16) + sizeof(InitArgs);
  attr.args.uid_args.version = (1 << 16) + sizeof(UniqueIdArgs);
  attr.args.uid_args.myrank = -1;
  attr.args.uid_args.nranks = -1;
  return attr;
}

// The instance this process brought up and, with keep_between_inits, kept past finalize()
// (nvshmem_session.h). Only init() and finalize() touch it, under the runtime's lock.
std::optional<NvshmemSession> g_session;
// Whether this process has brought NVSHMEM up before (plan_nvshmem_start's rule for keeping).
bool g_brought_up_before = false;

constexpr unsigned kInitWithUniqueId = 1u << 3;  // NVSHMEMX_INIT_WITH_UNIQUEID
constexpr int kStatusInitialized = 2;             // NVSHMEM_STATUS_IS_INITIALIZED

// NVSHMEM takes its heap size, NVLS and NCCL switches only from the environment, read once at
// init, so these are set here, just before init, and nowhere else.
void configure_environment(std::size_t heap_bytes, int rank) {
  // NVLink multicast must stay off on shared machines: it can take the host's GPUs out of
  // service. Overwrite whatever the caller had.
  setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
  // NVSHMEM builds an NCCL communicator per init for host collectives that triton_dist does not
  // use (it calls only the barrier, NVSHMEM's own kernel): NCCL refuses two ranks on one GPU
  // (MPS), and under compute-sanitizer its kernel probe reports API errors (no kernel image). A
  // caller who wants NVSHMEM's NCCL path sets NVSHMEM_DISABLE_NCCL=0 first.
  setenv("NVSHMEM_DISABLE_NCCL", "1", 0);
  // NVSHMEM keeps a little of its heap for itself (team and collective scratch).
  const std::size_t wanted = heap_bytes + (256ull << 20);
  // The value an earlier bring-up of this process set is ours to replace, not the caller's.
  static std::string set_by_us;
  const char* user = std::getenv("NVSHMEM_SYMMETRIC_SIZE");
  if (user != nullptr && set_by_us != user) {
    char* end = nullptr;
    const unsigned long long given = std::strtoull(user, &end, 10);
    const bool plain_number = end != user && *end == '\0';
    TDIST_CHECK(!plain_number || given >= wanted, rank, "init",
                "NVSHMEM_SYMMETRIC_SIZE=" << user << " is smaller than the " << wanted
                                          << " B the triton_dist heap needs; unset it and set "
                                             "TRITON_DIST_SYMMETRIC_HEAP_SIZE instead");
    return;
  }
  set_by_us = std::to_string(wanted);
  setenv("NVSHMEM_SYMMETRIC_SIZE", set_by_us.c_str(), 1);
}

}  // namespace

struct NvshmemBackend::Api {
  std::unique_ptr<SharedLibrary> library;
  int (*get_uniqueid)(UniqueId*);
  int (*set_attr_uniqueid_args)(int, int, const UniqueId*, InitAttr*);
  int (*hostlib_init_attr)(unsigned, InitAttr*);
  void (*hostlib_finalize)();
  int (*init_status)();
  int (*my_pe)();
  int (*n_pes)();
  void* (*malloc)(std::size_t);
  void (*free)(void*);
  void* (*ptr)(const void*, int);
  void (*barrier_all_on_stream)(CUstream);
  int (*cumodule_init)(CUmodule);
  int (*cumodule_finalize)(CUmodule);
};

NvshmemBackend::NvshmemBackend(Bootstrap& bootstrap, const NvshmemOptions& options)
    : bootstrap_(bootstrap), api_(std::make_unique<Api>()) {
  const int rank = bootstrap.rank();
  std::vector<std::string> candidates;
  if (!options.library_dir.empty()) {
    candidates.push_back(options.library_dir + "/libnvshmem_host.so.3");
  }
  candidates.push_back("libnvshmem_host.so.3");
  api_->library = std::make_unique<SharedLibrary>(
      candidates,
      "NVSHMEM's host library is missing: pip install nvidia-nvshmem-cu13 (3.4 or newer).",
      /*global_symbols=*/true);
  const SharedLibrary& lib = *api_->library;
  lib.bind(api_->get_uniqueid, "nvshmemx_get_uniqueid");
  lib.bind(api_->set_attr_uniqueid_args, "nvshmemx_set_attr_uniqueid_args");
  // The hostlib_* entry points are the ones the shared library exports; the inline
  // nvshmemx_init_attr of the headers needs the static device library.
  lib.bind(api_->hostlib_init_attr, "nvshmemx_hostlib_init_attr");
  lib.bind(api_->hostlib_finalize, "nvshmemx_hostlib_finalize");
  lib.bind(api_->init_status, "nvshmemx_init_status");
  lib.bind(api_->my_pe, "nvshmem_my_pe");
  lib.bind(api_->n_pes, "nvshmem_n_pes");
  lib.bind(api_->malloc, "nvshmem_malloc");
  lib.bind(api_->free, "nvshmem_free");
  lib.bind(api_->ptr, "nvshmem_ptr");
  lib.bind(api_->barrier_all_on_stream, "nvshmemx_barrier_all_on_stream");
  lib.bind(api_->cumodule_init, "nvshmemx_cumodule_init");
  lib.bind(api_->cumodule_finalize, "nvshmemx_cumodule_finalize");

  const std::string members = join_members(bootstrap.allgather(this_process_member()));
  const NvshmemPlan plan = plan_nvshmem_start(g_session, members, options.heap_bytes,
                                              options.keep_between_inits, g_brought_up_before);
  const NvshmemStart start = plan.start;
  // Every rank must take the same path (bring-up and take-down are collective), finalize() the
  // same way, and hear of any rank's refusal.
  const std::string refused = "refused: ";
  const std::string mine = plan.refusal.empty() ? std::to_string(static_cast<int>(start)) + "/" +
                                                      std::to_string(options.keep_between_inits)
                                                : refused + plan.refusal;
  const std::vector<std::string> plans = bootstrap.allgather(mine);
  for (std::size_t peer = 0; peer < plans.size(); ++peer) {
    TDIST_CHECK(plans[peer].rfind(refused, 0) != 0, rank, "init",
                "rank " << peer << " cannot start NVSHMEM: " << plans[peer].substr(refused.size()));
  }
  for (const std::string& peer : plans) {
    TDIST_CHECK(peer == mine, rank, "init",
                "ranks disagree on whether to reuse the NVSHMEM instance kept from an earlier "
                "init() (their heap sizes or keep_nvshmem settings differ); pass the same to every rank");
  }
  if (start == NvshmemStart::kReinitialise) {
    api_->hostlib_finalize();
    g_session.reset();
  }
  if (start != NvshmemStart::kReuse) {
    g_brought_up_before = true;  // even should the bring-up fail: NVSHMEM's state is touched
    bring_up(options.heap_bytes);
    g_session = NvshmemSession{members, options.heap_bytes, false};
  }
  // In use from here: should the check below fail, no later init() may reuse this instance.
  g_session->in_use = true;
  TDIST_CHECK(api_->my_pe() == rank && api_->n_pes() == bootstrap.world_size(), rank, "init",
              "NVSHMEM numbered this rank " << api_->my_pe() << " of " << api_->n_pes()
                                            << " but the bootstrap says " << rank << " of "
                                            << bootstrap.world_size());
  keep_between_inits_ = options.keep_between_inits;
}

void NvshmemBackend::bring_up(std::size_t heap_bytes) {
  const int rank = bootstrap_.rank();
  TDIST_CHECK(api_->init_status() < kStatusInitialized, rank, "init",
              "NVSHMEM is already initialised in this process (by torch or another library); "
              "triton_dist must own NVSHMEM's initialisation");
  configure_environment(heap_bytes, rank);

  UniqueId uid;
  if (rank == 0) {
    TDIST_CHECK(api_->get_uniqueid(&uid) == 0, rank, "init", "nvshmemx_get_uniqueid failed");
  }
  std::string shared = bootstrap_.broadcast(
      std::string(reinterpret_cast<const char*>(&uid), sizeof(uid)), /*root=*/0);
  TDIST_CHECK(shared.size() == sizeof(uid), rank, "init",
              "received an NVSHMEM unique id of " << shared.size() << " B, expected " << sizeof(uid));
  std::memcpy(&uid, shared.data(), sizeof(uid));

  InitAttr attr = make_init_attr();
  TDIST_CHECK(api_->set_attr_uniqueid_args(rank, bootstrap_.world_size(), &uid, &attr) == 0, rank,
              "init", "nvshmemx_set_attr_uniqueid_args failed");
  TDIST_CHECK(api_->hostlib_init_attr(kInitWithUniqueId, &attr) == 0, rank, "init",
              "NVSHMEM initialisation failed (its own messages above say why); check that each "
              "rank uses a different GPU and that NVSHMEM_* variables are not set for another "
              "bootstrap");
}

NvshmemBackend::~NvshmemBackend() {
  // Not finalized explicitly (interpreter exit without finalize()): finalizing is collective and
  // could hang on a peer that already exited, so the process's teardown reclaims everything.
}

void* NvshmemBackend::reserve(std::size_t bytes) {
  TDIST_CHECK(base_ == nullptr, bootstrap_.rank(), "reserve", "the heap is already reserved");
  base_ = api_->malloc(bytes);
  return base_;
}

void* NvshmemBackend::peer_base(int pe) { return api_->ptr(base_, pe); }

void NvshmemBackend::barrier_all_on_stream(CUstream stream) {
  api_->barrier_all_on_stream(stream);
}

bool NvshmemBackend::initialize_module(CUmodule module, const ModulePtx& ptx) {
  // Modules that did not link NVSHMEM's device library have no device state to set up.
  constexpr const char* kDeviceState = "nvshmemi_device_state_d";
  if (!ptx.may_declare(kDeviceState)) return false;
  CUdeviceptr state = 0;
  std::size_t size = 0;
  CUresult found = CudaDriver::get().module_get_global(&state, &size, module, kDeviceState);
  if (found == CUDA_ERROR_NOT_FOUND) return false;
  check_cuda(found, bootstrap_.rank(), "initialize_module", "cuModuleGetGlobal");
  TDIST_CHECK(api_->cumodule_init(module) == 0, bootstrap_.rank(), "initialize_module",
              "nvshmemx_cumodule_init failed; was the kernel linked against the bitcode of the "
              "same NVSHMEM version as " << library_path() << "?");
  return true;
}

void NvshmemBackend::finalize_module(CUmodule module) {
  TDIST_CHECK(api_->cumodule_finalize(module) == 0, bootstrap_.rank(), "finalize_module",
              "nvshmemx_cumodule_finalize failed; unload the module only while the runtime that set it up "
              "is initialised");
}

void NvshmemBackend::finalize() {
  if (finalized_) return;
  finalized_ = true;
  if (base_ != nullptr) api_->free(base_);
  base_ = nullptr;
  g_session->in_use = false;
  if (keep_between_inits_) return;  // the next init() of the same processes reuses it
  api_->hostlib_finalize();
  g_session.reset();
}

std::string NvshmemBackend::library_path() const { return api_->library->path(); }

}  // namespace tdist
