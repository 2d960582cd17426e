#include <gtest/gtest.h>

#include <cstddef>

#include "tdist/wait_timeout_report.h"

namespace tdist {
namespace {

// The support library's IR (python/triton_dist/language/support_library.py) stores to these
// offsets; a field moved here would be written by the GPU into the wrong one.
TEST(WaitTimeoutReport, RecordLayoutMatchesTheSupportLibrary) {
  EXPECT_EQ(offsetof(WaitTimeoutRecord, claimed), 0u);
  EXPECT_EQ(offsetof(WaitTimeoutRecord, published), 4u);
  EXPECT_EQ(offsetof(WaitTimeoutRecord, rank), 8u);
  EXPECT_EQ(offsetof(WaitTimeoutRecord, signal_index), 12u);
  EXPECT_EQ(offsetof(WaitTimeoutRecord, signal_address), 16u);
  EXPECT_EQ(offsetof(WaitTimeoutRecord, expected), 24u);
  EXPECT_EQ(offsetof(WaitTimeoutRecord, observed), 32u);
  EXPECT_EQ(offsetof(WaitTimeoutRecord, waited_ns), 40u);
  EXPECT_EQ(offsetof(WaitTimeoutRecord, comparison), 48u);
}

TEST(WaitTimeoutReport, DescribesOnlyPublishedRecords) {
  WaitTimeoutRecord record{};
  record.claimed = 1;
  record.rank = 3;
  record.signal_index = 2;
  record.signal_address = 0x7f0012345678ull;
  record.expected = 7;
  record.observed = 5;
  record.waited_ns = 200000064;
  EXPECT_EQ(WaitTimeoutReport::describe(record), "");  // claimed, still being written
  record.published = 1;
  const std::string text = WaitTimeoutReport::describe(record);
  EXPECT_NE(text.find("triton_dist: rank 3: wait timed out after 200000064 ns on signal 2 at "
                      "0x7f0012345678: expected >= 7, observed 5"),
            std::string::npos)
      << text;
  record.comparison = kWaitEqual;
  EXPECT_NE(WaitTimeoutReport::describe(record).find("expected == 7, observed 5"), std::string::npos);
}

}  // namespace
}  // namespace tdist
