// ep: expert parallelism for --arch moe (DeepSpeed-MoE's and Megatron-Core's), over an
// expert-parallel group carved out of the data-parallel ranks (--mesh dp=D,ep=N: N divides D and
// --experts). Each rank holds E / N of every moe block's routed experts and the whole rest of the
// model; it routes its own micro-batch, sends each token's rows to the ranks of its ep group
// holding its experts and gets their outputs back (all_to_allv, forward and backward; the rows
// per expert all-gathered first), so a step moves activations, not expert weights. dp=allreduce:
// the dense parameters (attention, router, shared experts, embedding, head) are replicated and
// their gradients all-reduced over dp; the experts' gradients are all-reduced over ep_dp, the
// D / N ranks holding the same experts (Megatron's expert data parallelism; nothing at N = D).
// dp=zero1 (Megatron-Core's distributed optimizer with EP): the dense gradients reduce-scattered
// over dp and the experts' over ep_dp, AdamW state for this rank's shard of each, the updated
// shards all-gathered over the same groups. dp=zero2 and fsdp (torchtitan's FSDP2 with EP: the
// experts sharded over dp / ep, the rest over dp): each unit's runs of dense and expert tensors
// reduce-scattered (and fsdp's gathered) over their own groups into one buffer per unit, on the
// sharded engine. Built on the model-parallel engine (strata/engines/model_parallel.hpp) at
// tp = pp = 1.
#include "strata/engines/model_parallel.hpp"

namespace {

using namespace strata;

// tp's data-parallel options (dp, prefetch, offload) without sp: ep runs at tp = 1.
std::vector<OptionSpec> options() {
  std::vector<OptionSpec> o;
  for (OptionSpec& t : mp::tensor_parallel_options())
    if (t.name != "sp") o.push_back(std::move(t));
  return o;
}

const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "ep",
      "expert parallelism for --arch moe: experts split over --mesh ep, tokens exchanged with "
      "all-to-all",
      {{"ep",
        "E / ep routed experts per rank, rows dispatched and combined with all_to_allv; "
        "--mesh dp=D,ep=N (N divides D); every dp mode, the experts' state over ep_dp",
        options()}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string& name, const Options& o) {
  mp::MpConfig c;
  c.strategy = name;
  c.pipeline = false;
  c.expert_parallel = true;
  c.dp = mp::dp_mode(o.get("dp"));
  c.prefetch = int(o.get_int("prefetch"));
  c.offload_optimizer = o.get("offload") == "optimizer";
  return std::make_unique<mp::MpStrategy>(c);
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
