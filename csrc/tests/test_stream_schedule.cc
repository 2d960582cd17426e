#include <gtest/gtest.h>

#include <cstdint>

#include "tdist/error.h"
#include "tdist/stream_schedule.h"

namespace tdist {
namespace {

// Recording needs no GPU: these pin how operations turn into driver calls.
std::uint64_t* flag(std::uintptr_t i) { return reinterpret_cast<std::uint64_t*>(0x1000 + 8 * i); }
void* buffer(std::uintptr_t i) { return reinterpret_cast<void*>(0x100000 * (i + 1)); }

TEST(StreamSchedule, ConsecutiveWaitsAndWritesShareOneBatch) {
  StreamSchedule s;
  s.wait_value64(flag(0), 1);
  s.write_value64(flag(0), 0);
  s.wait_value64(flag(1), 1);
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.driver_calls(), 1u);
}

TEST(StreamSchedule, CopiesSplitBatchesAndKeepTheirPlace) {
  StreamSchedule s;
  s.wait_value64(flag(0), 1);
  s.copy(buffer(0), buffer(1), 4096);
  s.write_value64(flag(1), 1);
  s.copy_2d(buffer(2), 512, buffer(3), 1024, 256, 8);
  s.write_value64(flag(2), 1);
  s.wait_value64(flag(3), 1);
  EXPECT_EQ(s.size(), 6u);
  EXPECT_EQ(s.driver_calls(), 5u);  // batch, copy, batch, copy, batch of two
}

TEST(StreamSchedule, WaitsCompareAsAsked) {
  EXPECT_EQ(stream_wait_flags(StreamWait::kAtLeast), static_cast<unsigned>(CU_STREAM_WAIT_VALUE_GEQ));
  EXPECT_EQ(stream_wait_flags(StreamWait::kEqual), static_cast<unsigned>(CU_STREAM_WAIT_VALUE_EQ));
  StreamSchedule s;
  s.wait_value64(flag(0), 3, StreamWait::kEqual);
  s.wait_value64(flag(1), 3);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.driver_calls(), 1u);
}

TEST(StreamSchedule, BatchesStopBelowTheDriversLimit) {
  StreamSchedule s;
  for (std::size_t i = 0; i < StreamSchedule::kMaxBatch + 1; ++i) s.write_value64(flag(i), 1);
  EXPECT_EQ(s.driver_calls(), 2u);
  EXPECT_LT(StreamSchedule::kMaxBatch, 256u);
}

TEST(StreamSchedule, ThreeDriverCallsOrMoreLaunchAsOneGraph) {
  StreamSchedule s;
  s.wait_value64(flag(0), 1);
  s.copy(buffer(0), buffer(1), 4096);
  EXPECT_FALSE(s.launches_as_graph());  // two calls: a graph launch would save nothing
  s.write_value64(flag(1), 1);
  EXPECT_EQ(s.driver_calls(), StreamSchedule::kGraphMinDriverCalls);
  EXPECT_TRUE(s.launches_as_graph());
  EXPECT_EQ(s.graphs(), 0u);  // made at the first graph enqueue, on a GPU
  EXPECT_TRUE(s.graph_failure().empty());
  StreamSchedule empty;
  EXPECT_FALSE(empty.launches_as_graph());
}

TEST(StreamSchedule, EmptyCopiesAreDropped) {
  StreamSchedule s;
  s.copy(buffer(0), buffer(1), 0);
  s.copy_2d(buffer(0), 64, buffer(1), 64, 0, 4);
  s.copy_2d(buffer(0), 64, buffer(1), 64, 64, 0);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.driver_calls(), 0u);
}

TEST(StreamSchedule, PitchBelowTheRowIsRejected) {
  StreamSchedule s;
  try {
    s.copy_2d(buffer(0), 64, buffer(1), 256, 128, 2);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("StreamSchedule.copy_2d"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pitches"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.size(), 0u);
}

}  // namespace
}  // namespace tdist
