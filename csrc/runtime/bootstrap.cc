#include "tdist/bootstrap.h"

#include "tdist/error.h"

namespace tdist {

std::string Bootstrap::broadcast(const std::string& data, int root) {
  TDIST_CHECK(root >= 0 && root < world_size(), rank(), "bootstrap.broadcast",
              "root " << root << " is not a rank of a world of size " << world_size());
  // Non-roots contribute nothing, so the exchange costs one message of root's size per rank.
  auto all = allgather(rank() == root ? data : std::string());
  return all[root];
}

void Bootstrap::barrier() { allgather(std::string()); }

CallbackBootstrap::CallbackBootstrap(int rank, int world_size, AllgatherFn allgather)
    : rank_(rank), world_size_(world_size), allgather_(std::move(allgather)) {
  TDIST_CHECK(world_size > 0 && rank >= 0 && rank < world_size, rank, "CallbackBootstrap",
              "rank " << rank << " is outside a world of size " << world_size);
  TDIST_CHECK(static_cast<bool>(allgather_), rank, "CallbackBootstrap",
              "no allgather callback was given");
}

std::vector<std::string> CallbackBootstrap::allgather(const std::string& mine) {
  auto all = allgather_(mine);
  TDIST_CHECK(static_cast<int>(all.size()) == world_size_, rank_, "bootstrap.allgather",
              "the allgather callback returned " << all.size() << " blobs for a world of size "
                                                 << world_size_);
  TDIST_CHECK(all[rank_] == mine, rank_, "bootstrap.allgather",
              "the allgather callback did not return this rank's own blob at index " << rank_
                  << "; the process group's rank order must match triton_dist's");
  return all;
}

}  // namespace tdist
