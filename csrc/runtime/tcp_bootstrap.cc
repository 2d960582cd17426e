// TcpBootstrap: rank 0 is the hub of a star. Every collective is one allgather: each other rank
// sends its blob to rank 0, which answers everyone with the full vector. broadcast and barrier
// come from Bootstrap and ride on allgather, so this file only has to get one exchange right.
//
// Wire format (integers are big-endian so that mixed hosts agree):
//   hello    (rank r -> 0, once):  u32 magic, u32 rank, u32 world_size
//   request  (rank r -> 0):        u64 sequence, u64 length, bytes
//   reply    (rank 0 -> r):        u64 sequence, u64 count, count x (u64 length, bytes)
#include "tdist/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <system_error>
#include <thread>
#include <utility>

#include "tdist/error.h"

namespace tdist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kHelloMagic = 0x74644253;  // "tdBS": rejects strangers that find the port
constexpr size_t kHelloSize = 12;
constexpr size_t kHeaderSize = 16;

class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct Deadline {
  Clock::time_point at;
  milliseconds budget;

  explicit Deadline(milliseconds timeout) : at(Clock::now() + timeout), budget(timeout) {}
  // Rounded up so that a few microseconds left do not turn into a busy poll(0) loop.
  int remaining_ms() const {
    auto left = std::chrono::ceil<milliseconds>(at - Clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
  }
  bool expired() const { return Clock::now() >= at; }
};

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

void put_be(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t get_be(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Every socket is non-blocking so that no call can outlive the collective's deadline; this waits
// for readiness instead. Returns false on timeout.
bool wait_for(int fd, short events, const Deadline& deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.remaining_ms());
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the following read/write report the real error
  }
}

enum class Io { kOk, kTimeout, kClosed };

Io read_exact(int fd, char* buf, size_t n, const Deadline& deadline) {
  while (n > 0) {
    ssize_t got = ::recv(fd, buf, n, 0);
    if (got > 0) {
      buf += got;
      n -= static_cast<size_t>(got);
    } else if (got == 0) {
      return Io::kClosed;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLIN, deadline)) return Io::kTimeout;
    } else if (errno != EINTR) {
      return Io::kClosed;  // ECONNRESET and friends: to the caller it is the same dead peer
    }
  }
  return Io::kOk;
}

Io write_all(int fd, const char* buf, size_t n, const Deadline& deadline) {
  while (n > 0) {
    // MSG_NOSIGNAL: a peer that died must surface as an error naming it, not kill us by SIGPIPE.
    ssize_t put = ::send(fd, buf, n, MSG_NOSIGNAL);
    if (put >= 0) {
      buf += put;
      n -= static_cast<size_t>(put);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(fd, POLLOUT, deadline)) return Io::kTimeout;
    } else if (errno != EINTR) {
      return Io::kClosed;
    }
  }
  return Io::kOk;
}

[[noreturn]] void throw_timeout(int rank, const std::string& op, const std::string& what) {
  throw TimeoutError(error_prefix(rank, op) + what);
}

// Other hosts cannot reach 0.0.0.0, so the unique id names the first real interface instead.
std::string reachable_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "127.0.0.1";
  std::string found = "127.0.0.1";
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
    if (!(it->ifa_flags & IFF_UP) || (it->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(it->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text))) {
      found = text;
      break;
    }
  }
  ::freeifaddrs(list);
  return found;
}

}  // namespace

struct TcpBootstrap::State {
  int rank = 0;
  int world_size = 1;
  std::string unique_id;
  TcpBootstrapOptions options;
  FileDescriptor listener;            // rank 0 only
  std::vector<FileDescriptor> peers;  // rank 0 only, indexed by rank; empty until first collective
  FileDescriptor root;                // ranks > 0
  uint64_t sequence = 0;              // number of the collective in progress or last finished
  std::string failure;                // set once a collective failed; the ranks are out of step
};

