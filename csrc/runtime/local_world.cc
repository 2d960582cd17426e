#include "tdist/local_world.h"

#include <unistd.h>

#include "tdist/error.h"

namespace tdist {

LocalWorld compute_local_world(const std::vector<std::string>& host_of_rank, int rank,
                               int declared_local_world_size) {
  const int world = static_cast<int>(host_of_rank.size());
  TDIST_CHECK(rank >= 0 && rank < world, rank, "local_world",
              "rank " << rank << " is outside a world of size " << world);
  LocalWorld out;
  if (declared_local_world_size > 0) {
    TDIST_CHECK(world % declared_local_world_size == 0, rank, "local_world",
                "TRITON_DIST_LOCAL_WORLD_SIZE=" << declared_local_world_size
                                                << " does not divide the world size " << world);
    out.local_world_size = declared_local_world_size;
    out.local_rank = rank % declared_local_world_size;
    out.node = rank / declared_local_world_size;
    out.num_nodes = world / declared_local_world_size;
    return out;
  }
  // Nodes are the runs of equal host names; a host that appears in two runs means ranks were
  // interleaved across hosts, which breaks rank / local_world_size arithmetic everywhere.
  std::vector<std::string> seen;
  int node_start = 0;
  for (int r = 0; r < world; ++r) {
    if (r > 0 && host_of_rank[r] == host_of_rank[r - 1]) continue;
    for (const auto& host : seen) {
      TDIST_CHECK(host != host_of_rank[r], rank, "local_world",
                  "ranks of host " << host << " are not contiguous (rank " << r
                                   << " is there again); launch with one contiguous block of "
                                      "ranks per node");
    }
    seen.push_back(host_of_rank[r]);
    if (r <= rank) node_start = r;
  }
  int node_end = node_start;
  while (node_end < world && host_of_rank[node_end] == host_of_rank[node_start]) ++node_end;
  out.local_rank = rank - node_start;
  out.local_world_size = node_end - node_start;
  out.num_nodes = static_cast<int>(seen.size());
  out.node = 0;
  for (int r = 1; r <= node_start; ++r) out.node += host_of_rank[r] != host_of_rank[r - 1];
  return out;
}

LocalWorld discover_local_world(Bootstrap& bootstrap, int declared_local_world_size) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  auto hosts = bootstrap.allgather(host);
  return compute_local_world(hosts, bootstrap.rank(), declared_local_world_size);
}

}  // namespace tdist
