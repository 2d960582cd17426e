#include "tdist/kernel_launcher.h"

#include <cstring>
#include <utility>

#include "tdist/cuda_driver.h"
#include "tdist/error.h"

namespace tdist {
namespace {

constexpr const char* kOp = "KernelLauncher";

// Kinds a Python int is given (Triton folds only ints into constants; a bool is i1, never folded).
bool is_integer_kind(ParamKind kind) {
  return kind == ParamKind::kInt32 || kind == ParamKind::kInt64 || kind == ParamKind::kUInt64;
}

// Whether two descriptors of one parameter (its rule fixes rank's meaning, element type, box and
// swizzle) encode to the same CUtensorMap: base, shape, strides and padding.
bool same_descriptor(const ParamValue& a, const ParamValue& b) {
  if (a.type != b.type || a.integer != b.integer || a.rank != b.rank || a.nan_padding != b.nan_padding) return false;
  for (unsigned d = 0; d < a.rank; ++d)
    if (a.shape[d] != b.shape[d] || a.strides[d] != b.strides[d]) return false;
  return true;
}

}  // namespace

ParamKind param_kind_of(const std::string& t) {
  if (!t.empty() && t[0] == '*') return ParamKind::kPointer;
  static const std::pair<const char*, ParamKind> kinds[] = {
      {"i1", ParamKind::kInt1},     {"i8", ParamKind::kInt8},       {"i16", ParamKind::kInt16},
      {"i32", ParamKind::kInt32},   {"i64", ParamKind::kInt64},     {"u1", ParamKind::kInt1},
      {"u8", ParamKind::kUInt8},    {"u16", ParamKind::kUInt16},    {"u32", ParamKind::kUInt32},
      {"u64", ParamKind::kUInt64},  {"fp32", ParamKind::kFloat32},  {"f32", ParamKind::kFloat32},
      {"fp64", ParamKind::kFloat64}, {"f64", ParamKind::kFloat64}, {"constexpr", ParamKind::kConstant},
  };
  for (const auto& [name, kind] : kinds)
    if (t == name) return kind;
  Message message;
  message << error_prefix(-1, kOp) << "Triton argument type '" << t
          << "' is not one the C++ launcher passes (pointers, integers, fp32 and fp64 scalars); launch this "
             "kernel through Triton";
  throw Error(message.str());
}

TensorMapEncoding tensor_map_encoding(const TensorMapRule& rule, const ParamValue& v) {
  // Triton's launcher (backends/nvidia/driver.py make_tensordesc_arg, driver.c fillTMADescriptor):
  // dimensions reversed to innermost first, strides in bytes for all but the innermost, the box
  // from the compiled metadata, unit element strides, no interleave, 128-byte L2 promotion.
  TensorMapEncoding e;
  e.rank = rule.rank;
  e.element_type = rule.element_type;
  e.swizzle = rule.swizzle;
  e.nan_fill = v.nan_padding;
  const unsigned n = rule.rank;
  for (unsigned i = 0; i < n; ++i) {
    std::int64_t dim = v.shape[i];
    if (rule.fp4_padded && i + 1 == n) dim *= 2;
    e.dims[n - 1 - i] = static_cast<std::uint64_t>(dim);
    e.box[n - 1 - i] = rule.box[i];
  }
  for (unsigned i = 0; i + 1 < n; ++i)
    e.stride_bytes[n - 2 - i] = static_cast<std::uint64_t>(v.strides[i]) * rule.element_bytes;
  return e;
}

KernelLauncher::KernelLauncher(std::string name, int rank, CUfunction function, std::vector<ParamRule> rules,
                               KernelLaunchShape shape)
    : name_(std::move(name)), rank_(rank), function_(function), rules_(std::move(rules)), shape_(shape) {
  TDIST_CHECK(function_ != nullptr, rank_, kOp, name_ << ": no function (load the kernel's module first)");
  TDIST_CHECK(shape_.block_threads > 0 && shape_.block_threads <= 1024 && shape_.cluster_ctas > 0, rank_, kOp,
              name_ << ": " << shape_.block_threads << " threads per CTA and clusters of " << shape_.cluster_ctas
                    << " CTAs is no launch");
  slot_of_.assign(rules_.size(), 0);
  map_of_.assign(rules_.size(), 0);
  std::size_t slots = 0;
  std::size_t maps = 0;
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    const ParamRule& rule = rules_[i];
    if (rule.kind == ParamKind::kConstant) continue;
    if (rule.kind == ParamKind::kTensorMap) {
      TDIST_CHECK(rule.tensor_map.rank >= 1 && rule.tensor_map.rank <= kMaxTensorMapRank, rank_, kOp,
                  name_ << ": argument " << i << " is a tensor descriptor of rank " << rule.tensor_map.rank
                        << "; TMA takes 1 to " << kMaxTensorMapRank);
      map_of_[i] = maps++;
      slot_of_[i] = slots;
      slots += 2 * rule.tensor_map.rank;  // its shape, then its strides
    } else {
      slot_of_[i] = slots++;
    }
  }
  // Triton 3.6 kernels end with a global and a profile scratch pointer; variants that need
  // either are refused by the Python side (their memory is per launch), so both stay null.
  slots_.assign(slots + 2, 0);
  maps_.assign(maps, CUtensorMap{});
  encoded_.assign(maps, ParamValue{});
  // The kernel's parameters in order: a descriptor is its CUtensorMap, then its shape and strides.
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    const ParamRule& rule = rules_[i];
    if (rule.kind == ParamKind::kConstant) continue;
    if (rule.kind == ParamKind::kTensorMap) {
      params_.push_back(&maps_[map_of_[i]]);
      for (unsigned d = 0; d < 2 * rule.tensor_map.rank; ++d) params_.push_back(&slots_[slot_of_[i] + d]);
    } else {
      params_.push_back(&slots_[slot_of_[i]]);
    }
  }
  params_.push_back(&slots_[slots]);
  params_.push_back(&slots_[slots + 1]);
}

