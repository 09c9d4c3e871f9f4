// advise_from_config (advise_cli.hpp).
#include "predict/advise_cli.hpp"

#include <chrono>
#include <cstdio>
#include <set>

#include "predict/advisor.hpp"
#include "util/format.hpp"

namespace strata {
namespace {

// The device and precision the profile's compute entries were made for: a published H100
// profile advises bf16 on cuda whatever this build runs. ConfigError when the entries disagree.
void take_profile_device(const MachineProfile& p, const std::string& path, TrainSpec& train) {
  std::set<std::string> devices, precisions;
  for (const ComputeEntry& e : p.compute) devices.insert(e.device), precisions.insert(e.precision);
  if (devices.size() != 1 || precisions.size() != 1)
    throw ConfigError("--profile " + path + ": --advise needs compute entries of one device and " +
                      "precision (found " + std::to_string(devices.size()) + " and " +
                      std::to_string(precisions.size()) + ")");
  train.device = *devices.begin() == "cuda" ? Device::cuda : Device::cpu;
  if (*precisions.begin() == "bf16" && train.precision.param != DType::bf16)
    train.precision.param = train.precision.tp_comm = DType::bf16;  // tp comm follows, by default
  if (*precisions.begin() == "fp32") train.precision = MixedPrecision{};
}

}  // namespace

int advise_from_config(const RunConfig& config, const PluginRegistry& registry) {
  MachineProfile profile;
  try {
    profile = read_profile(config.profile);
  } catch (const std::exception& e) {
    throw ConfigError("--profile " + config.profile + ": " + one_line(e.what()));
  }
  AdviseRequest r;
  r.model = config.model;
  r.train = config.train;
  take_profile_device(profile, config.profile, r.train);
  r.nodes = config.mesh.nodes, r.ranks_per_node = config.mesh.ranks_per_node;
  r.memory_limit = config.memory_limit;
  r.micro_batches = config.advise_micro_batches;
  r.global_batch = config.train.global_batch;
  r.threads = config.blas_threads > 0 ? config.blas_threads : 1;
  std::vector<AdviseStrategy> strategies;
  for (const LoadedPlugin& p : registry.plugins())
    for (const StrategySpec& s : p.descriptor->strategies)
      if (config.plugin.empty() || config.plugin == s.name)
        strategies.push_back({s.name, &s, [&registry, name = s.name](const Options& o) {
                                return registry.create(name, o);
                              }});
  if (strategies.empty()) throw ConfigError("--plugin " + config.plugin + ": no such strategy");

  const auto start = std::chrono::steady_clock::now();
  const Advice advice = advise(profile, r, strategies);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("profile %s (%s): %s\n", config.profile.c_str(), profile.source.c_str(),
              profile.description.c_str());
  std::printf("device %s, precision %s (the profile's)\n", device_name(r.train.device),
              r.train.precision.mixed() ? "bf16" : "fp32");
  std::printf("%s", format_advice(advice, r, config.advise_top).c_str());
  std::printf("advised in %.2f s\n", seconds);
  return advice.ranked.empty() ? 4 : 0;
}

}  // namespace strata
