#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tdist/error.h"
#include "tdist/kernel_launcher.h"

namespace tdist {
namespace {

// Packing needs no GPU: a dummy function handle is never called.
CUfunction fake_function() { return reinterpret_cast<CUfunction>(0x1); }

ParamValue of(ParamKind kind, std::int64_t v) { return {ParamValue::Type::kValue, kind, v, 0.0}; }
ParamValue pointer(std::int64_t v) { return of(ParamKind::kPointer, v); }
ParamValue i32(std::int64_t v) { return of(ParamKind::kInt32, v); }
ParamValue real(double v) { return {ParamValue::Type::kValue, ParamKind::kFloat32, 0, v}; }
ParamValue none() { return {}; }

std::uint64_t slot(const KernelLauncher& l, std::size_t i) {
  std::uint64_t v;
  std::memcpy(&v, l.kernel_params()[i], sizeof(v));
  return v;
}

// x: *bf16 (aligned), n: i32, epoch: *i64, scale: fp32, one: the constant 1 Triton folded in.
KernelLauncher typical() {
  std::vector<ParamRule> rules = {
      {ParamKind::kPointer, true, 0, false},
      {ParamKind::kInt32, false, 0, false},
      {ParamKind::kPointer, false, 0, false},
      {ParamKind::kFloat32, false, 0, false},
      {ParamKind::kConstant, false, 1, false},
  };
  return KernelLauncher("typical", 0, fake_function(), rules, {});
}

TEST(KernelLauncher, SlotsHoldRuntimeArgumentsThenTwoScratchPointers) {
  KernelLauncher l = typical();
  EXPECT_EQ(l.arguments(), 5u);
  EXPECT_EQ(l.kernel_param_count(), 4u + 2u);  // the constant has no slot
  ParamValue v[] = {pointer(0x7f0000001000), i32(-7), pointer(0x7f0000000008), real(0.5), i32(1)};
  ASSERT_TRUE(l.pack(v, 5));
  EXPECT_EQ(slot(l, 0), 0x7f0000001000u);
  EXPECT_EQ(static_cast<std::int32_t>(slot(l, 1)), -7);
  EXPECT_EQ(slot(l, 2), 0x7f0000000008u);
  float f;
  std::memcpy(&f, l.kernel_params()[3], sizeof(f));
  EXPECT_EQ(f, 0.5f);
  EXPECT_EQ(slot(l, 4), 0u);
  EXPECT_EQ(slot(l, 5), 0u);
}

TEST(KernelLauncher, ArgumentsOfAnotherVariantAreRefused) {
  KernelLauncher l = typical();
  ParamValue misaligned[] = {pointer(0x1008), i32(1), pointer(8), real(1), i32(1)};
  EXPECT_FALSE(l.pack(misaligned, 5));
  ParamValue wide[] = {pointer(0x1000), of(ParamKind::kInt64, std::int64_t{1} << 31), pointer(8), real(1), i32(1)};
  EXPECT_FALSE(l.pack(wide, 5));
  ParamValue other_constant[] = {pointer(0x1000), i32(3), pointer(8), real(1), i32(2)};
  EXPECT_FALSE(l.pack(other_constant, 5));
  ParamValue bool_constant[] = {pointer(0x1000), i32(3), pointer(8), real(1), of(ParamKind::kInt1, 1)};
  EXPECT_FALSE(l.pack(bool_constant, 5));
  ParamValue null_pointer[] = {pointer(0x1000), i32(3), none(), real(1), i32(1)};
  EXPECT_FALSE(l.pack(null_pointer, 5));
  ParamValue int_for_float[] = {pointer(0x1000), i32(3), pointer(8), i32(2), i32(1)};
  EXPECT_FALSE(l.pack(int_for_float, 5));
  ParamValue integer_for_pointer[] = {i32(4096), i32(3), pointer(8), real(1), i32(1)};
  EXPECT_FALSE(l.pack(integer_for_pointer, 5));
  // Less specialised than Triton would pick (16 for an undivided i32) is still this variant.
  ParamValue fine[] = {pointer(0x1000), i32(16), pointer(8), real(1), i32(1)};
  EXPECT_TRUE(l.pack(fine, 5));
}

TEST(KernelLauncher, AWrongCountThrowsWithTheKernelsName) {
  KernelLauncher l = typical();
  ParamValue three[] = {pointer(0x1000), i32(3), pointer(8)};
  try {
    l.pack(three, 3);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("typical: 3 arguments given, the kernel takes 5"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("[rank 0]"), std::string::npos) << e.what();
  }
}

TEST(KernelLauncher, NoneMatchesAConstantNone) {
  std::vector<ParamRule> rules = {{ParamKind::kConstant, false, 0, true}, {ParamKind::kUInt8, false, 0, false}};
  KernelLauncher l("optional", 1, fake_function(), rules, {});
  ParamValue ok[] = {none(), of(ParamKind::kUInt8, 255)};
  EXPECT_TRUE(l.pack(ok, 2));
  ParamValue pointer_given[] = {pointer(0x1000), of(ParamKind::kUInt8, 255)};
  EXPECT_FALSE(l.pack(pointer_given, 2));
}

TEST(KernelLauncher, TritonTypesMapToKinds) {
  EXPECT_EQ(param_kind_of("*bf16"), ParamKind::kPointer);
  EXPECT_EQ(param_kind_of("*i64"), ParamKind::kPointer);
  EXPECT_EQ(param_kind_of("i32"), ParamKind::kInt32);
  EXPECT_EQ(param_kind_of("u64"), ParamKind::kUInt64);
  EXPECT_EQ(param_kind_of("fp32"), ParamKind::kFloat32);
  EXPECT_EQ(param_kind_of("constexpr"), ParamKind::kConstant);
  EXPECT_THROW(param_kind_of("nvTmaDesc"), Error);
  EXPECT_THROW(param_kind_of("fp16"), Error);
}

TEST(KernelLauncher, RefusesImpossibleShapes) {
  KernelLaunchShape shape;
  shape.block_threads = 2048;
  EXPECT_THROW(KernelLauncher("big", 0, fake_function(), {}, shape), Error);
  EXPECT_THROW(KernelLauncher("null", 0, nullptr, {}, {}), Error);
}

// A bf16 descriptor of a [120, 4104] tensor in blocks of [128, 256], lowered by Triton to a TMA
// box of [128, 64] with 128-byte swizzling (gemm_kernel's c_desc, compiled for sm_90).
TensorMapRule bf16_rule() {
  TensorMapRule r;
  r.rank = 2;
  r.element_type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  r.element_bytes = 2;
  r.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  r.box[0] = 128;
  r.box[1] = 64;
  return r;
}

ParamValue descriptor(std::int64_t base, std::int64_t rows, std::int64_t cols, std::int64_t row_stride) {
  ParamValue v{ParamValue::Type::kValue, ParamKind::kTensorMap, base, 0.0};
  v.rank = 2;
  v.shape[0] = rows;
  v.shape[1] = cols;
  v.strides[0] = row_stride;
  v.strides[1] = 1;
  return v;
}

TEST(KernelLauncher, TensorMapsAreEncodedInnermostFirstAsTritonsLauncherDoes) {
  const TensorMapEncoding e = tensor_map_encoding(bf16_rule(), descriptor(0x10000, 120, 4104, 4112));
  EXPECT_EQ(e.rank, 2u);
  EXPECT_EQ(e.dims[0], 4104u);  // innermost (columns) first
  EXPECT_EQ(e.dims[1], 120u);
  EXPECT_EQ(e.stride_bytes[0], 4112u * 2);  // the row stride in bytes; the innermost has none
  EXPECT_EQ(e.box[0], 64u);
  EXPECT_EQ(e.box[1], 128u);
  EXPECT_EQ(e.element_strides[0], 1u);
  EXPECT_EQ(e.swizzle, static_cast<unsigned>(CU_TENSOR_MAP_SWIZZLE_128B));
  EXPECT_FALSE(e.nan_fill);
  TensorMapRule fp4 = bf16_rule();
  fp4.fp4_padded = true;
  EXPECT_EQ(tensor_map_encoding(fp4, descriptor(0x10000, 120, 4104, 4112)).dims[0], 2u * 4104);
}

TEST(KernelLauncher, ADescriptorIsItsTensorMapThenShapeThenStrides) {
  // gemm_kernel(a_desc, b_desc, M): a CUtensorMap, 2 x i32, 2 x i64 per descriptor (its PTX
  // parameters), then M, then the two scratch pointers.
  ParamRule map;
  map.kind = ParamKind::kTensorMap;
  map.tensor_map = bf16_rule();
  ParamRule m;
  m.kind = ParamKind::kInt32;
  KernelLauncher l("descriptors", 0, fake_function(), {map, map, m}, {});
  EXPECT_EQ(l.kernel_param_count(), 2u * 5 + 1 + 2);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(l.kernel_params()[0]) % 64, 0u);  // .param .align 64 .b8[128]
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(l.kernel_params()[5]) % 64, 0u);
  // Packing checks what it can without the driver; the encoding waits for a launch.
  ParamValue ok[] = {descriptor(0x10000, 120, 4104, 4112), descriptor(0x20000, 64, 64, 64), i32(120)};
  EXPECT_TRUE(l.pack(ok, 3));
  EXPECT_EQ(*static_cast<std::int32_t*>(l.kernel_params()[10]), 120);
  const unsigned empty[3] = {0, 1, 1};
  EXPECT_TRUE(l.launch(empty, nullptr, ok, 3));  // nothing to launch: no driver call
  ParamValue misaligned[] = {descriptor(0x10008, 120, 4104, 4112), descriptor(0x20000, 64, 64, 64), i32(1)};
  EXPECT_FALSE(l.pack(misaligned, 3));
  ParamValue rank3[] = {descriptor(0x10000, 120, 4104, 4112), descriptor(0x20000, 64, 64, 64), i32(1)};
  rank3[1].rank = 3;
  EXPECT_FALSE(l.pack(rank3, 3));
  EXPECT_EQ(argument_fit(map, rank3[1]), ArgumentFit::kOtherRank);
  EXPECT_EQ(argument_fit(map, pointer(0x10000)), ArgumentFit::kOtherKind);
}

}  // namespace
}  // namespace tdist
