#include "tdist/error.h"

namespace tdist {

std::string error_prefix(int rank, const std::string& op) {
  std::string prefix = "triton_dist";
  if (rank >= 0) prefix += " [rank " + std::to_string(rank) + "]";
  return prefix + " " + op + ": ";
}

}  // namespace tdist
