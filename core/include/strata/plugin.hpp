// strata SDK: what a strategy plugin is.
//
// A plugin is a shared library that exports, through Boost.DLL aliases (STRATA_PLUGIN below):
//   strata_abi_version   -> std::uint32_t, checked by the loader before anything else is touched
//   strata_descriptor    -> const PluginDescriptor& (family, strategies, typed options, help)
//   strata_create        -> std::unique_ptr<Strategy>(strategy name, validated Options)
// Lifecycle per run: validate(mesh, train, model) -> setup(ctx) -> train_step(ctx, step) per step.
// plan_step() describes one step as data (strata/step_plan.hpp): the core counts its bytes per op
// (the prediction every run's measured bytes are checked against) and the step-time predictor
// replays it. predict() answers memory per tag without running.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/context.hpp"
#include "strata/export.hpp"
#include "strata/step_plan.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// Bump when any SDK type crossing the plugin boundary changes layout or meaning.
inline constexpr std::uint32_t kPluginAbiVersion = 9;

enum class OptionType { integer, real, boolean, string, choice };
const char* option_type_name(OptionType t);

struct OptionSpec {
  std::string name;
  OptionType type = OptionType::string;
  std::string default_value;
  std::string help;
  std::vector<std::string> choices;  // OptionType::choice only
};

struct StrategySpec {
  std::string name;
  std::string summary;
  std::vector<OptionSpec> options;
};

struct PluginDescriptor {
  std::uint32_t abi_version = kPluginAbiVersion;
  std::string family;
  std::string summary;
  std::vector<StrategySpec> strategies;
};

// Option values after validation against the descriptor: every declared option is present
// (defaults filled in) and parses as its type.
class Options {
 public:
  Options() = default;
  explicit Options(std::map<std::string, std::string> values) : values_(std::move(values)) {}
  const std::string& get(const std::string& name) const;
  long long get_int(const std::string& name) const;
  double get_real(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

// What predict() is asked about: one rank of one configuration.
struct PredictInput {
  MeshSpec mesh;
  ModelSpec model;
  TrainSpec train;
  int rank = 0;
};

struct Prediction {
  std::array<double, kNumMemTags> memory_bytes{};  // bytes per tag on this rank
  std::string notes;                               // assumptions, padding, ...
  // Pipeline strategies: the fraction of the step a stage idles in an ideal pipeline
  // ((p-1)/(m+p-1) for GPipe and 1F1B). Negative: not a pipeline.
  double bubble_fraction = -1;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Throw ConfigError (one line naming the option and what is allowed) if the configuration
  // cannot run under this strategy. Called before any rank allocates.
  virtual void validate(const MeshSpec&, const TrainSpec&, const ModelSpec&) const {}
  // Memory per tag on rank in.rank (what every run's measured peaks are checked against). The
  // default: the plan's (plan_memory) when plan_step() allocates, else a full replica's
  // (replicated_prediction(), strata/data_parallel.hpp). A strategy whose plan states its
  // allocations needs no predict() of its own.
  virtual Prediction predict(const PredictInput& in) const;
  // One step of rank in.rank as the actions its train_step() issues (strata/step_plan.hpp): the
  // bytes it moves per op are the run's predicted bytes (plan_comm_bytes), and `runner --dry-run
  // --profile` and the advisor replay it for time. The default, an empty plan, predicts no bytes
  // and reports the strategy as having no time model.
  virtual StepPlan plan_step(const PredictInput& in) const {
    (void)in;
    return {};
  }
  virtual void setup(Context& ctx) = 0;
  // One optimizer step: every micro-batch's forward and backward, the gradient exchange and the
  // update. Report the loss through the helpers (forward_backward does it).
  virtual void train_step(Context& ctx, int step) = 0;
};

using CreateFn = std::unique_ptr<Strategy>(const std::string& strategy, const Options& options);

}  // namespace strata
STRATA_EXPORT_END

// Export a plugin: STRATA_PLUGIN(descriptor_function, create_function), where
//   const strata::PluginDescriptor& descriptor_function();
//   std::unique_ptr<strata::Strategy> create_function(const std::string&, const strata::Options&);
#include <boost/dll/alias.hpp>
#define STRATA_PLUGIN(descriptor_fn, create_fn)                                        \
  namespace strata_plugin_exports {                                                    \
  const std::uint32_t strata_abi_version_value = strata::kPluginAbiVersion;            \
  BOOST_DLL_ALIAS(strata_plugin_exports::strata_abi_version_value, strata_abi_version) \
  BOOST_DLL_ALIAS(descriptor_fn, strata_descriptor)                                    \
  BOOST_DLL_ALIAS(create_fn, strata_create)                                            \
  }
