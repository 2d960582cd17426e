// TcpBootstrap across real processes on loopback. Rank 0 lives in the test process and creates
// its listener before forking, so every child already knows the unique id; children report
// through their exit code and never return into GoogleTest.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tdist/bootstrap.h"
#include "tdist/error.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using tdist::TcpBootstrap;
using tdist::TcpBootstrapOptions;

TcpBootstrapOptions with_timeout(std::chrono::milliseconds timeout) {
  TcpBootstrapOptions options;
  options.timeout = timeout;
  return options;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Inside a child there is no GoogleTest to report to, so failures become exceptions and, through
// the exit code, a failed EXPECT in the parent.
void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// Forked ranks; whatever a test leaves running (a failed ASSERT returns early) is killed and
// reaped so that no child outlives its test.
class Children {
 public:
  ~Children() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  void spawn(const std::function<void()>& body) {
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        body();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d failed: %s\n", static_cast<int>(::getpid()), e.what());
        code = 1;
      } catch (...) {
        code = 2;
      }
      ::_exit(code);
    }
    ASSERT_GT(pid, 0) << "fork failed";
    pids_.push_back(pid);
  }

  // Exit codes in spawn order (-1 for a child killed by a signal or still running at the limit).
  std::vector<int> wait_all(std::chrono::seconds limit = 20s) {
    std::vector<int> codes;
    auto give_up = Clock::now() + limit;
    for (pid_t pid : pids_) {
      int status = 0;
      pid_t done = 0;
      while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < give_up)
        std::this_thread::sleep_for(10ms);
      if (done == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        codes.push_back(-1);
      } else {
        codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      }
    }
    pids_.clear();
    return codes;
  }

 private:
  std::vector<pid_t> pids_;
};

// Lengths differ by rank (rank 0 sends nothing, rank 1 a whole MiB) and contents by round, so a
// blob delivered to the wrong slot or from the wrong round is caught.
std::string make_blob(int rank, int round) {
  size_t length = rank == 0 ? 0 : rank == 1 ? (1u << 20) : static_cast<size_t>(13 * round + rank);
  std::string blob(length, '\0');
  for (size_t i = 0; i < length; ++i)
    blob[i] = static_cast<char>((i * 31 + static_cast<size_t>(rank) * 7 + round * 101) & 0xff);
  return blob;
}

std::string broadcast_payload() { return "broadcast from rank 2: " + std::string(1000, 'b'); }

constexpr int kRounds = 50;
constexpr int kWorld = 4;

// The sequence every rank runs, so that children and the parent check the very same things.
void run_collectives(tdist::Bootstrap& boot) {
  int rank = boot.rank();
  for (int round = 0; round < kRounds; ++round) {
    auto all = boot.allgather(make_blob(rank, round));
    require(static_cast<int>(all.size()) == kWorld, "allgather returned the wrong count");
    for (int r = 0; r < kWorld; ++r)
      require(all[r] == make_blob(r, round),
              "round " + std::to_string(round) + ": wrong blob from rank " + std::to_string(r));
  }
  std::string got = boot.broadcast(rank == 2 ? broadcast_payload() : "ignored", 2);
  require(got == broadcast_payload(), "broadcast from rank 2 delivered the wrong data");
  boot.barrier();
  auto after = boot.allgather(std::to_string(rank));
  for (int r = 0; r < kWorld; ++r)
    require(after[r] == std::to_string(r), "allgather after barrier is out of step");
}

TEST(TcpBootstrap, AllgatherBroadcastBarrierAcrossFourRanks) {
  auto root = TcpBootstrap::create_root(kWorld, "127.0.0.1", 0, with_timeout(15s));
  ASSERT_EQ(root->rank(), 0);
  ASSERT_EQ(root->world_size(), kWorld);
  ASSERT_TRUE(contains(root->unique_id(), "127.0.0.1:"));
  std::string id = root->unique_id();
  Children children;
  for (int rank = 1; rank < kWorld; ++rank) {
    children.spawn([&, rank] {
      auto boot = TcpBootstrap::connect(rank, kWorld, id, with_timeout(15s));
      require(boot->rank() == rank && boot->world_size() == kWorld, "wrong rank or size");
      run_collectives(*boot);
    });
  }
  try {
    run_collectives(*root);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank 0: " << e.what();
  }
  root.reset();  // had rank 0 failed, its closed sockets release the children at once
  auto codes = children.wait_all();
  for (size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "rank " << i + 1;
}

TEST(TcpBootstrap, WorldSizeOneNeedsNoPeers) {
  auto root = TcpBootstrap::create_root(1, "127.0.0.1", 0, with_timeout(500ms));
  auto all = root->allgather("alone");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], "alone");
  EXPECT_EQ(root->broadcast("x", 0), "x");
  root->barrier();
  EXPECT_THROW(root->broadcast("x", 1), tdist::Error);
}