namespace {

using State = TcpBootstrap::State;
constexpr const char* kGatherOp = "TcpBootstrap.allgather";

// Connections are accepted in whatever order the ranks arrive; the hello says who each one is.
void accept_peers(State& s, const Deadline& deadline) {
  s.peers.resize(s.world_size);
  int joined = 0;
  while (joined < s.world_size - 1) {
    if (!wait_for(s.listener.get(), POLLIN, deadline)) {
      std::vector<int> missing;
      for (int r = 1; r < s.world_size; ++r)
        if (!s.peers[r].valid()) missing.push_back(r);
      throw_timeout(s.rank, kGatherOp,
                    "timed out after " + std::to_string(deadline.budget.count()) +
                        " ms waiting for " + describe_ranks(missing) + " to connect to " +
                        s.unique_id + "; start every rank with the same unique id and world size");
    }
    FileDescriptor fd(::accept(s.listener.get(), nullptr, nullptr));
    if (!fd.valid()) continue;  // the connection went away between poll and accept
    set_nonblocking(fd.get());
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    char hello[kHelloSize];
    Io io = read_exact(fd.get(), hello, kHelloSize, deadline);
    if (io == Io::kTimeout) {
      throw_timeout(s.rank, kGatherOp,
                    "a process connected to " + s.unique_id + " but sent no hello within " +
                        std::to_string(deadline.budget.count()) +
                        " ms; is another program using this port?");
    }
    if (io == Io::kClosed) continue;  // a port scanner or a rank that died at once: not ours yet
    uint32_t magic = static_cast<uint32_t>(get_be(hello, 4));
    int rank = static_cast<int>(get_be(hello + 4, 4));
    int size = static_cast<int>(get_be(hello + 8, 4));
    TDIST_CHECK(magic == kHelloMagic, s.rank, kGatherOp,
                "a process that is not a triton_dist rank connected to "
                    << s.unique_id << "; is another program using this port?");
    TDIST_CHECK(size == s.world_size, s.rank, kGatherOp,
                "rank " << rank << " connected with world size " << size
                        << " but rank 0 was created with world size " << s.world_size
                        << "; start every rank with the same world size");
    TDIST_CHECK(rank >= 1 && rank < s.world_size, s.rank, kGatherOp,
                "a process connected as rank " << rank << ", outside 1.." << s.world_size - 1
                                               << "; give every non-root rank a distinct rank");
    TDIST_CHECK(!s.peers[rank].valid(), s.rank, kGatherOp,
                "two processes connected as rank " << rank << "; give every rank a distinct rank");
    s.peers[rank] = std::move(fd);
    ++joined;
  }
}

std::string closed_by(int peer, uint64_t sequence) {
  return "rank " + std::to_string(peer) + " closed its connection during allgather #" +
         std::to_string(sequence) + " (did it exit or crash?)";
}

std::vector<std::string> root_allgather(State& s, const std::string& mine,
                                        const Deadline& deadline) {
  if (s.peers.empty() && s.world_size > 1) accept_peers(s, deadline);
  std::vector<std::string> all(s.world_size);
  all[0] = mine;

  // Ranks reach the collective at different times; polling all of them keeps a late rank from
  // holding up the reads of those that are already waiting.
  std::vector<int> pending;
  for (int r = 1; r < s.world_size; ++r) pending.push_back(r);
  auto timed_out = [&](const std::string& doing, const std::vector<int>& ranks) {
    throw_timeout(s.rank, kGatherOp,
                  "timed out after " + std::to_string(deadline.budget.count()) + " ms " + doing +
                      " " + describe_ranks(ranks) + " in allgather #" + std::to_string(s.sequence) +
                      "; every rank must call the same collectives in the same order");
  };
  while (!pending.empty()) {
    std::vector<pollfd> fds;
    for (int r : pending) fds.push_back({s.peers[r].get(), POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), deadline.remaining_ms());
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) timed_out("waiting for", pending);
    std::vector<int> still;
    for (size_t i = 0; i < fds.size(); ++i) {
      int r = pending[i];
      if (fds[i].revents == 0) {
        still.push_back(r);
        continue;
      }
      // A rank whose message has begun is read to the end: its rest is already on the way.
      auto late = [&] {
        std::vector<int> ranks = still;
        ranks.insert(ranks.end(), pending.begin() + static_cast<long>(i), pending.end());
        return ranks;
      };
      int fd = s.peers[r].get();
      char header[kHeaderSize];
      Io io = read_exact(fd, header, kHeaderSize, deadline);
      if (io == Io::kTimeout) timed_out("waiting for", late());
      TDIST_CHECK(io == Io::kOk, s.rank, kGatherOp, closed_by(r, s.sequence));
      uint64_t seq = get_be(header, 8);
      TDIST_CHECK(seq == s.sequence, s.rank, kGatherOp,
                  "rank " << r << " is in allgather #" << seq << " while rank 0 is in allgather #"
                          << s.sequence
                          << "; every rank must call the same collectives in the same order");
      all[r].resize(get_be(header + 8, 8));
      io = read_exact(fd, all[r].data(), all[r].size(), deadline);
      if (io == Io::kTimeout) timed_out("waiting for", late());
      TDIST_CHECK(io == Io::kOk, s.rank, kGatherOp, closed_by(r, s.sequence));
    }
    pending = std::move(still);
  }