void KernelLauncher::encode(std::size_t i, const ParamValue& v) {
  ParamValue& last = encoded_[map_of_[i]];
  if (same_descriptor(last, v)) return;  // the map, shape and strides written for it are still there
  last = ParamValue{};                    // until this encoding has succeeded
  const ParamRule& rule = rules_[i];
  const TensorMapEncoding e = tensor_map_encoding(rule.tensor_map, v);
  const CUresult result = CudaDriver::get().tensor_map_encode_tiled(
      &maps_[map_of_[i]], static_cast<CUtensorMapDataType>(e.element_type), e.rank,
      reinterpret_cast<void*>(static_cast<std::uintptr_t>(v.integer)), e.dims, e.stride_bytes, e.box,
      e.element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, static_cast<CUtensorMapSwizzle>(e.swizzle),
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      e.nan_fill ? CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA : CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)  // the text only on failure, as in launch()
    check_cuda(result, rank_, kOp + (": " + name_ + ", tensor descriptor argument " + std::to_string(i)),
               "cuTensorMapEncodeTiled");
  // The kernel's own view of the descriptor: its shape (i32) and strides (i64), in elements.
  const unsigned n = rule.tensor_map.rank;
  for (unsigned d = 0; d < n; ++d) {
    std::int64_t dim = v.shape[d];
    if (rule.tensor_map.fp4_padded && d + 1 == n) dim *= 2;
    slots_[slot_of_[i] + d] = static_cast<std::uint64_t>(static_cast<std::uint32_t>(dim));
    slots_[slot_of_[i] + n + d] = static_cast<std::uint64_t>(v.strides[d]);
  }
  last = v;
}

