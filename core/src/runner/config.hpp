// Parsing a run's options into RunConfig (run_config.hpp): CLI > --config FILE > STRATA_*
// environment > default, validated before any rank allocates.
//
// Every option is one row of a table (config_table.cpp): its name, what it accepts, its default
// and help. Each value, from any source, is checked once by its row; the row also yields the values
// it must refuse, which the bad-input suite (tests/unit/test_options.cpp) tries through every
// source, so a new option cannot skip validation or its test.
#pragma once
#include <string>

#include "runner/run_config.hpp"

namespace strata {

// Whether STRATA_<OPTION> sets the option: every option but help and version (requests, not
// settings; a site's module may well set STRATA_VERSION=0.1). STRATA_CONFIG names a config file.
bool option_from_environment(const std::string& name);

// Parse argv, then --config FILE (or STRATA_CONFIG), then STRATA_<OPTION> variables of the
// environment. Throws ConfigError with one line naming the option, where its value came from and
// what is allowed.
RunConfig parse_cli(int argc, char** argv);

// Checks that need the world size (known from the launcher's environment before MPI starts, or from
// --nodes x --ranks-per-node): mesh shape, batch divisibility. Fills mesh.dp/nodes/ranks_per_node.
void resolve_mesh(RunConfig& config, int world_size, int ranks_per_host);

// A run id names a file inside --out: letters, digits, '.', '_', '+', '-', at most 128, not
// starting with '.'. ConfigError naming `source` otherwise.
void check_run_id(const std::string& source, const std::string& run_id);

}  // namespace strata