TEST(TcpBootstrap, AnyAddressGivesAReachableUniqueId) {
  auto root = TcpBootstrap::create_root(1, "0.0.0.0", 0);
  EXPECT_FALSE(contains(root->unique_id(), "0.0.0.0")) << root->unique_id();
  EXPECT_TRUE(contains(root->unique_id(), ":")) << root->unique_id();
}

TEST(TcpBootstrap, RootTimesOutNamingTheMissingRank) {
  auto root = TcpBootstrap::create_root(3, "127.0.0.1", 0, with_timeout(500ms));
  std::string id = root->unique_id();
  // Rank 1 reports its connection through a pipe, so that a slow fork cannot make it look missing.
  int connected[2];
  ASSERT_EQ(::pipe(connected), 0);
  Children children;
  children.spawn([&] {
    auto boot = TcpBootstrap::connect(1, 3, id, with_timeout(5s));
    require(::write(connected[1], "c", 1) == 1, "cannot signal the parent");
    // Rank 0 gives up and closes; rank 1 must then fail rather than wait for its own timeout.
    try {
      boot->allgather("one");
    } catch (const tdist::TimeoutError&) {
      throw std::runtime_error("rank 1 timed out instead of seeing rank 0 leave");
    } catch (const tdist::Error& e) {
      require(contains(e.what(), "rank 0"), std::string("unexpected message: ") + e.what());
      return;
    }
    throw std::runtime_error("rank 1's allgather succeeded without rank 2");
  });
  ::close(connected[1]);  // so that a child dying before it writes gives end-of-file, not a hang
  char byte = 0;
  ASSERT_EQ(::read(connected[0], &byte, 1), 1) << "rank 1 exited before connecting";
  ::close(connected[0]);
  auto start = Clock::now();
  try {
    root->allgather("zero");
    ADD_FAILURE() << "allgather succeeded although rank 2 never connected";
  } catch (const tdist::TimeoutError& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "rank 2")) << what;
    EXPECT_FALSE(contains(what, "ranks 1")) << what;
    EXPECT_TRUE(contains(what, id)) << what;
  }
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 400ms);
  EXPECT_LT(elapsed, 5s);
  // A bootstrap that failed once is out of step and must say so instead of trying again.
  EXPECT_THROW(root->allgather("again"), tdist::Error);
  root.reset();
  EXPECT_EQ(children.wait_all()[0], 0);
}

TEST(TcpBootstrap, ConnectTimesOutWhenNothingListens) {
  // A bound socket that never listens reserves a port on which every connect is refused.
  int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string id = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  auto start = Clock::now();
  try {
    TcpBootstrap::connect(1, 2, id, with_timeout(300ms));
    ADD_FAILURE() << "connect succeeded with nothing listening on " << id;
  } catch (const tdist::TimeoutError& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, id)) << what;
    EXPECT_TRUE(contains(what, "rank 1")) << what;
    EXPECT_TRUE(contains(what, "world size")) << what;
  }
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, 250ms);
  EXPECT_LT(elapsed, 3s);
  ::close(holder);
}

TEST(TcpBootstrap, WorldSizeMismatchNamesBothSizes) {
  auto root = TcpBootstrap::create_root(2, "127.0.0.1", 0, with_timeout(3s));
  std::string id = root->unique_id();
  Children children;
  children.spawn([&] {
    auto boot = TcpBootstrap::connect(1, 3, id, with_timeout(3s));
    try {
      boot->allgather("wrong world");
    } catch (const tdist::TimeoutError&) {
      throw std::runtime_error("the rejected rank timed out instead of seeing rank 0 close");
    } catch (const tdist::Error&) {
      return;
    }
    throw std::runtime_error("allgather succeeded in a world of mismatched size");
  });
  try {
    root->allgather("root");
    ADD_FAILURE() << "rank 0 accepted a rank with another world size";
  } catch (const tdist::TimeoutError& e) {
    ADD_FAILURE() << "expected a mismatch error, got a timeout: " << e.what();
  } catch (const tdist::Error& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "world size 3")) << what;
    EXPECT_TRUE(contains(what, "world size 2")) << what;
    EXPECT_TRUE(contains(what, "rank 1")) << what;
  }
  EXPECT_EQ(children.wait_all()[0], 0);
}

