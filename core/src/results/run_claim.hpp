// One run per run file: a run claims <out>/<id>.h5 before any work, so that a second run with the
// same --run-id (by mistake, or two at once) is refused instead of replacing the first one's file
// or mixing its --trace timeline with the other's.
#pragma once

#include <string>

namespace strata {

// Claims `run_file` for this process: an exclusive lock on the hidden file ".<id>.h5.claim"
// beside it, held until the process ends (a relaunching runner holds it while it supervises the
// ranks it starts, whose rank 0 finds the claim its job's through STRATA_RUN_CLAIM). A run
// killed with SIGKILL leaves the claim file but not the lock: a stale claim is never in the way.
// Under the claim, an existing run file is refused unless `overwrite`. Throws ConfigError naming
// --run-id when another live run holds the claim, or the file exists. `run_id` is for messages.
void claim_run_file(const std::string& run_file, const std::string& run_id, bool overwrite);

// After the run file is in place: the claim file goes (the lock goes with the process).
void release_run_file_claim(const std::string& run_file);

}  // namespace strata
