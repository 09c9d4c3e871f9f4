// The run itself on one rank: groups, data, model, the strategy's setup and steps, measurement,
// and (on rank 0) the run file.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "run/run_state.hpp"
#include "runner/run_config.hpp"
#include "runner/plugin_loader.hpp"
#include "strata/comm.hpp"

namespace strata {

// Run the configured strategy (MPI already initialised). Throws on failure; `state` then holds
// what is known for the failure file.
class Watchdog;
void train(const RunConfig& config, const PluginRegistry& registry, RunState& state,
           Watchdog& watchdog);

// Start the run record: header, config and provenance on every rank (no communication, so that a
// failure from here on has its run file).
void begin_record(const RunConfig& config, RunState& state);
// Collective: the hostnames and node topologies on rank 0.
void gather_record_hosts(RunState& state);

}  // namespace strata
