// Which ranks share a node: from host names exchanged over the bootstrap, or from a declared
// local world size (TRITON_DIST_LOCAL_WORLD_SIZE=1 makes every GPU its own node, to exercise
// multi-node code paths on one host).
#pragma once

#include <string>
#include <vector>

#include "tdist/bootstrap.h"

namespace tdist {

// Where a rank stands among the nodes: nodes are contiguous blocks of ranks.
struct LocalWorld {
  int local_rank = 0;        // this rank's index on its node
  int local_world_size = 1;  // ranks on this node
  int node = 0;              // this node's index
  int num_nodes = 1;         // nodes in the world
};

// Pure function of the gathered host names, so it is tested without sockets. Ranks of one host
// must be contiguous (as torchrun and mpirun place them); declared_local_world_size > 0 replaces
// the host names and must divide the world size.
LocalWorld compute_local_world(const std::vector<std::string>& host_of_rank, int rank,
                               int declared_local_world_size);

// Collective: gathers this host's name and calls compute_local_world.
LocalWorld discover_local_world(Bootstrap& bootstrap, int declared_local_world_size);

}  // namespace tdist
