// Where and how a run ran: versions, job, selected environment.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace strata {
std::vector<std::pair<std::string, std::string>> collect_provenance();
std::string utc_timestamp(bool compact = false);  // 2026-11-22T02:48:53Z or 20261122T024853Z
}  // namespace strata
