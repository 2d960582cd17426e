#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "tdist/module_ptx.h"

namespace tdist {
namespace {

TEST(ModulePtx, KnownPtxDeclaresOnlyTheGlobalsItNames) {
  const ModulePtx ptx(".visible .global .align 8 .u64 triton_dist_wait_report;\n");
  EXPECT_TRUE(ptx.may_declare("triton_dist_wait_report"));
  EXPECT_FALSE(ptx.may_declare("nvshmemi_device_state_d"));
  EXPECT_FALSE(ptx.may_declare("dist_wait_report"));  // inside a longer name
  EXPECT_FALSE(ModulePtx("triton_dist_wait_report_v2;").may_declare("triton_dist_wait_report"));
  EXPECT_TRUE(ModulePtx("triton_dist_wait_report_v2; triton_dist_wait_report;").may_declare("triton_dist_wait_report"));
}

TEST(ModulePtx, UnknownOrUnreadablePtxMayDeclareAnything) {
  EXPECT_TRUE(ModulePtx().may_declare("nvshmemi_device_state_d"));
  EXPECT_TRUE(ModulePtx::from_file("").may_declare("nvshmemi_device_state_d"));
  EXPECT_TRUE(ModulePtx::from_file("/nonexistent/kernel.ptx").may_declare("nvshmemi_device_state_d"));
}

TEST(ModulePtx, ReadsTheFileItIsGiven) {
  const std::string path = ::testing::TempDir() + "module_ptx_test.ptx";
  std::ofstream(path) << ".extern .global .align 8 .b8 nvshmemi_device_state_d[];\n";
  const ModulePtx ptx = ModulePtx::from_file(path);
  EXPECT_TRUE(ptx.may_declare("nvshmemi_device_state_d"));
  EXPECT_FALSE(ptx.may_declare("triton_dist_wait_report"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tdist
