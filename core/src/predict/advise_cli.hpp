// `runner --advise` (advisor.hpp): the request from the runner's options, the strategies from the
// plugins found, the table printed. Every input is checked before any prediction: a bad one is a
// ConfigError (one line naming the option, exit 2).
#pragma once
#include "runner/plugin_loader.hpp"
#include "runner/run_config.hpp"

namespace strata {

// Prints the advice; returns the exit code (0, or 4 when no configuration fits).
int advise_from_config(const RunConfig& config, const PluginRegistry& registry);

}  // namespace strata
