// A compiled Triton kernel launched by cuLaunchKernelEx from a parameter block laid out once.
//
// Triton's own launch path re-derives the kernel's specialisation from every argument in Python
// and then calls a generated C launcher: 6-13 µs of host time per kernel on the GPU machine,
// against 3-4 µs for the driver call alone (issue 21). A KernelLauncher is built once per loaded
// variant from the rules Triton specialised it under (each parameter's type, 16-divisibility, the
// runtime arguments it folded into constants); a call only checks each value against its rule and
// writes it into its fixed slot. A value that breaks a rule (a misaligned pointer, an integer past
// the 32-bit range, a different constant) would need another variant: pack() says so and the
// caller takes Triton's path, which compiles or finds it. Launching a less specialised variant
// than Triton would pick (an integer divisible by 16, or equal to 1, for a parameter compiled
// without that assumption) is correct, so only the assumptions a variant made are checked.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tdist {

// What one runtime argument of a Triton kernel is to the compiled variant.
enum class ParamKind : std::uint8_t {
  kPointer,   // a device address (Triton's "*fp32", "*bf16", ...): 8 bytes
  kInt1,      // "i1": 1 byte, 0 or 1
  kInt8,      // "i8"
  kInt16,     // "i16"
  kInt32,     // "i32"
  kInt64,     // "i64"
  kUInt8,     // "u8"
  kUInt16,    // "u16"
  kUInt32,    // "u32"
  kUInt64,    // "u64"
  kFloat32,   // "fp32": passed as float
  kFloat64,   // "fp64"
  kConstant,  // folded into the variant (an integer Triton specialised to a value): no slot
  kTensorMap,  // a host tensor descriptor Triton lowered to TMA ("tensordesc<...>"): a CUtensorMap
               // parameter encoded per call, then its shape (i32 each) and strides (i64 each)
};

// Up to this many dimensions per tensor descriptor (TMA's limit).
inline constexpr std::size_t kMaxTensorMapRank = 5;

// How a variant encodes one tensor descriptor: Triton's compiled metadata for it
// (``tensordesc_meta``: swizzle, element size and type, the TMA box, which may be smaller than the
// descriptor's block, and fp4 padding) and its rank.
struct TensorMapRule {
  unsigned rank = 2;                                 // dimensions
  unsigned element_type = 0;                         // CUtensorMapDataType (the host enum)
  unsigned element_bytes = 2;                        // bytes per element
  unsigned swizzle = 0;                              // CUtensorMapSwizzle
  std::uint32_t box[kMaxTensorMapRank] = {};         // the TMA box, outermost dimension first
  bool fp4_padded = false;                           // the innermost dimension counts twice
};

// What cuTensorMapEncodeTiled receives for a descriptor (dimensions innermost first, as the
// driver takes them), derived from the rule and the call's descriptor by tensor_map_encoding().
struct TensorMapEncoding {
  unsigned rank = 0;                                   // dimensions
  unsigned element_type = 0;                           // CUtensorMapDataType
  std::uint64_t dims[kMaxTensorMapRank] = {};          // innermost first
  std::uint64_t stride_bytes[kMaxTensorMapRank] = {};  // of dimensions 1.. (rank - 1 entries)
  std::uint32_t box[kMaxTensorMapRank] = {};           // innermost first
  std::uint32_t element_strides[kMaxTensorMapRank] = {1, 1, 1, 1, 1};  // every element
  unsigned swizzle = 0;                                // CUtensorMapSwizzle
  bool nan_fill = false;                               // out-of-range elements read as NaN
};

// One runtime argument's rule: its kind, whether the variant assumed it divisible by 16 (Triton's
// "D" specialisation of pointers and integers), and for kConstant the value it was compiled with.
struct ParamRule {
  ParamKind kind = ParamKind::kInt64;  // what the argument is to the variant
  bool divisible_by_16 = false;        // the variant assumed it (pointers: 16-byte aligned)
  std::int64_t constant = 0;           // kConstant: the value the variant was compiled with
  bool constant_is_none = false;       // kConstant: the argument was None (an absent optional pointer)
  TensorMapRule tensor_map;            // kTensorMap: how to encode it
};

// One argument as the caller has it, classified the way Triton's specialisation classifies it
// (a Python int is i32 when it fits, else i64, else u64; a bool is i1; a float is fp32; a tensor
// is a pointer): the variant matches only arguments of its own kinds.
struct ParamValue {
  // A value, or Python's None.
  enum class Type : std::uint8_t { kValue, kNone };
  Type type = Type::kNone;             // a value or None
  ParamKind kind = ParamKind::kInt64;  // kValue: Triton's kind for the argument
  std::int64_t integer = 0;            // integers and pointers: the value's 64 bits (kTensorMap: base)
  double real = 0.0;                   // kFloat32 / kFloat64
  unsigned rank = 0;                             // kTensorMap: the descriptor's dimensions
  std::int64_t shape[kMaxTensorMapRank] = {};    // kTensorMap: its shape, outermost first
  std::int64_t strides[kMaxTensorMapRank] = {};  // kTensorMap: its strides in elements, outermost first
  bool nan_padding = false;                      // kTensorMap: padding="nan" (out of range reads NaN)
};

