// Where and how a run ran: versions, job, selected environment.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace strata {
using Provenance = std::vector<std::pair<std::string, std::string>>;

// What collect_provenance() adds from a backend that strata_core does not link (the CUDA one:
// strata_cuda registers its versions from the runner, as the NCCL transport registers itself).
// A provider's key replaces the core's entry of the same name (e.g. cuda_version "not built").
using ProvenanceProvider = Provenance (*)();
void register_provenance_provider(ProvenanceProvider provider);

Provenance collect_provenance();
// "strata 0.1.0 (git 3d8959c-dirty)": CMake's project(VERSION) and `git describe --always --dirty`
// at configure time ("unknown" outside a git checkout); runner --version, /provenance.
std::string version_line();
std::string utc_timestamp(bool compact = false);  // 2026-11-22T02:48:53Z or 20261122T024853Z
}  // namespace strata
