// Where and how a run ran: versions, job, selected environment.
#pragma once
#include <string>

#include "provenance/providers.hpp"  // Provenance, and what a backend library registers

namespace strata {

// The core's entries, then what each registered provider adds or replaces.
Provenance collect_provenance();
// "strata 0.1.0 (git 3d8959c-dirty)": CMake's project(VERSION) and `git describe --always --dirty`
// at configure time ("unknown" outside a git checkout); runner --version, /provenance.
std::string version_line();
std::string utc_timestamp(bool compact = false);  // 2026-11-22T02:48:53Z or 20261122T024853Z
}  // namespace strata
