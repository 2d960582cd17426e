#include <gtest/gtest.h>

#include <string>

#include "tdist/error.h"
#include "tdist/prebuilt_kernel.h"

namespace tdist {
namespace {

// A manifest in the form python -m triton_dist.tools.prebuild writes (for the one-shot AllReduce
// before its signal stride became an argument), plus a folded constant and a folded None (which that
// kernel lacks) to cover every kind of parameter line.
const char* const kGood = R"(# triton-dist prebuilt kernel all_reduce_one_shot: ...
# sm_90, Triton 3.6.0; language settings: wait_timeout_ns=60000000000 debug_barriers=0 local_world_size=0
tdist-prebuilt 1
symbol all_reduce_one_shot_kernel
threads 256
shared 1024
cooperative 0
pdl 1

constexpr WORLD 2
constexpr MAX_PROGRAMS 128
constexpr LABEL fast
params 5
param x *fp32 D
param n i32 -
param epoch_ptr *i64 D
param one constexpr 1
param bias constexpr none
)";

// The message of the Error that parsing `text` throws ("" if none).
std::string parse_error(const std::string& text) {
  try {
    parse_prebuilt_manifest(text, "all_reduce_one_shot", 3);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(PrebuiltManifest, AGoodManifestGivesTheLaunchAndOneRulePerArgument) {
  const PrebuiltManifest m = parse_prebuilt_manifest(kGood, "all_reduce_one_shot", 0);
  EXPECT_EQ(m.symbol, "all_reduce_one_shot_kernel");
  EXPECT_EQ(m.shape.block_threads, 256u);
  EXPECT_EQ(m.shape.shared_bytes, 1024u);
  EXPECT_FALSE(m.shape.cooperative);
  EXPECT_TRUE(m.shape.programmatic_serialization);
  EXPECT_EQ(m.shape.cluster_ctas, 1u);
  ASSERT_EQ(m.rules.size(), 5u);
  EXPECT_EQ(m.param_names, (std::vector<std::string>{"x", "n", "epoch_ptr", "one", "bias"}));
  EXPECT_EQ(m.param_types[0], "*fp32");
  EXPECT_EQ(m.rules[0].kind, ParamKind::kPointer);
  EXPECT_TRUE(m.rules[0].divisible_by_16);
  EXPECT_EQ(m.rules[1].kind, ParamKind::kInt32);
  EXPECT_FALSE(m.rules[1].divisible_by_16);
  EXPECT_EQ(m.rules[3].kind, ParamKind::kConstant);
  EXPECT_EQ(m.rules[3].constant, 1);
  EXPECT_FALSE(m.rules[3].constant_is_none);
  EXPECT_EQ(m.rules[4].kind, ParamKind::kConstant);
  EXPECT_TRUE(m.rules[4].constant_is_none);
  EXPECT_EQ(m.constexpr_int("WORLD", "all_reduce_one_shot", 0), 2);
  EXPECT_EQ(m.constexpr_int("MAX_PROGRAMS", "all_reduce_one_shot", 0), 128);
  EXPECT_EQ(m.constexprs.at("LABEL"), "fast");
}

TEST(PrebuiltManifest, AConstexprThatIsAbsentOrNotAnIntegerIsAnError) {
  const PrebuiltManifest m = parse_prebuilt_manifest(kGood, "all_reduce_one_shot", 1);
  EXPECT_THROW(m.constexpr_int("BLOCK", "all_reduce_one_shot", 1), Error);
  try {
    m.constexpr_int("LABEL", "all_reduce_one_shot", 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("constexpr LABEL is 'fast', not an integer"), std::string::npos) << e.what();
  }
}

TEST(PrebuiltManifest, AMissingFieldIsNamedWithTheFix) {
  for (const char* line : {"symbol all_reduce_one_shot_kernel\n", "threads 256\n", "params 5\n", "pdl 1\n",
                           "tdist-prebuilt 1\n"}) {
    const std::string error = parse_error(replaced(kGood, line, ""));
    const std::string key = std::string(line).substr(0, std::string(line).find(' '));
    EXPECT_NE(error.find("[rank 3] prebuilt kernel all_reduce_one_shot: the manifest has no '" + key + "' line"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("python -m triton_dist.tools.prebuild --out <dir> --world <ranks> all_reduce_one_shot"),
              std::string::npos)
        << error;
  }
}

TEST(PrebuiltManifest, AnUnknownTypeSaysTheKernelCannotBePrebuilt) {
  const std::string error = parse_error(replaced(kGood, "param n i32 -", "param desc tensordesc<fp16[64,64]> -"));
  EXPECT_NE(error.find("manifest line 15: parameter desc has type 'tensordesc<fp16[64,64]>'"), std::string::npos)
      << error;
  EXPECT_NE(error.find("cannot be prebuilt"), std::string::npos) << error;
}

TEST(PrebuiltManifest, AWrongParameterCountIsRefused) {
  std::string error = parse_error(replaced(kGood, "params 5", "params 6"));
  EXPECT_NE(error.find("the manifest declares 6 parameters but lists 5"), std::string::npos) << error;
  error = parse_error(replaced(kGood, "param bias constexpr none\n", ""));
  EXPECT_NE(error.find("the manifest declares 5 parameters but lists 4"), std::string::npos) << error;
}

TEST(PrebuiltManifest, MalformedLinesAreRefusedWithTheirLineNumber) {
  EXPECT_NE(parse_error(replaced(kGood, "tdist-prebuilt 1", "tdist-prebuilt 2")).find("format '2'"),
            std::string::npos);
  EXPECT_NE(parse_error(replaced(kGood, "pdl 1", "pdl yes")).find("'pdl' is 'yes', not 0 or 1"), std::string::npos);
  EXPECT_NE(parse_error(replaced(kGood, "threads 256", "threads -1")).find("not a count"), std::string::npos);
  EXPECT_NE(parse_error(replaced(kGood, "param x *fp32 D", "param x *fp32 16")).find("line 14"), std::string::npos);
  EXPECT_NE(parse_error(replaced(kGood, "param one constexpr 1", "param one constexpr x")).find("neither an integer"),
            std::string::npos);
  EXPECT_NE(parse_error(replaced(kGood, "param n i32 -", "param n i32")).find("line 15"), std::string::npos);
  EXPECT_NE(parse_error(replaced(kGood, "cooperative 0", "grid 3")).find("unknown entry 'grid'"), std::string::npos);
  EXPECT_NE(parse_error(std::string(kGood) + "symbol again\n").find("'symbol' must appear once"), std::string::npos);
  EXPECT_NE(parse_error(std::string(kGood) + "constexpr WORLD 4\n").find("constexpr WORLD is given twice"),
            std::string::npos);
}

TEST(PrebuiltKernelArguments, HelpersGiveTheKindsTheManifestsTypesName) {
  int data[4];
  EXPECT_EQ(pointer_arg(data).kind, ParamKind::kPointer);
  EXPECT_EQ(pointer_arg(data).integer, static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(data)));
  EXPECT_EQ(i32_arg(-5).kind, ParamKind::kInt32);
  EXPECT_EQ(i32_arg(-5).integer, -5);
  EXPECT_EQ(i64_arg(1ll << 40).kind, ParamKind::kInt64);
  EXPECT_EQ(f32_arg(0.5f).real, 0.5);
  EXPECT_EQ(none_arg().type, ParamValue::Type::kNone);
}

TEST(PrebuiltKernelArguments, AMisfitSaysWhatTheKernelTakes) {
  const ParamRule aligned_pointer{ParamKind::kPointer, true, 0, false};
  EXPECT_EQ(argument_misfit(aligned_pointer, "*fp32", pointer_arg(reinterpret_cast<void*>(0x1000))), "");
  EXPECT_NE(argument_misfit(aligned_pointer, "*fp32", pointer_arg(reinterpret_cast<void*>(0x1004)))
                .find("4100 is not a multiple of 16, which the kernel was compiled to assume (pass a 16-byte"),
            std::string::npos);
  EXPECT_EQ(argument_misfit(aligned_pointer, "*fp32", i64_arg(0x1000)), "an i64 given where the kernel takes *fp32");
  EXPECT_EQ(argument_misfit(aligned_pointer, "*fp32", none_arg()), "None given where the kernel takes *fp32");
  const ParamRule count{ParamKind::kInt32, false, 0, false};
  EXPECT_EQ(argument_misfit(count, "i32", i32_arg(7)), "");
  EXPECT_EQ(argument_misfit(count, "i32", i64_arg(7)), "an i64 given where the kernel takes i32");
  const ParamRule one{ParamKind::kConstant, false, 1, false};
  EXPECT_EQ(argument_misfit(one, "constexpr", i32_arg(1)), "");
  EXPECT_EQ(argument_misfit(one, "constexpr", i64_arg(1)), "");
  EXPECT_NE(argument_misfit(one, "constexpr", i32_arg(2)).find("compiled with the constant 1 here"), std::string::npos);
  const ParamRule absent{ParamKind::kConstant, false, 0, true};
  EXPECT_EQ(argument_misfit(absent, "constexpr", none_arg()), "");
  EXPECT_NE(argument_misfit(absent, "constexpr", i32_arg(0)).find("pass none_arg()"), std::string::npos);
}

}  // namespace
}  // namespace tdist
