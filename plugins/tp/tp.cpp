// tp: Megatron-LM tensor parallelism, with data parallelism outside it (--mesh dp=D,tp=T).
// QKV and FC1 column-parallel (attention heads split across ranks), proj and FC2 row-parallel,
// vocab-parallel embedding and cross-entropy for the tied embedding / LM head; one all-reduce in
// forward and one in backward per sub-block. sp=on: sequence parallelism (all-gather and
// reduce-scatter in place of each all-reduce, LayerNorm and residual on token-row shards).
// dp=zero1: AdamW state sharded over dp (Megatron's distributed optimizer); dp=zero2, dp=fsdp:
// gradients (and parameters) sharded too, per unit, on the sharded engine (prefetch, offload).
// The model and the step live in strata/engines/model_parallel.hpp and core's StageModel.
#include "strata/engines/model_parallel.hpp"

namespace {

using namespace strata;

const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "tp",
      "Megatron-LM tensor parallelism (optionally sequence parallel), data parallel outside",
      {{"tp",
        "column/row-parallel blocks, vocab-parallel embedding and loss; --mesh dp=D,tp=T",
        {{"sp",
          OptionType::choice,
          "off",
          "sequence parallelism: all-gather / reduce-scatter instead of all-reduce, LayerNorm on "
          "token-row shards",
          {"on", "off"}},
         mp::dp_option(),
         {"prefetch",
          OptionType::integer,
          "1",
          "dp=fsdp: units all-gathered ahead of the one computing, overlapped with compute",
          {}},
         {"offload",
          OptionType::choice,
          "none",
          "dp=zero1|zero2|fsdp: optimizer: AdamW state (m, v, bf16's fp32 master) in host "
          "memory, the update on the CPU",
          {"none", "optimizer"}}}}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string& name, const Options& o) {
  mp::MpConfig c;
  c.strategy = name;
  c.pipeline = false;
  c.sequence_parallel = o.get("sp") == "on";
  c.dp = mp::dp_mode(o.get("dp"));
  c.prefetch = int(o.get_int("prefetch"));
  c.offload_optimizer = o.get("offload") == "optimizer";
  return std::make_unique<mp::MpStrategy>(c);
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