TEST(TcpBootstrap, PeerThatExitsMidRunIsNamedNotWaitedFor) {
  auto root = TcpBootstrap::create_root(3, "127.0.0.1", 0, with_timeout(10s));
  std::string id = root->unique_id();
  Children children;
  children.spawn([&] {
    auto boot = TcpBootstrap::connect(1, 3, id, with_timeout(10s));
    for (int i = 0; i < 2; ++i) boot->allgather("one");
    try {
      boot->allgather("one");
    } catch (const tdist::TimeoutError&) {
      throw std::runtime_error("rank 1 timed out instead of seeing rank 0 leave");
    } catch (const tdist::Error&) {
      return;
    }
    throw std::runtime_error("allgather #3 succeeded without rank 2");
  });
  children.spawn([&] {
    auto boot = TcpBootstrap::connect(2, 3, id, with_timeout(10s));
    for (int i = 0; i < 2; ++i) boot->allgather("two");
    ::_exit(0);  // vanish without a word, as a crashed rank would
  });
  for (int i = 0; i < 2; ++i) ASSERT_EQ(root->allgather("zero").size(), 3u);
  auto start = Clock::now();
  try {
    root->allgather("zero");
    ADD_FAILURE() << "allgather #3 succeeded although rank 2 exited";
  } catch (const tdist::TimeoutError& e) {
    ADD_FAILURE() << "rank 0 waited for the dead rank until its timeout: " << e.what();
  } catch (const tdist::Error& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "rank 2 closed its connection")) << what;
    EXPECT_TRUE(contains(what, "allgather #3")) << what;
  }
  EXPECT_LT(Clock::now() - start, 5s);
  root.reset();
  auto codes = children.wait_all();
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(TcpBootstrap, RejectsMalformedUniqueIds) {
  for (const char* id : {"", "127.0.0.1", "127.0.0.1:", ":1234", "127.0.0.1:abc", "127.0.0.1:0",
                         "127.0.0.1:65536", "127.0.0.1:12x", "not-an-ip:1234", "1.2.3:80"}) {
    try {
      TcpBootstrap::connect(1, 2, id, with_timeout(200ms));
      ADD_FAILURE() << "accepted unique id '" << id << "'";
    } catch (const tdist::TimeoutError& e) {
      ADD_FAILURE() << "'" << id << "' should be rejected up front, not time out: " << e.what();
    } catch (const tdist::Error& e) {
      EXPECT_TRUE(contains(e.what(), "TcpBootstrap.connect")) << e.what();
      EXPECT_TRUE(contains(e.what(), "unique id")) << e.what();
    }
  }
}

TEST(TcpBootstrap, RejectsOutOfRangeRanksSizesAndPorts) {
  // Short timeouts keep this test quick even if a check regressed into a connection attempt.
  const std::string id = "127.0.0.1:1234";
  const auto quick = with_timeout(200ms);
  EXPECT_THROW(TcpBootstrap::connect(0, 2, id, quick), tdist::Error);  // rank 0: create_root
  EXPECT_THROW(TcpBootstrap::connect(2, 2, id, quick), tdist::Error);
  EXPECT_THROW(TcpBootstrap::connect(-1, 2, id, quick), tdist::Error);
  EXPECT_THROW(TcpBootstrap::connect(1, 1, id, quick), tdist::Error);
  EXPECT_THROW(TcpBootstrap::create_root(0, "127.0.0.1"), tdist::Error);
  EXPECT_THROW(TcpBootstrap::create_root(2, "127.0.0.1", -1), tdist::Error);
  EXPECT_THROW(TcpBootstrap::create_root(2, "127.0.0.1", 65536), tdist::Error);
  try {
    TcpBootstrap::create_root(2, "localhost.invalid");
    ADD_FAILURE() << "accepted a bind address that is not an IPv4 address";
  } catch (const tdist::Error& e) {
    EXPECT_TRUE(contains(e.what(), "localhost.invalid")) << e.what();
    EXPECT_TRUE(contains(e.what(), "TcpBootstrap.create_root")) << e.what();
  }
  try {
    TcpBootstrap::connect(5, 3, id, quick);
    ADD_FAILURE() << "accepted rank 5 in a world of 3";
  } catch (const tdist::Error& e) {
    EXPECT_TRUE(contains(e.what(), "rank 5")) << e.what();
  }
}

}  // namespace
