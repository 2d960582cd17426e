#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "tdist/nvshmem_session.h"

namespace tdist {
namespace {

const std::string kWorld = join_members({"host-a:100", "host-a:101"});

TEST(NvshmemSession, NothingKeptBringsNvshmemUp) {
  const NvshmemPlan plan = plan_nvshmem_start(std::nullopt, kWorld, 1 << 20);
  EXPECT_EQ(plan.start, NvshmemStart::kInitialise);
  EXPECT_TRUE(plan.refusal.empty());
}

TEST(NvshmemSession, TheSameProcessesReuseAHeapThatFits) {
  const NvshmemSession kept{kWorld, 1 << 20, false};
  EXPECT_EQ(plan_nvshmem_start(kept, kWorld, 1 << 20).start, NvshmemStart::kReuse);
  EXPECT_EQ(plan_nvshmem_start(kept, kWorld, 1 << 10).start, NvshmemStart::kReuse);
  EXPECT_EQ(plan_nvshmem_start(kept, kWorld, 2 << 20).start, NvshmemStart::kReinitialise);
}

TEST(NvshmemSession, OtherProcessesOrAnInstanceStillInUseAreRefused) {
  const NvshmemSession kept{kWorld, 1 << 20, false};
  const NvshmemPlan other = plan_nvshmem_start(kept, join_members({"host-a:100", "host-b:7"}), 1 << 20);
  EXPECT_NE(other.refusal.find("other ones"), std::string::npos) << other.refusal;
  const NvshmemSession busy{kWorld, 1 << 20, true};
  const NvshmemPlan failed = plan_nvshmem_start(busy, kWorld, 1 << 20);
  EXPECT_NE(failed.refusal.find("failed part-way"), std::string::npos) << failed.refusal;
}

TEST(NvshmemSession, OnlyTheFirstInstanceOfAProcessIsKept) {
  const NvshmemSession kept{kWorld, 1 << 20, false};
  // Reusing the kept instance is always allowed; bringing up a second one to keep is not.
  EXPECT_TRUE(plan_nvshmem_start(kept, kWorld, 1 << 20, true, true).refusal.empty());
  EXPECT_TRUE(plan_nvshmem_start(std::nullopt, kWorld, 1 << 20, true, false).refusal.empty());
  const NvshmemPlan again = plan_nvshmem_start(std::nullopt, kWorld, 1 << 20, true, true);
  EXPECT_NE(again.refusal.find("first NVSHMEM instance"), std::string::npos) << again.refusal;
  const NvshmemPlan larger = plan_nvshmem_start(kept, kWorld, 2 << 20, true, true);
  EXPECT_NE(larger.refusal.find("largest heap"), std::string::npos) << larger.refusal;
  // Without keep_nvshmem, every later instance is taken down at finalize: allowed.
  EXPECT_TRUE(plan_nvshmem_start(std::nullopt, kWorld, 1 << 20, false, true).refusal.empty());
  EXPECT_EQ(plan_nvshmem_start(kept, kWorld, 2 << 20, false, true).start, NvshmemStart::kReinitialise);
}

TEST(NvshmemSession, MembersNameThisProcess) {
  const std::string me = this_process_member();
  EXPECT_NE(me.find(':'), std::string::npos);
  EXPECT_EQ(join_members({"a:1", "b:2"}), "a:1;b:2;");
  EXPECT_NE(join_members({"a:1", "b:2"}), join_members({"b:2", "a:1"}));  // rank order matters
}

}  // namespace
}  // namespace tdist
