#include "runner/plugin_loader.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace strata {

static Error plugin_error(const std::string& path, const std::string& reason,
                          const std::string& hint) {
  return Error("plugin " + path + ": " + reason, hint);
}

LoadedPlugin load_plugin(const std::string& path) {
  if (!fs::exists(path))
    throw plugin_error(path, "file not found", "check --plugin-path, or rebuild the plugins");
  LoadedPlugin p;
  p.path = path;
  try {
    p.library = std::make_shared<boost::dll::shared_library>(
        path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw plugin_error(path, std::string("not a loadable shared library (") + e.what() + ")",
                       "rebuild it against this strata, or remove it from the plugin directory");
  }
  if (!p.library->has("strata_abi_version") || !p.library->has("strata_descriptor") ||
      !p.library->has("strata_create"))
    throw plugin_error(
        path, "not a strata plugin (no strata_abi_version/strata_descriptor/strata_create exports)",
        "export them with STRATA_PLUGIN(descriptor, create) from <strata/plugin.hpp>");
  // Read the version before touching anything whose layout depends on it.
  const std::uint32_t abi = p.library->get_alias<const std::uint32_t>("strata_abi_version");
  if (abi != kPluginAbiVersion)
    throw plugin_error(path,
                       "built for plugin ABI version " + std::to_string(abi) +
                           ", this runner has " + std::to_string(kPluginAbiVersion),
                       "rebuild the plugin against this strata's SDK headers");
  p.descriptor = &p.library->get_alias<const PluginDescriptor&()>("strata_descriptor")();
  p.create = &p.library->get_alias<CreateFn>("strata_create");
  if (p.descriptor->abi_version != kPluginAbiVersion)
    throw plugin_error(path, "descriptor ABI version disagrees with strata_abi_version",
                       "rebuild the plugin");
  return p;
}

std::string path_from_prefix(const std::string& relative) {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return relative;
  return (exe.parent_path().parent_path() / relative).lexically_normal().string();
}

std::string default_plugin_dir() { return path_from_prefix(STRATA_PLUGIN_RELDIR); }

// A file the loader does not open but that looks like a shared library (ELF, or ".so" in its name):
// most likely a plugin named otherwise (strata_x.so, libx.so.1), worth a line rather than silence.
// Other files (a build directory's CMakeCache.txt, a README) are passed over without one.
static bool looks_like_library(const fs::path& f) {
  if (f.filename().string().find(".so") != std::string::npos) return true;
  std::ifstream in(f, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' &&
         magic[3] == 'F';
}

void PluginRegistry::scan(const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      problems_.push_back("plugin directory " + dir + ": not a directory");
      continue;
    }
    std::vector<fs::path> files, misnamed;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const fs::path& f = entry.path();
      if (!entry.is_regular_file()) continue;
      if (f.extension() == ".so" && f.filename().string().rfind("lib", 0) == 0)
        files.push_back(f);
      else if (looks_like_library(f))
        misnamed.push_back(f);
    }
    std::sort(misnamed.begin(), misnamed.end());
    for (const fs::path& f : misnamed)
      problems_.push_back("plugin " + f.string() +
                          ": not named lib<name>.so, so not loaded (plugins are opened only as "
                          "lib*.so; strata_add_plugin() names them so)");
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      try {
        LoadedPlugin p = load_plugin(f.string());
        bool duplicate = false;
        for (const StrategySpec& s : p.descriptor->strategies)
          if (find(s.name)) {
            problems_.push_back("plugin " + f.string() + ": strategy '" + s.name +
                                "' is already provided by " + find(s.name)->path + "; skipped");
            duplicate = true;
          }
        if (!duplicate) plugins_.push_back(std::move(p));
      } catch (const Error& e) {
        problems_.push_back(e.what());
      }
    }
  }
}

const LoadedPlugin* PluginRegistry::find(const std::string& name, const StrategySpec** spec) const {
  for (const LoadedPlugin& p : plugins_)
    for (const StrategySpec& s : p.descriptor->strategies)
      if (s.name == name) {
        if (spec) *spec = &s;
        return &p;
      }
  return nullptr;
}

std::vector<std::string> PluginRegistry::strategy_names() const {
  std::vector<std::string> names;
  for (const LoadedPlugin& p : plugins_)
    for (const StrategySpec& s : p.descriptor->strategies) names.push_back(s.name);
  return names;
}

std::shared_ptr<Strategy> PluginRegistry::create(const std::string& name,
                                                 const Options& options) const {
  const LoadedPlugin* p = find(name);
  if (!p) throw ConfigError("--plugin " + name + ": no such strategy");
  std::unique_ptr<Strategy> s = (*p->create)(name, options);
  if (!s) throw Error("plugin " + p->path + ": factory returned nothing for " + name);
  auto library = p->library;  // released only after the strategy is destroyed
  return std::shared_ptr<Strategy>(s.release(), [library](Strategy* x) { delete x; });
}

