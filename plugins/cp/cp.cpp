// cp: context parallelism over a context-parallel group (--mesh dp=D,cp=C,tp=T): each rank holds
// seq / C tokens of every sequence of its micro-batch, in two zig-zag chunks (rank r: chunks r and
// 2C - 1 - r, Megatron-Core's load balance), and runs every per-token layer on them alone. Each
// block's attention is either DeepSpeed-Ulysses' (attention=ulysses, Megatron-Core's cp_comm_type
// a2a): an all-to-all turns q | k | v from [its tokens, all its heads] into [every token, 1 / C of
// its heads], the causal attention runs over whole sequences and a second all-to-all sends the
// output back; or ring attention (attention=ring, Megatron-Core's p2p): the rank keeps its queries
// and the key-value blocks pass around the group on a comm stream while it attends to the block
// in hand, merged by log-sum-exp (backward: the same exchanges for the gradients). The parameters
// are replicated over cp and their gradients reduced over dp x cp (the dp group), so every dp
// mode applies. Built on the model-parallel engine (strata/engines/model_parallel.hpp); tp and the
// pipelines take --mesh cp too (the pipelines with Ulysses).
#include "strata/engines/model_parallel.hpp"

namespace {

using namespace strata;

std::vector<OptionSpec> options() {
  std::vector<OptionSpec> o = {{"attention",
                                OptionType::choice,
                                "ulysses",
                                "how the attention sees whole sequences: ulysses (all-to-all "
                                "between sequence and head sharding; tp x cp divides the heads) "
                                "or ring (key-value blocks passed around the cp group)",
                                {"ulysses", "ring"}}};
  for (OptionSpec& t : mp::tensor_parallel_options()) o.push_back(std::move(t));
  return o;
}

const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "cp",
      "context parallelism: each sequence split over --mesh cp, its attention by Ulysses' "
      "all-to-alls or ring attention",
      {{"cp",
        "seq / cp tokens per rank (2 zig-zag chunks); attention=ulysses: q | k | v and the "
        "output exchanged with all_to_all (tp x cp divides the heads), attention=ring: key-value "
        "blocks passed around cp with send/recv; --mesh dp=D,cp=C,tp=T",
        options()}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string& name, const Options& o) {
  mp::MpConfig c = mp::tensor_parallel_config(name, o);
  c.context_parallel = true;
  c.context_attention =
      o.get("attention") == "ring" ? ContextAttention::ring : ContextAttention::ulysses;
  return std::make_unique<mp::MpStrategy>(c);
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
