// Test helper: the real plugins of this build (STRATA_TEST_PLUGIN_DIR), for the predictor's tests,
// which replay the strategies' own step plans.
#pragma once
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runner/plugin_loader.hpp"

namespace strata {

inline PluginRegistry& installed_plugins() {
  static PluginRegistry registry = [] {
    PluginRegistry r;
    r.scan({STRATA_TEST_PLUGIN_DIR});
    return r;
  }();
  return registry;
}

// Strategy `name` with `options` (KEY -> VALUE) validated against its spec, defaults filled in.
inline std::shared_ptr<Strategy> installed_strategy(
    const std::string& name, const std::map<std::string, std::string>& options) {
  const StrategySpec* spec = nullptr;
  if (!installed_plugins().find(name, &spec))
    throw std::runtime_error("no plugin provides strategy " + name + " in " STRATA_TEST_PLUGIN_DIR);
  std::vector<std::string> kv;
  for (const auto& [k, v] : options) kv.push_back(k + "=" + v);
  return installed_plugins().create(name, validate_options(*spec, kv));
}

}  // namespace strata
