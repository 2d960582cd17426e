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

}  // namespace
}  // namespace tdist
