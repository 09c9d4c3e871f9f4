// fsdp, fsdp-grad-op, fsdp-hybrid: PyTorch FSDP's sharding strategies on the sharded engine.
//   fsdp          FULL_SHARD: parameters resharded after forward, gathered again for backward
//   fsdp-grad-op  SHARD_GRAD_OP: parameters stay gathered from forward to backward
//   fsdp-hybrid   HYBRID_SHARD: full shard inside a node, replicas across nodes (gradients
//                 reduce-scattered in the node, then all-reduced across nodes)
// A GPT-2 embedding's FSDP unit also holds the tied LM-head weight; like FSDP's root unit it is
// not resharded between forward and backward (a llama's, untied, is).
#include "strata/engines/sharded.hpp"

namespace {

using namespace strata;

const PluginDescriptor& descriptor() {
  const std::vector<OptionSpec> options = {
      {"wrap", OptionType::integer, "1", "model units per FSDP unit (embedding, blocks, head)", {}},
      {"backward_prefetch",
       OptionType::choice,
       "pre",
       "all-gather the next FSDP unit before (pre) or after (post) the current backward, or not",
       {"pre", "post", "none"}},
      {"forward_prefetch",
       OptionType::boolean,
       "false",
       "all-gather the next FSDP unit before the current forward",
       {}},
      {"limit_all_gathers",
       OptionType::boolean,
       "true",
       "at most 2 all-gathers in flight (bounds the gathered working set)",
       {}},
      {"offload",
       OptionType::choice,
       "none",
       "optimizer: AdamW state (m, v, bf16's fp32 master) in host memory, the update on the CPU",
       {"none", "optimizer"}}};
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "fsdp",
      "PyTorch FSDP sharding strategies",
      {{"fsdp", "FULL_SHARD: reshard after forward, gather again for backward", options},
       {"fsdp-grad-op", "SHARD_GRAD_OP: parameters stay gathered from forward to backward",
        options},
       {"fsdp-hybrid", "HYBRID_SHARD: full shard inside a node, replicate across nodes", options}}};
  return d;
}

// The engine's configuration for fsdp, fsdp-grad-op or fsdp-hybrid from the options declared
// above.
sharded::EngineConfig engine_config(const std::string& name, const Options& o) {
  sharded::EngineConfig c;
  c.shard_grads = c.shard_params = true;
  c.reshard_after_forward = name != "fsdp-grad-op";
  c.hybrid = name == "fsdp-hybrid";
  c.units_per_group = int(o.get_int("wrap"));
  const std::string bp = o.get("backward_prefetch");
  c.backward_prefetch = bp == "none" ? 0 : 1;
  c.prefetch_post = bp == "post";
  c.forward_prefetch = o.get_bool("forward_prefetch") ? 1 : 0;
  c.max_gathers_in_flight = o.get_bool("limit_all_gathers") ? 2 : 0;
  c.offload_optimizer = o.get("offload") == "optimizer";
  return c;
}

std::unique_ptr<Strategy> create(const std::string& name, const Options& o) {
  return std::make_unique<sharded::EngineStrategy>(name, engine_config(name, o));
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
