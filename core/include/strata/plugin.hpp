// strata SDK: what a strategy plugin is.
//
// A plugin is a shared library that exports, through Boost.DLL aliases (STRATA_PLUGIN below):
//   strata_abi_version   -> std::uint32_t, checked by the loader before anything else is touched
//   strata_descriptor    -> const PluginDescriptor& (family, strategies, typed options, help)
//   strata_create        -> std::unique_ptr<Strategy>(strategy name, validated Options)
// Lifecycle per run: validate(mesh, train, model) -> setup(ctx) -> train_step(ctx, step) per step.
// plan_step() describes one step as data (strata/step_plan.hpp), once: the core derives from it
// the bytes per op and the memory per tag every run's measurements are checked against (predict()
// below), and the step-time predictor replays it for time.
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
inline constexpr std::uint32_t kPluginAbiVersion = 19;

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

// What a plan and predict() are asked about: one rank of one configuration.
struct PredictInput {
  MeshSpec mesh;
  ModelSpec model;
  TrainSpec train;
  int rank = 0;
};

struct Prediction {
  std::array<double, kNumMemTags> memory_bytes{};  // bytes per tag on this rank
  std::string notes;                               // StepPlan::notes
  double bubble_fraction = -1;                     // StepPlan::bubble_fraction
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Throw ConfigError (one line naming the option and what is allowed) if the configuration
  // cannot run under this strategy. Called before any rank allocates.
  virtual void validate(const MeshSpec&, const TrainSpec&, const ModelSpec&) const {}
  // One step of rank in.rank as the actions setup() and train_step() take and issue
  // (strata/step_plan.hpp): the memory they allocate, the passes, the collectives, the update. The
  // core derives the run's predictions from it (predict() below), and `runner --dry-run --profile`
  // and the advisor replay it for time. The default, an empty plan, predicts no bytes, a replica's
  // memory, and reports the strategy as having no time model.
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

// What every run's measured memory is checked against, from the strategy's plan for rank in.rank:
// plan_memory() when the plan allocates, else a full replica's (replicated_prediction(),
// strata/data_parallel.hpp), with the plan's notes and bubble fraction.
Prediction predict(const Strategy& strategy, const PredictInput& in);
// The same from `plan`, rank in.rank's plan_step() already made (the advisor asks several
// questions of one plan).
Prediction predict(const StepPlan& plan, const PredictInput& in);

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
