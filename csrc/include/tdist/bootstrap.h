// Bootstrap: the out-of-band byte exchange (allgather / broadcast / barrier) that the runtime
// needs before any GPU memory is shared: NVSHMEM's unique id, the allocation-size agreement,
// host names for the local world. Two implementations: TcpBootstrap for pure C++ programs, and
// CallbackBootstrap, through which Python hands over a torch ProcessGroup.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tdist {

// The exchange every implementation provides: allgather (the primitive), and broadcast and
// barrier built on it unless an implementation has faster ones.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  // This process's rank, 0 .. world_size() - 1.
  virtual int rank() const = 0;
  // Number of ranks taking part.
  virtual int world_size() const = 0;

  // Collective: every rank contributes one blob (lengths may differ between ranks); returns all
  // blobs, indexed by rank.
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;

  // Collective: returns root's `data` on every rank (other ranks' `data` is ignored).
  virtual std::string broadcast(const std::string& data, int root);

  // Collective: returns once every rank has entered.
  virtual void barrier();
};

// Settings of TcpBootstrap.
struct TcpBootstrapOptions {
  // How long any one collective (including the first, which waits for every rank to connect)
  // may take before it throws TimeoutError naming the ranks still missing.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

// Star-shaped rendezvous over TCP: rank 0 listens, the others connect to its unique id
// ("ip:port"). Rank 0 opens the listening socket when created, so the unique id can be handed to
// the other ranks (environment, file, MPI, ...) before they start; it accepts them lazily, in the
// first collective.
class TcpBootstrap final : public Bootstrap {
 public:
  // Rank 0. bind_address is an IPv4 address of this host ("127.0.0.1" for loopback, "0.0.0.0"
  // for every interface); port 0 lets the kernel pick one. unique_id() then names an address the
  // other ranks can reach.
  static std::unique_ptr<TcpBootstrap> create_root(int world_size,
                                                   const std::string& bind_address = "0.0.0.0",
                                                   int port = 0,
                                                   TcpBootstrapOptions options = {});

  // Ranks 1..world_size-1: connect to the root's unique id, retrying until options.timeout.
  static std::unique_ptr<TcpBootstrap> connect(int rank, int world_size,
                                               const std::string& unique_id,
                                               TcpBootstrapOptions options = {});

  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const override;
  int world_size() const override;
  // "ip:port" of rank 0's listening socket: what the other ranks pass to connect().
  const std::string& unique_id() const;
  std::vector<std::string> allgather(const std::string& mine) override;

  struct State;  // sockets and sequence numbers; defined in tcp_bootstrap.cc

 private:
  explicit TcpBootstrap(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Adapter for a collective implemented elsewhere (from Python: a torch ProcessGroup). The
// callback receives this rank's blob and must return every rank's blob, indexed by rank.
class CallbackBootstrap final : public Bootstrap {
 public:
  // This rank's blob in, every rank's blob out (indexed by rank).
  using AllgatherFn = std::function<std::vector<std::string>(const std::string&)>;
  // `rank` of `world_size`, exchanging through `allgather`.
  CallbackBootstrap(int rank, int world_size, AllgatherFn allgather);

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::vector<std::string> allgather(const std::string& mine) override;

 private:
  int rank_;
  int world_size_;
  AllgatherFn allgather_;
};

}  // namespace tdist
