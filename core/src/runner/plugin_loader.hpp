// Finds, checks and loads strategy plugins (Boost.DLL). A library stays loaded while anything
// created from it lives: strategies hold a reference to their library.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/plugin.hpp"

namespace boost::dll {
class shared_library;
}

namespace strata {

struct LoadedPlugin {
  std::string path;
  std::shared_ptr<boost::dll::shared_library> library;
  const PluginDescriptor* descriptor = nullptr;
  CreateFn* create = nullptr;
};

// Load one plugin file. Throws Error naming the file and the reason: missing, not a loadable
// library, not a strata plugin, or built for another ABI version.
LoadedPlugin load_plugin(const std::string& path);

// `relative` (to the install prefix) from the running executable: <dir of the executable>/../
// `relative`, the same place in the build tree and after cmake --install.
std::string path_from_prefix(const std::string& relative);

// The directory runner finds plugins in with no flags: path_from_prefix("lib/strata/plugins").
std::string default_plugin_dir();

class PluginRegistry {
 public:
  // Load every lib*.so in each directory. Files that fail are kept in problems(), not fatal: one
  // broken plugin must not hide the others; so is each file that looks like a shared library
  // (ELF, or ".so" in its name) but is not named lib*.so, which is not opened.
  void scan(const std::vector<std::string>& dirs);
  const std::vector<LoadedPlugin>& plugins() const { return plugins_; }
  const std::vector<std::string>& problems() const { return problems_; }

  // The plugin and spec that provide strategy `name`, or nullptr.
  const LoadedPlugin* find(const std::string& name, const StrategySpec** spec = nullptr) const;
  std::vector<std::string> strategy_names() const;

  // Create a strategy (options already validated); the result keeps its library loaded.
  std::shared_ptr<Strategy> create(const std::string& name, const Options& options) const;

 private:
  std::vector<LoadedPlugin> plugins_;
  std::vector<std::string> problems_;
};

// Check KEY=VALUE strings against a strategy's declared options; fill defaults. Throws ConfigError
// naming the option and what is allowed.
Options validate_options(const StrategySpec& spec, const std::vector<std::string>& key_values);

// The strategy `name`'s validate() on this configuration, and what only the core can check: an
// expert-parallel group (--mesh ep > 1) is for a strategy that splits the experts over it (its
// step plan's expert_parallel); any other would leave the axis unused. Throws ConfigError.
void validate_strategy(const std::string& name, const Strategy& strategy, const MeshSpec& mesh,
                       const TrainSpec& train, const ModelSpec& model);
// The same, rank 0's plan (made only where ep or cp > 1) asked of `rank0_plan`: the advisor's,
// which makes each of a candidate's plans once.
void validate_strategy(const std::string& name, const Strategy& strategy, const MeshSpec& mesh,
                       const TrainSpec& train, const ModelSpec& model,
                       const std::function<const StepPlan&()>& rank0_plan);

// Human-readable description (for --describe).
std::string describe(const LoadedPlugin& plugin, const StrategySpec& spec);

}  // namespace strata
