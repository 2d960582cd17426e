#include "tdist/nvshmem_session.h"

#include <unistd.h>

#include <climits>

namespace tdist {

std::string this_process_member() {
  char host[HOST_NAME_MAX + 1] = {};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

std::string join_members(const std::vector<std::string>& per_rank) {
  std::string joined;
  for (const std::string& member : per_rank) joined += member + ";";
  return joined;
}

NvshmemPlan plan_nvshmem_start(const std::optional<NvshmemSession>& kept, const std::string& members,
                               std::size_t heap_bytes) {
  if (!kept) return {NvshmemStart::kInitialise, ""};
  if (kept->in_use) {
    return {NvshmemStart::kInitialise,
            "NVSHMEM is still in use by an earlier init() that failed part-way; start a new process"};
  }
  if (kept->members != members) {
    return {NvshmemStart::kInitialise,
            "NVSHMEM is kept up (keep_nvshmem) for the processes of an earlier init() and cannot be "
            "re-initialised for other ones in this process; init() again with the same ranks, start "
            "a new process, or leave keep_nvshmem off"};
  }
  return {heap_bytes <= kept->heap_bytes ? NvshmemStart::kReuse : NvshmemStart::kReinitialise, ""};
}

}  // namespace tdist
