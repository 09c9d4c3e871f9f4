// zero1, zero2, zero3: the ZeRO stages (DeepSpeed) on the sharded engine
// (strata/engines/sharded.hpp).
//   zero1  optimizer state sharded; gradients reduce-scattered once per step, each rank updates its
//          shard, then the parameters are all-gathered
//   zero2  + gradients reduce-scattered bucket by bucket during backward; only the shard is kept
//   zero3  + parameters sharded: each unit all-gathered before its forward and again before its
//          backward, freed after use, `prefetch` units ahead
#include "strata/engines/sharded.hpp"

namespace {

using namespace strata;

const PluginDescriptor& descriptor() {
  const std::vector<OptionSpec> options = {
      bucket_mb_spec(
          "zero1/zero2: units are grouped into reduce-scatter buckets of up to this many "
          "MiB"),
      {"prefetch",
       OptionType::integer,
       "1",
       "zero3: units all-gathered ahead of the one computing, overlapped with compute",
       {}},
      {"overlap",
       OptionType::boolean,
       "true",
       "run each reduce-scatter behind the next unit's backward (off: wait for it at once)",
       {}},
      {"offload",
       OptionType::choice,
       "none",
       "optimizer: AdamW state (m, v, bf16's fp32 master) in host memory, the update on the CPU",
       {"none", "optimizer"}}};
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "zero",
      "ZeRO stages 1-3: optimizer, gradient and parameter sharding (DeepSpeed)",
      {{"zero1",
        "optimizer state sharded; reduce-scatter gradients, update shard, all-gather params",
        options},
       {"zero2", "+ gradients reduce-scattered bucket by bucket during backward", options},
       {"zero3", "+ parameters sharded, gathered per unit for forward and backward", options}}};
  return d;
}

// The engine's configuration for zero1, zero2 or zero3 from the options declared above.
sharded::EngineConfig engine_config(const std::string& name, const Options& o) {
  sharded::EngineConfig c;
  c.bucket_mb = bucket_mb_option(o);
  c.overlap = o.get_bool("overlap");
  c.forward_prefetch = c.backward_prefetch = int(o.get_int("prefetch"));
  c.shard_grads = name != "zero1";
  c.shard_params = name == "zero3";
  c.offload_optimizer = o.get("offload") == "optimizer";
  return c;
}

std::unique_ptr<Strategy> create(const std::string& name, const Options& o) {
  return std::make_unique<sharded::EngineStrategy>(name, engine_config(name, o));
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