// Plugins keep integer options in an int: a value beyond it would wrap (2147483648 read as
// -2147483648) before the plugin could check it.
constexpr long long kMinOptionInteger = -2147483648LL, kMaxOptionInteger = 2147483647LL;

static bool parses_as(OptionType t, const std::string& v, const std::vector<std::string>& choices) {
  try {
    std::size_t used = 0;
    switch (t) {
      case OptionType::integer: {
        const long long x = std::stoll(v, &used);
        return used == v.size() && x >= kMinOptionInteger && x <= kMaxOptionInteger;
      }
      case OptionType::real: {  // finite: no inf or nan
        const double x = std::stod(v, &used);
        return used == v.size() && std::isfinite(x);
      }
      case OptionType::boolean:
        return v == "true" || v == "false" || v == "on" || v == "off" || v == "1" || v == "0" ||
               v == "yes" || v == "no";
      case OptionType::choice:
        return std::find(choices.begin(), choices.end(), v) != choices.end();
      case OptionType::string:
        return true;
    }
  } catch (...) {
  }
  return false;
}

static std::string allowed(const OptionSpec& o) {
  switch (o.type) {
    case OptionType::integer:
      return "a whole number in " + std::to_string(kMinOptionInteger) + ".." +
             std::to_string(kMaxOptionInteger);
    case OptionType::real:
      return "a finite number";
    case OptionType::boolean:
      return "true or false";
    case OptionType::string:
      return "any string";
    case OptionType::choice: {
      std::string s = "one of";
      for (const auto& c : o.choices) s += " " + c;
      return s;
    }
  }
  return "";
}

Options validate_options(const StrategySpec& spec, const std::vector<std::string>& key_values) {
  std::map<std::string, std::string> values;
  for (const OptionSpec& o : spec.options) values[o.name] = o.default_value;
  std::vector<std::string> given;
  for (const std::string& kv : key_values) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("--plugin-opt " + kv + ": expected KEY=VALUE");
    std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    auto it = std::find_if(spec.options.begin(), spec.options.end(),
                           [&](const OptionSpec& o) { return o.name == key; });
    if (it == spec.options.end()) {
      std::string known;
      for (const OptionSpec& o : spec.options) known += (known.empty() ? "" : ", ") + o.name;
      throw ConfigError("--plugin-opt " + key + ": strategy " + spec.name +
                        " has no such option (it has: " + (known.empty() ? "none" : known) + ")");
    }
    if (!parses_as(it->type, value, it->choices))
      throw ConfigError("--plugin-opt " + key + "=" + value + ": must be " + allowed(*it));
    if (std::find(given.begin(), given.end(), key) != given.end())
      throw ConfigError("--plugin-opt " + key + "=" + value + ": " + key +
                        " is given twice (first " + key + "=" + values[key] + ")");
    given.push_back(key);
    values[key] = value;
  }
  return Options(std::move(values));
}

std::string describe(const LoadedPlugin& plugin, const StrategySpec& spec) {
  std::ostringstream out;
  out << spec.name << " — " << spec.summary << "\n";
  out << "  family  " << plugin.descriptor->family << " (" << plugin.descriptor->summary << ")\n";
  out << "  plugin  " << plugin.path << " (ABI " << plugin.descriptor->abi_version << ")\n";
  if (spec.options.empty())
    out << "  options none\n";
  else
    out << "  options (--plugin-opt KEY=VALUE)\n";
  for (const OptionSpec& o : spec.options) {
    out << "    " << o.name << " <" << option_type_name(o.type) << ">  default " << o.default_value
        << "\n        " << o.help;
    if (o.type == OptionType::choice) out << " (" << allowed(o) << ")";
    out << "\n";
  }
  return out.str();
}

void validate_strategy(const std::string& name, const Strategy& strategy, const MeshSpec& mesh,
                       const TrainSpec& train, const ModelSpec& model) {
  StepPlan plan;
  validate_strategy(name, strategy, mesh, train, model, [&]() -> const StepPlan& {
    return plan = strategy.plan_step(PredictInput{mesh, model, train, 0});
  });
}

void validate_strategy(const std::string& name, const Strategy& strategy, const MeshSpec& mesh,
                       const TrainSpec& train, const ModelSpec& model,
                       const std::function<const StepPlan&()>& rank0_plan) {
  strategy.validate(mesh, train, model);
  if (mesh.ep == 1 && mesh.cp == 1) return;
  const StepPlan& plan = rank0_plan();
  if (mesh.ep > 1 && plan.expert_parallel != mesh.ep)
    throw ConfigError("--mesh ep=" + std::to_string(mesh.ep) + ": --plugin " + name +
                      " does not split the experts over an expert-parallel group (its step plan "
                      "has none); leave ep out, or choose a strategy that does");
  if (mesh.cp > 1 && plan.context_parallel != mesh.cp)
    throw ConfigError("--mesh cp=" + std::to_string(mesh.cp) + ": --plugin " + name +
                      " does not split the sequences over a context-parallel group (its step "
                      "plan has none); leave cp out, or choose cp, tp or a pipeline");
}

}  // namespace strata