// The driver's arguments for a descriptor `value` under `rule` (what Triton's launcher passes to
// cuTensorMapEncodeTiled for it); the caller checked that the ranks agree.
TensorMapEncoding tensor_map_encoding(const TensorMapRule& rule, const ParamValue& value);

// What the driver needs besides the parameters: from Triton's compiled metadata.
struct KernelLaunchShape {
  unsigned block_threads = 128;  // 32 * num_warps
  unsigned shared_bytes = 0;     // metadata.shared (dynamic shared memory)
  unsigned cluster_ctas = 1;     // metadata.num_ctas
  bool cooperative = false;      // metadata.launch_cooperative_grid
  bool programmatic_serialization = false;  // metadata.launch_pdl
};

// A loaded kernel variant and its argument rules; launch() is the per-call work.
class KernelLauncher {
 public:
  // `function` stays owned by whoever loaded its module (Triton or a prebuilt loader), which
  // must outlive the launcher. `name` and `rank` appear in errors.
  KernelLauncher(std::string name, int rank, CUfunction function, std::vector<ParamRule> rules,
                 KernelLaunchShape shape);
  // kernel_params() points into the launcher's own storage: a copy would launch with the
  // original's arguments.
  KernelLauncher(const KernelLauncher&) = delete;
  KernelLauncher& operator=(const KernelLauncher&) = delete;
  // A move keeps the storage (the vectors' buffers move with it, and the pointers into them).
  KernelLauncher(KernelLauncher&&) = default;
  // As the move constructor.
  KernelLauncher& operator=(KernelLauncher&&) = default;

  // Checks `values` (one per rule, in the kernel's order of runtime arguments) and writes them
  // into the parameter block, all but the tensor descriptors' (launch() encodes those: a driver
  // call). False when a value breaks its rule (another kind, a misaligned pointer, another
  // constant: the file notes); throws when the count is wrong.
  bool pack(const ParamValue* values, std::size_t count);

  // pack(), then cuLaunchKernelEx on `stream` with `grid` programs (grid[0] counts programs, as
  // Triton's grid does: times cluster_ctas CTAs). False, and nothing launched, when pack() is.
  // A zero-sized grid launches nothing and returns true.
  bool launch(const unsigned grid[3], CUstream stream, const ParamValue* values, std::size_t count);

  // The parameter block's pointers, one per kernel parameter (runtime arguments with a slot, a
  // tensor descriptor's CUtensorMap, shape and strides, then Triton 3.6's two scratch pointers,
  // always null here): what cuLaunchKernelEx receives.
  void* const* kernel_params() const { return params_.data(); }
  // How many pointers kernel_params() holds.
  std::size_t kernel_param_count() const { return params_.size(); }

  // The kernel's name, as errors give it.
  const std::string& name() const { return name_; }
  // The rank errors name (-1: before the runtime's init).
  int rank() const { return rank_; }
  // How many runtime arguments pack() and launch() take.
  std::size_t arguments() const { return rules_.size(); }
  // Runtime argument i's rule (i < arguments()).
  const ParamRule& rule(std::size_t i) const { return rules_.at(i); }

 private:
  // Writes argument i's CUtensorMap (cuTensorMapEncodeTiled), shape and strides, unless they hold
  // `value`'s already.
  void encode(std::size_t i, const ParamValue& value);

  std::string name_;
  int rank_;
  CUfunction function_;
  std::vector<ParamRule> rules_;
  KernelLaunchShape shape_;
  std::vector<std::uint64_t> slots_;  // 8 bytes per scalar parameter: every kind fits, little-endian
  std::vector<CUtensorMap> maps_;     // one per tensor descriptor (64-byte aligned, as the kernel takes it)
  // Per CUtensorMap, the descriptor it was last encoded from (type kNone: never): the same one
  // again (a weight, an output the allocator hands back) keeps it, without the driver call.
  std::vector<ParamValue> encoded_;
  std::vector<void*> params_;
  std::vector<std::size_t> slot_of_;  // rule index -> its first slot (kTensorMap: its shape's; kConstant: unused)
  std::vector<std::size_t> map_of_;   // rule index -> its CUtensorMap (kTensorMap only)
};

// How a value stands to its parameter's rule.
enum class ArgumentFit : std::uint8_t {
  kFits,              // the variant takes it
  kOtherConstant,     // a folded parameter given another value (or None where an int was folded)
  kNoneGiven,         // None where the variant takes a value
  kOtherKind,         // a value of another kind (an i64 where the variant takes i32, ...)
  kNotDivisibleBy16,  // the variant assumed divisibility by 16 (pointers: 16-byte alignment;
                      // a tensor descriptor's base always, as TMA requires)
  kOtherRank,         // a tensor descriptor of another rank than the variant's
};
// The one check of a value against its rule: what pack() applies to every argument, and what
// PrebuiltKernel's errors put into words (argument_misfit).
ArgumentFit argument_fit(const ParamRule& rule, const ParamValue& value);

// Parses one of Triton's type strings ("*bf16", "i32", "fp32", ...) into a ParamKind; throws for
// the ones the launcher does not pass (tensor descriptors, fp16/bf16 scalars, tuples).
ParamKind param_kind_of(const std::string& triton_type);

}  // namespace tdist