  // One reply serves every rank, so it is built once however large the world.
  std::string reply;
  put_be(reply, s.sequence, 8);
  put_be(reply, all.size(), 8);
  for (const auto& blob : all) {
    put_be(reply, blob.size(), 8);
    reply += blob;
  }
  for (int r = 1; r < s.world_size; ++r) {
    Io io = write_all(s.peers[r].get(), reply.data(), reply.size(), deadline);
    if (io == Io::kTimeout) {
      std::vector<int> unanswered;
      for (int later = r; later < s.world_size; ++later) unanswered.push_back(later);
      timed_out("sending the result to", unanswered);
    }
    TDIST_CHECK(io == Io::kOk, s.rank, kGatherOp, closed_by(r, s.sequence));
  }
  return all;
}

std::vector<std::string> member_allgather(State& s, const std::string& mine,
                                          const Deadline& deadline) {
  std::string request;
  put_be(request, s.sequence, 8);
  put_be(request, mine.size(), 8);
  request += mine;

  auto check = [&](Io io, const char* doing) {
    if (io == Io::kTimeout) {
      // Rank 0 answers only when every rank has arrived, so the culprit is usually elsewhere.
      throw_timeout(s.rank, kGatherOp,
                    "timed out after " + std::to_string(deadline.budget.count()) + " ms " + doing +
                        " rank 0 (" + s.unique_id + ") in allgather #" +
                        std::to_string(s.sequence) + "; rank 0 waits for all " +
                        std::to_string(s.world_size) +
                        " ranks, so check that every rank was started and reaches this collective");
    }
    TDIST_CHECK(io == Io::kOk, s.rank, kGatherOp,
                "rank 0 (" << s.unique_id << ") closed its connection during allgather #"
                           << s.sequence
                           << "; it probably exited or failed, see its error message");
  };
  int fd = s.root.get();
  check(write_all(fd, request.data(), request.size(), deadline), "sending to");

  char header[kHeaderSize];
  check(read_exact(fd, header, kHeaderSize, deadline), "waiting for");
  uint64_t seq = get_be(header, 8);
  uint64_t count = get_be(header + 8, 8);
  TDIST_CHECK(seq == s.sequence && count == static_cast<uint64_t>(s.world_size), s.rank, kGatherOp,
              "rank 0 answered allgather #" << seq << " with " << count << " blobs, expected #"
                                            << s.sequence << " with " << s.world_size
                                            << "; every rank must call the same collectives");
  std::vector<std::string> all(s.world_size);
  for (auto& blob : all) {
    char length[8];
    check(read_exact(fd, length, sizeof(length), deadline), "waiting for");
    blob.resize(get_be(length, 8));
    check(read_exact(fd, blob.data(), blob.size(), deadline), "waiting for");
  }
  return all;
}

sockaddr_in parse_ipv4(const std::string& ip, int port, int rank, const char* op,
                       const std::string& what) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  TDIST_CHECK(::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) == 1, rank, op,
              what << " '" << ip << "' is not an IPv4 address such as 127.0.0.1");
  return addr;
}

}  // namespace

TcpBootstrap::TcpBootstrap(std::unique_ptr<State> state) : state_(std::move(state)) {}
TcpBootstrap::~TcpBootstrap() = default;

int TcpBootstrap::rank() const { return state_->rank; }
int TcpBootstrap::world_size() const { return state_->world_size; }
const std::string& TcpBootstrap::unique_id() const { return state_->unique_id; }

std::unique_ptr<TcpBootstrap> TcpBootstrap::create_root(int world_size,
                                                        const std::string& bind_address, int port,
                                                        TcpBootstrapOptions options) {
  constexpr const char* op = "TcpBootstrap.create_root";
  TDIST_CHECK(world_size >= 1, 0, op, "world size must be at least 1, got " << world_size);
  TDIST_CHECK(port >= 0 && port <= 65535, 0, op,
              "port " << port << " is outside 0..65535; pass 0 to let the system pick one");
  TDIST_CHECK(options.timeout.count() > 0, 0, op, "the timeout must be positive");
  sockaddr_in addr = parse_ipv4(bind_address, port, 0, op, "bind address");

  auto s = std::make_unique<State>();
  s->rank = 0;
  s->world_size = world_size;
  s->options = options;
  s->listener = FileDescriptor(::socket(AF_INET, SOCK_STREAM, 0));
  TDIST_CHECK(s->listener.valid(), 0, op, "socket() failed: " << errno_text(errno));
  int fd = s->listener.get();
  int one = 1;
  // A restarted job can reuse its fixed port at once instead of waiting out TIME_WAIT.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int bind_error = errno;
  TDIST_CHECK(bound == 0, 0, op,
              "cannot bind " << bind_address << ":" << port << ": " << errno_text(bind_error)
                             << "; pick another port (0 lets the system choose) or an address "
                                "of this host");
  TDIST_CHECK(::listen(fd, SOMAXCONN) == 0, 0, op, "listen() failed: " << errno_text(errno));
  set_nonblocking(fd);

  socklen_t len = sizeof(addr);
  TDIST_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0, 0, op,
              "getsockname() failed: " << errno_text(errno));
  std::string host = bind_address == "0.0.0.0" ? reachable_address() : bind_address;
  s->unique_id = host + ":" + std::to_string(ntohs(addr.sin_port));
  return std::unique_ptr<TcpBootstrap>(new TcpBootstrap(std::move(s)));
}

