#include <gtest/gtest.h>

#include "tdist/signal_names.h"
#include "tdist/wait_timeout_report.h"

namespace tdist {
namespace {

TEST(SignalNames, NamesTheOwnerAndTheRegionOfAnAddress) {
  SignalNames& names = SignalNames::get();
  const std::uint64_t base = 0x7f0000001000ull;
  const std::uint64_t id = names.add(base, 24, 8, "AllGatherGemmContext", {{"ready", 0, 8}, {"ack", 8, 8}});
  EXPECT_EQ(names.name_of(base), "signal 0 of AllGatherGemmContext's pad: ready[0]");
  EXPECT_EQ(names.name_of(base + 9 * 8), "signal 9 of AllGatherGemmContext's pad: ack[1]");
  EXPECT_EQ(names.name_of(base + 20 * 8), "signal 20 of AllGatherGemmContext's pad");  // in no region
  EXPECT_EQ(names.name_of(base + 24 * 8), "");  // one past the pad
  EXPECT_EQ(names.name_of(base - 8), "");
  names.remove(base, id);
  EXPECT_EQ(names.name_of(base), "");
}

TEST(SignalNames, NeighbouringPadsKeepTheirOwnNames) {
  SignalNames& names = SignalNames::get();
  const std::uint64_t first = names.add(0x1000, 4, 8, "first", {});
  const std::uint64_t second = names.add(0x1020, 4, 8, "second", {});
  EXPECT_EQ(names.name_of(0x1018), "signal 3 of first's pad");
  EXPECT_EQ(names.name_of(0x1020), "signal 0 of second's pad");
  // A pad allocated again at a freed one's address; the old owner's late removal keeps the new names.
  const std::uint64_t renamed = names.add(0x1000, 4, 8, "renamed", {});
  names.remove(0x1000, first);
  EXPECT_EQ(names.name_of(0x1000), "signal 0 of renamed's pad");
  names.remove(0x1000, renamed);
  EXPECT_EQ(names.name_of(0x1000), "");
  names.remove(0x1020, second);
}

TEST(SignalNames, ABufferIsCalledWhatItIs) {
  SignalNames& names = SignalNames::get();
  const std::uint64_t id = names.add(0x2000, 8, 8, "AllReduceContext LL", {{"half0.from_rank1", 4, 4}}, "buffer");
  EXPECT_EQ(names.name_of(0x2000 + 5 * 8), "signal 5 of AllReduceContext LL's buffer: half0.from_rank1[1]");
  names.remove(0x2000, id);
}

TEST(SignalNames, TheTimeoutReportSaysWhoseSignalItWaitedOn) {
  WaitTimeoutRecord record{};
  record.published = 1;
  record.rank = 1;
  record.signal_address = 0x1008;
  record.expected = 4;
  record.observed = 3;
  const std::string text = WaitTimeoutReport::describe(record, "signal 1 of AllGatherGemmContext's pad: ready[1]");
  EXPECT_NE(text.find("observed 3 (signal 1 of AllGatherGemmContext's pad: ready[1]); the kernel traps"),
            std::string::npos)
      << text;
  EXPECT_EQ(WaitTimeoutReport::describe(record).find("(signal"), std::string::npos);
}

}  // namespace
}  // namespace tdist
