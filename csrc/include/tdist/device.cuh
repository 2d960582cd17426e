// Device primitives of triton_dist for CUDA C++ kernels: the signalling model of
// triton_dist.language (rank queries, symm_at, wait, notify) and its memory-model helpers
// (ld/st/fence/atomics with an explicit scope and semantic), as inline PTX.
//
// Header-only; needs sm_70 or newer (scoped acquire/release instructions), written for sm_90.
//
// The model: a producer finishes a tile's stores, then publishes with a release operation at the
// scope the consumer lives in (sys across GPUs, gpu on the same GPU); the consumer spins with
// acquire loads until the signal reaches the expected value (a per-call epoch, so signal pads
// never need resetting), and only then reads the tile.
//
// Read data published through a signal with ordinary (or ld<..>) loads, never through __ldg or a
// `const __restrict__` pointer the compiler may turn into ld.global.nc: the non-coherent
// read-only path is outside the memory model and may return data older than the acquire.
//
// Every asm statement here is `volatile` with a "memory" clobber: the compiler must neither drop a
// spin load nor move ordinary loads and stores across an acquire/release, since the hardware
// ordering that these instructions give would be worthless if the compiler reordered around them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

namespace tdist {
namespace device {

/// The most ranks a SymmetricMap describes.
constexpr int kMaxRanks = 64;

/// Which threads an ordering operation must be coherent with: this CTA, this GPU, or the whole
/// system (other GPUs over NVLink/PCIe, and the host).
enum class Scope { cta, gpu, sys };

/// Ordering semantics. `volatile_` is PTX `.volatile` (a relaxed sys-scope access in the memory
/// model, kept for legacy code); `acquire` is for loads and atomics, `release` for stores and
/// atomics, `acq_rel` for atomics only.
enum class Semantic { relaxed, acquire, release, acq_rel, volatile_ };

/// How notify() updates a signal: overwrite it, or add to it.
enum class SignalOp { set, add };

/// Where every rank's symmetric heap is mapped in this process. Built on the host by
/// triton_dist.device_map.symmetric_map_bytes() and passed BY VALUE as a kernel argument (520
/// bytes), so reading it costs constant-bank loads and no global memory traffic.
struct SymmetricMap {
  /// base[pe]: address of rank pe's heap start in this process; 0 when pe cannot be reached with
  /// loads and stores (another node).
  std::uint64_t base[kMaxRanks];
  /// This rank.
  int rank;
  /// Number of ranks (at most kMaxRanks).
  int world_size;
};
// triton_dist/device_map.py builds these bytes with ctypes: keep the layout in step.
static_assert(sizeof(SymmetricMap) == 8 * kMaxRanks + 8,
              "SymmetricMap layout is shared with Python");
static_assert(offsetof(SymmetricMap, rank) == 8 * kMaxRanks,
              "SymmetricMap layout is shared with Python");
static_assert(offsetof(SymmetricMap, world_size) == 8 * kMaxRanks + 4,
              "SymmetricMap layout is shared with Python");

namespace detail {

template <class To, class From>
__device__ __forceinline__ To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To to;
  memcpy(&to, &from, sizeof(To));  // folds to a register move
  return to;
}

template <class T>
struct Bits {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "only 32- and 64-bit values are supported");
  using type = typename std::conditional<sizeof(T) == 4, std::uint32_t, std::uint64_t>::type;
};

// One PTX instruction per (scope, semantic) pair: PTX takes them as part of the opcode, so the
// string must be a literal; these macros spell each combination once.
#define TDIST_SCOPED(MACRO, SEM, ...)            \
  if constexpr (S == Scope::cta) {               \
    MACRO(SEM ".cta" __VA_OPT__(, ) __VA_ARGS__) \
  } else if constexpr (S == Scope::gpu) {        \
    MACRO(SEM ".gpu" __VA_OPT__(, ) __VA_ARGS__) \
  } else {                                       \
    MACRO(SEM ".sys" __VA_OPT__(, ) __VA_ARGS__) \
  }

// B (std::uint32_t or std::uint64_t) picks the width; the register constraint ("r" or "l") must
// be a literal too, so each macro spells both widths once.
#define TDIST_LD_ASM(QUAL)                                                          \
  if constexpr (sizeof(B) == 4) {                                                   \
    asm volatile("ld." QUAL ".global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); \
  } else {                                                                          \
    asm volatile("ld." QUAL ".global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); \
  }
#define TDIST_ST_ASM(QUAL)                                                          \
  if constexpr (sizeof(B) == 4) {                                                   \
    asm volatile("st." QUAL ".global.b32 [%0], %1;" : : "l"(p), "r"(v) : "memory"); \
  } else {                                                                          \
    asm volatile("st." QUAL ".global.b64 [%0], %1;" : : "l"(p), "l"(v) : "memory"); \
  }
// OP is "add" (KIND "u") or "exch" (KIND "b").
#define TDIST_ATOM_ASM(QUAL, OP, KIND)                                  \
  if constexpr (sizeof(B) == 4) {                                       \
    asm volatile("atom." QUAL ".global." OP "." KIND "32 %0, [%1], %2;" \
                 : "=r"(old)                                            \
                 : "l"(p), "r"(v)                                       \
                 : "memory");                                           \
  } else {                                                              \
    asm volatile("atom." QUAL ".global." OP "." KIND "64 %0, [%1], %2;" \
                 : "=l"(old)                                            \
                 : "l"(p), "l"(v)                                       \
                 : "memory");                                           \
  }
#define TDIST_CAS_ASM(QUAL)                                       \
  if constexpr (sizeof(B) == 4) {                                 \
    asm volatile("atom." QUAL ".global.cas.b32 %0, [%1], %2, %3;" \
                 : "=r"(old)                                      \
                 : "l"(p), "r"(cmp), "r"(v)                       \
                 : "memory");                                     \
  } else {                                                        \
    asm volatile("atom." QUAL ".global.cas.b64 %0, [%1], %2, %3;" \
                 : "=l"(old)                                      \
                 : "l"(p), "l"(cmp), "l"(v)                       \
                 : "memory");                                     \
  }

template <Scope S, Semantic M, class B>
__device__ __forceinline__ B ld_bits(const void* p) {
  B v;
  if constexpr (M == Semantic::volatile_) {
    TDIST_LD_ASM("volatile")
  } else if constexpr (M == Semantic::relaxed) {
    TDIST_SCOPED(TDIST_LD_ASM, "relaxed")
  } else {
    TDIST_SCOPED(TDIST_LD_ASM, "acquire")
  }
  return v;
}

template <Scope S, Semantic M, class B>
__device__ __forceinline__ void st_bits(void* p, B v) {
  if constexpr (M == Semantic::volatile_) {
    TDIST_ST_ASM("volatile")
  } else if constexpr (M == Semantic::relaxed) {
    TDIST_SCOPED(TDIST_ST_ASM, "relaxed")
  } else {
    TDIST_SCOPED(TDIST_ST_ASM, "release")
  }
}

// Every atomic semantic; MACRO is TDIST_ATOM_ASM or TDIST_CAS_ASM.
#define TDIST_ATOMIC_BODY(MACRO, ...)                         \
  if constexpr (M == Semantic::relaxed) {                     \
    TDIST_SCOPED(MACRO, "relaxed" __VA_OPT__(, ) __VA_ARGS__) \
  } else if constexpr (M == Semantic::acquire) {              \
    TDIST_SCOPED(MACRO, "acquire" __VA_OPT__(, ) __VA_ARGS__) \
  } else if constexpr (M == Semantic::release) {              \
    TDIST_SCOPED(MACRO, "release" __VA_OPT__(, ) __VA_ARGS__) \
  } else {                                                    \
    TDIST_SCOPED(MACRO, "acq_rel" __VA_OPT__(, ) __VA_ARGS__) \
  }

template <Scope S, Semantic M, class B>
__device__ __forceinline__ B atom_add_bits(void* p, B v) {
  B old;
  TDIST_ATOMIC_BODY(TDIST_ATOM_ASM, "add", "u")
  return old;
}
template <Scope S, Semantic M, class B>
__device__ __forceinline__ B atom_exch_bits(void* p, B v) {
  B old;
  TDIST_ATOMIC_BODY(TDIST_ATOM_ASM, "exch", "b")
  return old;
}
template <Scope S, Semantic M, class B>
__device__ __forceinline__ B atom_cas_bits(void* p, B cmp, B v) {
  B old;
  TDIST_ATOMIC_BODY(TDIST_CAS_ASM)
  return old;
}

#undef TDIST_ATOMIC_BODY
#undef TDIST_CAS_ASM
#undef TDIST_ATOM_ASM
#undef TDIST_ST_ASM
#undef TDIST_LD_ASM
#undef TDIST_SCOPED

template <Semantic M>
constexpr bool is_load_semantic =
    M == Semantic::relaxed || M == Semantic::acquire || M == Semantic::volatile_;
template <Semantic M>
constexpr bool is_store_semantic =
    M == Semantic::relaxed || M == Semantic::release || M == Semantic::volatile_;
template <Semantic M>
constexpr bool is_atomic_semantic = M != Semantic::volatile_;

// The spin load of wait(): a runtime scope, resolved once per call site when inlined.
__device__ __forceinline__ std::uint64_t ld_acquire_u64(const std::uint64_t* p, Scope scope) {
  std::uint64_t v;
  switch (scope) {
    case Scope::cta:
      asm volatile("ld.acquire.cta.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
      break;
    case Scope::gpu:
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
      break;
    default:
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
      break;
  }
  return v;
}

// %globaltimer: a nanosecond wall clock common to all SMs (unlike clock64, which counts this
// SM's cycles and changes rate with clock boosting), so a timeout means the same on every GPU.
__device__ __forceinline__ std::uint64_t globaltimer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Out of line so the spin loop stays small; never returns.
static __device__ __noinline__ void report_timeout(int rank, std::uint64_t timeout_ns, int index,
                                                   const std::uint64_t* signal,
                                                   std::uint64_t expected, std::uint64_t observed) {
  printf(
      "triton_dist: rank %d: wait timed out after %llu ns on signal %d at %p: "
      "expected >= %llu, observed %llu\n",
      rank, static_cast<unsigned long long>(timeout_ns), index, static_cast<const void*>(signal),
      static_cast<unsigned long long>(expected), static_cast<unsigned long long>(observed));
  __trap();
}

__device__ __forceinline__ bool is_thread0() {
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

}  // namespace detail

/// This rank. Any thread.
__device__ __forceinline__ int rank(const SymmetricMap& map) { return map.rank; }

/// Number of ranks. Any thread.
__device__ __forceinline__ int num_ranks(const SymmetricMap& map) { return map.world_size; }

/// `ptr` (an address in this rank's symmetric heap) as rank `pe` holds it in this process, for
/// loads, stores and atomics; traps with a message if `pe` is out of range or on another node.
/// Any thread.
template <class T>
__device__ __forceinline__ T* symm_at(T* ptr, int pe, const SymmetricMap& map) {
  if (pe < 0 || pe >= map.world_size || pe >= kMaxRanks || map.base[pe] == 0) {
    printf(
        "triton_dist: rank %d: symm_at: rank %d cannot be reached with loads and stores "
        "(world size %d; another node, or out of range)\n",
        map.rank, pe, map.world_size);
    __trap();
  }
  const std::uint64_t offset = reinterpret_cast<std::uint64_t>(ptr) - map.base[map.rank];
  return reinterpret_cast<T*>(map.base[pe] + offset);
}

/// Load `*p` with `ld.M.S` (M: relaxed, acquire or volatile_); 32- or 64-bit T. Any thread.
template <Scope S, Semantic M = Semantic::acquire, class T>
__device__ __forceinline__ T ld(const T* p) {
  static_assert(detail::is_load_semantic<M>, "ld: semantic must be relaxed, acquire or volatile_");
  using B = typename detail::Bits<T>::type;
  return detail::bit_cast<T>(detail::ld_bits<S, M, B>(p));
}

/// Store `v` to `*p` with `st.M.S` (M: relaxed, release or volatile_); 32- or 64-bit T.
/// A release store orders only the calling thread's earlier accesses: call cta_barrier() first
/// when other threads wrote the data it publishes. Any thread.
template <Scope S, Semantic M = Semantic::release, class T>
__device__ __forceinline__ void st(T* p, T v) {
  static_assert(detail::is_store_semantic<M>, "st: semantic must be relaxed, release or volatile_");
  using B = typename detail::Bits<T>::type;
  detail::st_bits<S, M, B>(p, detail::bit_cast<B>(v));
}

/// `fence.acq_rel.S`: the calling thread's accesses before it are ordered before its accesses
/// after it, as observed at scope S. Any thread.
template <Scope S>
__device__ __forceinline__ void fence() {
  if constexpr (S == Scope::cta) {
    asm volatile("fence.acq_rel.cta;" ::: "memory");
  } else if constexpr (S == Scope::gpu) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  } else {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
  }
}

/// Atomically `*p += v` (`atom.M.S.global.add`); returns the old value. Integer T of 32 or
/// 64 bits. Any thread.
template <Scope S, Semantic M, class T>
__device__ __forceinline__ T atomic_add(T* p, T v) {
  static_assert(detail::is_atomic_semantic<M>, "atomics take relaxed, acquire, release or acq_rel");
  static_assert(std::is_integral<T>::value, "atomic_add: integer types only");
  using B = typename detail::Bits<T>::type;
  return detail::bit_cast<T>(detail::atom_add_bits<S, M, B>(p, detail::bit_cast<B>(v)));
}

/// Atomically exchange `*p` with `v` (`atom.M.S.global.exch`); returns the old value. Any
/// thread.
template <Scope S, Semantic M, class T>
__device__ __forceinline__ T atomic_xchg(T* p, T v) {
  static_assert(detail::is_atomic_semantic<M>, "atomics take relaxed, acquire, release or acq_rel");
  using B = typename detail::Bits<T>::type;
  return detail::bit_cast<T>(detail::atom_exch_bits<S, M, B>(p, detail::bit_cast<B>(v)));
}

/// Atomically `if (*p == compare) *p = v` (`atom.M.S.global.cas`); returns the old value.
/// Any thread.
template <Scope S, Semantic M, class T>
__device__ __forceinline__ T atomic_cas(T* p, T compare, T v) {
  static_assert(detail::is_atomic_semantic<M>, "atomics take relaxed, acquire, release or acq_rel");
  using B = typename detail::Bits<T>::type;
  return detail::bit_cast<T>(
      detail::atom_cas_bits<S, M, B>(p, detail::bit_cast<B>(compare), detail::bit_cast<B>(v)));
}

/// This thread's index in its CTA along x. Any thread.
__device__ __forceinline__ int tid() { return static_cast<int>(threadIdx.x); }

/// This thread's lane in its warp (0..31). Any thread.
__device__ __forceinline__ int laneid() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

/// Barrier of all threads of the CTA (`bar.sync 0`), which also orders their memory accesses at
/// CTA scope. Every thread of the CTA, none may have exited.
__device__ __forceinline__ void cta_barrier() { __syncthreads(); }

/// Spin until each of the `num_signals` uint64 signals at `signals` is >= `value`, with
/// `ld.acquire.SCOPE` (`scope`: where the notifier lives, sys for a peer GPU); on return the
/// calling thread may read what the notifiers published. `timeout_ns` == 0 waits forever;
/// otherwise the kernel prints rank `rank`, the signal and the values, and traps. Calling thread
/// only (any number of threads may call it).
__device__ __forceinline__ void wait(const std::uint64_t* signals, int num_signals,
                                     std::uint64_t value, Scope scope, std::uint64_t timeout_ns,
                                     int rank) {
  // The clock is started at the first load that fails, and read only after failed loads: a
  // signal that is already set costs exactly one load. One deadline covers all signals.
  std::uint64_t start = 0;
  bool started = false;
  for (int i = 0; i < num_signals; ++i) {
    const std::uint64_t* signal = signals + i;
    std::uint64_t seen;
    while ((seen = detail::ld_acquire_u64(signal, scope)) < value) {
      if (timeout_ns == 0) continue;
      const std::uint64_t now = detail::globaltimer_ns();
      if (!started) {
        start = now;
        started = true;
      } else if (now - start > timeout_ns) {
        detail::report_timeout(rank, timeout_ns, i, signal, value, seen);
      }
    }
  }
}

/// wait() taking the rank for its timeout message from `map`. Calling thread only.
__device__ __forceinline__ void wait(const std::uint64_t* signals, int num_signals,
                                     std::uint64_t value, Scope scope, std::uint64_t timeout_ns,
                                     const SymmetricMap& map) {
  wait(signals, num_signals, value, scope, timeout_ns, map.rank);
}

/// wait() for a whole CTA: thread 0 spins, then a CTA barrier; on return every thread may read
/// what the notifiers published. Every thread of the CTA must call it.
__device__ __forceinline__ void wait_block(const std::uint64_t* signals, int num_signals,
                                           std::uint64_t value, Scope scope,
                                           std::uint64_t timeout_ns, int rank) {
  // Why one spinning thread is enough: in the PTX memory model the notifier's release
  // synchronizes-with thread 0's acquire load that observes it, and thread 0's bar.sync
  // synchronizes-with every other thread's bar.sync of the same barrier. Causality order is
  // transitive across these edges (the same chain cooperative groups' grid.sync relies on), so
  // the producer's writes happen-before each thread's loads after the barrier. The barrier is
  // also a compiler barrier, so no load is hoisted above it. One spinner instead of all threads
  // keeps the polling traffic to one load per CTA per iteration.
  if (detail::is_thread0()) wait(signals, num_signals, value, scope, timeout_ns, rank);
  __syncthreads();
}

/// wait_block() taking the rank for its timeout message from `map`. Every thread of the CTA.
__device__ __forceinline__ void wait_block(const std::uint64_t* signals, int num_signals,
                                           std::uint64_t value, Scope scope,
                                           std::uint64_t timeout_ns, const SymmetricMap& map) {
  wait_block(signals, num_signals, value, scope, timeout_ns, map.rank);
}

/// Publish `value` to the uint64 signal at `signal` (an address in this rank's heap) on rank
/// `pe`: a release atomic (exch for set, add for add) at sys scope, or gpu scope when `pe` is this
/// rank. Covers only the calling thread's earlier stores (see notify_block). One calling thread.
__device__ __forceinline__ void notify(std::uint64_t* signal, int pe, std::uint64_t value,
                                       SignalOp op, const SymmetricMap& map) {
  // A consumer on this GPU is inside gpu scope, and a gpu-scope release is cheaper than a
  // sys-scope one (no need to order against the NVLink/PCIe fabric); a peer GPU is only inside
  // sys scope. The release makes this thread's earlier writes (including remote stores through
  // symm_at) visible to whoever acquires the signal value.
  if (pe == map.rank) {
    if (op == SignalOp::set) {
      atomic_xchg<Scope::gpu, Semantic::release>(signal, value);
    } else {
      atomic_add<Scope::gpu, Semantic::release>(signal, value);
    }
  } else {
    std::uint64_t* remote = symm_at(signal, pe, map);
    if (op == SignalOp::set) {
      atomic_xchg<Scope::sys, Semantic::release>(remote, value);
    } else {
      atomic_add<Scope::sys, Semantic::release>(remote, value);
    }
  }
}

/// notify() on behalf of the whole CTA: a CTA barrier, then thread 0 notifies, so every thread's
/// earlier stores are published. Every thread of the CTA must call it.
__device__ __forceinline__ void notify_block(std::uint64_t* signal, int pe, std::uint64_t value,
                                             SignalOp op, const SymmetricMap& map) {
  // A release covers what happens-before it. Other threads' stores reach thread 0's release only
  // through the bar.sync (synchronizes-with at CTA scope, then cumulativity carries them into the
  // sys-scope release). Without the barrier thread 0 could publish before they have stored.
  __syncthreads();
  if (detail::is_thread0()) notify(signal, pe, value, op, map);
}

}  // namespace device
}  // namespace tdist
