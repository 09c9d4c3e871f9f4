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
      {{"tp", "column/row-parallel blocks, vocab-parallel embedding and loss; --mesh dp=D,tp=T",
        mp::tensor_parallel_options()}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string& name, const Options& o) {
  return std::make_unique<mp::MpStrategy>(mp::tensor_parallel_config(name, o));
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