std::unique_ptr<TcpBootstrap> TcpBootstrap::connect(int rank, int world_size,
                                                    const std::string& unique_id,
                                                    TcpBootstrapOptions options) {
  constexpr const char* op = "TcpBootstrap.connect";
  TDIST_CHECK(world_size >= 2 && rank >= 1 && rank < world_size, rank, op,
              "rank " << rank << " cannot connect in a world of size " << world_size
                      << "; non-root ranks are 1..world_size-1 and rank 0 uses create_root");
  TDIST_CHECK(options.timeout.count() > 0, rank, op, "the timeout must be positive");
  auto colon = unique_id.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    const char* first = unique_id.data() + colon + 1;
    const char* last = unique_id.data() + unique_id.size();
    auto [end, ec] = std::from_chars(first, last, port);
    if (ec != std::errc() || end != last || first == last) port = -1;
  }
  TDIST_CHECK(colon != std::string::npos && port >= 1 && port <= 65535, rank, op,
              "malformed unique id '" << unique_id
                                      << "': expected \"ip:port\" as returned by rank 0's "
                                         "TcpBootstrap::unique_id()");
  sockaddr_in addr =
      parse_ipv4(unique_id.substr(0, colon), port, rank, op, "unique id '" + unique_id + "': host");

  auto s = std::make_unique<State>();
  s->rank = rank;
  s->world_size = world_size;
  s->unique_id = unique_id;
  s->options = options;

  // Rank 0 may start after us, so a refused connection only means "not yet".
  Deadline deadline(options.timeout);
  milliseconds backoff(50);
  int last_error = 0;
  for (;;) {
    FileDescriptor fd(::socket(AF_INET, SOCK_STREAM, 0));
    TDIST_CHECK(fd.valid(), rank, op, "socket() failed: " << errno_text(errno));
    set_nonblocking(fd.get());
    int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    last_error = rc == 0 ? 0 : errno;
    if (last_error == EINPROGRESS) {
      // A non-blocking connect keeps an unreachable host from stalling us past the deadline.
      if (wait_for(fd.get(), POLLOUT, deadline)) {
        socklen_t len = sizeof(last_error);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &last_error, &len);
      } else {
        last_error = ETIMEDOUT;
      }
    }
    if (last_error == 0) {
      s->root = std::move(fd);
      break;
    }
    if (deadline.expired()) break;
    std::this_thread::sleep_for(std::min(backoff, milliseconds(deadline.remaining_ms())));
    backoff = std::min(backoff * 2, milliseconds(500));
  }
  if (!s->root.valid()) {
    throw_timeout(rank, op,
                  "could not reach rank 0 at " + unique_id + " within " +
                      std::to_string(options.timeout.count()) +
                      " ms (last error: " + errno_text(last_error) +
                      "); rank 0 must be started with create_root and the same world size (" +
                      std::to_string(world_size) + "), and this must be its unique_id()");
  }

  int one = 1;
  ::setsockopt(s->root.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::string hello;
  put_be(hello, kHelloMagic, 4);
  put_be(hello, static_cast<uint32_t>(rank), 4);
  put_be(hello, static_cast<uint32_t>(world_size), 4);
  Io io = write_all(s->root.get(), hello.data(), hello.size(), deadline);
  TDIST_CHECK(io == Io::kOk, rank, op,
              "could not send the hello to rank 0 at "
                  << unique_id << ": the connection "
                  << (io == Io::kTimeout ? "stalled" : "closed"));
  return std::unique_ptr<TcpBootstrap>(new TcpBootstrap(std::move(s)));
}

std::vector<std::string> TcpBootstrap::allgather(const std::string& mine) {
  State& s = *state_;
  TDIST_CHECK(s.failure.empty(), s.rank, kGatherOp,
              "an earlier collective failed, so the ranks are out of step; create a new bootstrap "
              "on every rank (earlier error: "
                  << s.failure << ")");
  ++s.sequence;
  Deadline deadline(s.options.timeout);
  try {
    if (s.rank == 0) return root_allgather(s, mine, deadline);
    return member_allgather(s, mine, deadline);
  } catch (const Error& e) {
    s.failure = e.what();
    throw;
  }
}

}  // namespace tdist