ArgumentFit argument_fit(const ParamRule& rule, const ParamValue& v) {
  if (rule.kind == ParamKind::kConstant) {
    const bool same = rule.constant_is_none ? v.type == ParamValue::Type::kNone
                                            : v.type == ParamValue::Type::kValue && is_integer_kind(v.kind) &&
                                                  v.integer == rule.constant;
    return same ? ArgumentFit::kFits : ArgumentFit::kOtherConstant;
  }
  if (v.type != ParamValue::Type::kValue) return ArgumentFit::kNoneGiven;
  if (v.kind != rule.kind) return ArgumentFit::kOtherKind;
  if (rule.kind == ParamKind::kTensorMap) {
    if (v.rank != rule.tensor_map.rank) return ArgumentFit::kOtherRank;
    if ((v.integer & 15) != 0) return ArgumentFit::kNotDivisibleBy16;  // TMA's base alignment
    return ArgumentFit::kFits;
  }
  if (rule.divisible_by_16 && (v.integer & 15) != 0) return ArgumentFit::kNotDivisibleBy16;
  return ArgumentFit::kFits;
}

bool KernelLauncher::pack(const ParamValue* values, std::size_t count) {
  TDIST_CHECK(count == rules_.size(), rank_, kOp,
              name_ << ": " << count << " arguments given, the kernel takes " << rules_.size()
                    << " runtime arguments (constexprs go to the launcher's constructor)");
  for (std::size_t i = 0; i < count; ++i) {
    const ParamRule& rule = rules_[i];
    const ParamValue& v = values[i];
    if (argument_fit(rule, v) != ArgumentFit::kFits) return false;
    if (rule.kind == ParamKind::kConstant) continue;
    if (rule.kind == ParamKind::kTensorMap) continue;  // encoded by launch(): a driver call
    std::uint64_t& slot = slots_[slot_of_[i]];
    slot = 0;
    if (rule.kind == ParamKind::kFloat32) {
      const float f = static_cast<float>(v.real);
      std::memcpy(&slot, &f, sizeof(f));
    } else if (rule.kind == ParamKind::kFloat64) {
      std::memcpy(&slot, &v.real, sizeof(v.real));
    } else {
      // The slot's low bytes are what the kernel reads for narrower kinds (little-endian).
      slot = static_cast<std::uint64_t>(v.integer);
    }
  }
  return true;
}

bool KernelLauncher::launch(const unsigned grid[3], CUstream stream, const ParamValue* values, std::size_t count) {
  if (!pack(values, count)) return false;
  if (static_cast<std::uint64_t>(grid[0]) * grid[1] * grid[2] == 0) return true;
  for (std::size_t i = 0; i < count; ++i)
    if (rules_[i].kind == ParamKind::kTensorMap) encode(i, values[i]);
  CUlaunchAttribute attrs[3];
  unsigned num_attrs = 0;
  if (shape_.programmatic_serialization) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[num_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++num_attrs;
  }
  if (shape_.cooperative) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[num_attrs].value.cooperative = 1;
    ++num_attrs;
  }
  if (shape_.cluster_ctas != 1) {
    attrs[num_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[num_attrs].value.clusterDim.x = shape_.cluster_ctas;
    attrs[num_attrs].value.clusterDim.y = 1;
    attrs[num_attrs].value.clusterDim.z = 1;
    ++num_attrs;
  }
  CUlaunchConfig config;
  std::memset(&config, 0, sizeof(config));
  config.gridDimX = grid[0] * shape_.cluster_ctas;
  config.gridDimY = grid[1];
  config.gridDimZ = grid[2];
  config.blockDimX = shape_.block_threads;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = shape_.shared_bytes;
  config.hStream = stream;
  config.attrs = num_attrs ? attrs : nullptr;
  config.numAttrs = num_attrs;
  // The error's text is made only on failure: a string built per launch is a heap allocation on
  // every eager call.
  const CUresult result = CudaDriver::get().launch_kernel_ex(&config, function_, params_.data(), nullptr);
  if (result != CUDA_SUCCESS) check_cuda(result, rank_, kOp + (": " + name_), "cuLaunchKernelEx");
  return true;
}

}  // namespace tdist
