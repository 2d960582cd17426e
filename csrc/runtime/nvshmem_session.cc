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

namespace {

NvshmemPlan plan_for_kept(const std::optional<NvshmemSession>& kept, const std::string& members,
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

}  // namespace

NvshmemPlan plan_nvshmem_start(const std::optional<NvshmemSession>& kept, const std::string& members,
                               std::size_t heap_bytes, bool keep_past_finalize, bool brought_up_before) {
  const NvshmemPlan plan = plan_for_kept(kept, members, heap_bytes);
  // Seen with NVSHMEM 3.4.5 on one H200 (2026-12-04): a process whose NVSHMEM was brought up,
  // taken down and brought up again segfaults at exit if the second instance is still up; a
  // first instance left up exits cleanly. Only a kept instance is left up by design.
  if (plan.refusal.empty() && keep_past_finalize && brought_up_before && plan.start != NvshmemStart::kReuse) {
    return {plan.start,
            "keep_nvshmem needs the process's first NVSHMEM instance (one brought up again after a "
            "take-down and left up crashes at exit, NVSHMEM 3.4.5); pass keep_nvshmem from the first "
            "init(), with the largest heap the process will ask for, or start a new process"};
  }
  return plan;
}

}  // namespace tdist
