// pp: pipeline parallelism, Megatron-LM's schedules over contiguous stage ranges of units, with
// data parallelism outside (--mesh dp=D,pp=P) and tensor parallelism inside each stage
// (--mesh dp=D,tp=T,pp=P).
//   gpipe        all forwards, then all backwards: holds every micro-batch's activations
//   1f1b         PipeDream-Flush: warm-up forwards, then one forward / one backward; stage s holds
//                at most pp - s micro-batches
//   interleaved  1f1b over virtual_stages chunks per rank (chunk k on rank k mod pp): the bubble
//                shrinks by the number of virtual stages, at the price of more sends
//   zb-h1        ZB-H1 (Qi et al., 2024): each backward split into the input-gradient pass, which
//                the previous stage waits for, and a deferred weight-gradient pass filling 1f1b's
//                bubble; every stage holds at most pp micro-batches
//   zb-v         ZB-V (the same paper, section 6): two chunks per rank in a V (rank s holds chunks
//                s and 2 pp - 1 - s), the backward split as zb-h1's; 1f1b's first stage's memory
//                on every rank and, with equal F, B and W, half zb-h1's bubble from m = 2 pp
// Activations and their gradients go point to point; the tied embedding / LM-head gradient is
// exchanged between the first and last stage (zb-v: both are rank 0's, summed there). Time a
// stage waits for its neighbours is the bubble.
// dp=zero1: AdamW state sharded over dp (Megatron's distributed optimizer); dp=zero2, dp=fsdp:
// gradients (and parameters) sharded too, per unit, reduced (and gathered) once per step as
// torchtitan runs FSDP2 with PP. A mixture of experts' routed experts split over an expert-parallel
// group inside each stage's dp ranks (--mesh dp=D,pp=P,ep=N, dp=allreduce), as the ep plugin
// splits them (Megatron-Core's EP x PP).
#include <sstream>

#include "strata/engines/model_parallel.hpp"

namespace {

using namespace strata;

std::vector<OptionSpec> options(bool interleaved) {
  std::vector<OptionSpec> o = {
      {"microbatches",
       OptionType::integer,
       "0",
       "micro-batches per step; 0 = --global-batch / (--micro-batch x dp), which it must equal",
       {}},
      {"stage_layers",
       OptionType::string,
       "",
       "blocks per pipeline chunk in order, e.g. 3,3,3,3 (pp x virtual_stages entries); empty = "
       "balanced",
       {}},
      {"sp",
       OptionType::choice,
       "off",
       "sequence parallelism inside each stage's tensor-parallel group",
       {"on", "off"}},
      mp::dp_option(),
      {"prefetch",
       OptionType::integer,
       "1",
       "dp=fsdp: units all-gathered ahead of the one computing in a chunk's first forward of the "
       "step",
       {}},
      {"offload",
       OptionType::choice,
       "none",
       "dp=zero1|zero2|fsdp: optimizer: AdamW state (m, v, bf16's fp32 master) of the rank's "
       "shard in host memory, the update on the CPU (Megatron's optimizer CPU offload)",
       {"none", "optimizer"}}};
  if (interleaved)
    o.push_back({"virtual_stages",
                 OptionType::integer,
                 "2",
                 "model chunks per rank (Megatron's virtual pipeline size)",
                 {}});
  return o;
}

const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "pp",
      "pipeline parallelism: GPipe, 1F1B, interleaved 1F1B and zero-bubble (ZB-H1, ZB-V) "
      "schedules",
      {{"gpipe", "all forwards then all backwards (GPipe); holds m micro-batches", options(false)},
       {"1f1b", "one forward, one backward (PipeDream-Flush); holds at most pp micro-batches",
        options(false)},
       {"interleaved", "1F1B over virtual stages (Megatron-LM interleaved schedule)",
        options(true)},
       {"zb-h1",
        "zero bubble ZB-H1: backwards split into input and weight passes, the weight passes "
        "filling 1f1b's bubble at its memory peak",
        options(false)},
       {"zb-v",
        "zero bubble ZB-V: two chunks per rank in a V, backwards split as zb-h1's; 1f1b's memory "
        "peak, almost no bubble",
        options(false)}}};
  return d;
}

// The stage_layers option declared above: "2,2,3,1", one block count >= 1 per pipeline chunk;
// empty: balanced (MpConfig::stage_layers).
std::vector<int> parse_stage_layers(const std::string& text) {
  std::vector<int> r;
  if (text.empty()) return r;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t used = 0;
      const int n = std::stoi(item, &used);
      if (used != item.size() || n < 1) throw std::invalid_argument(item);
      r.push_back(n);
    } catch (const std::exception&) {
      throw ConfigError("--plugin-opt stage_layers=" + text +
                        ": must be a comma list of block counts >= 1, one per pipeline chunk");
    }
  }
  return r;
}

std::unique_ptr<Strategy> create(const std::string& name, const Options& o) {
  mp::MpConfig c;
  c.strategy = name;
  c.pipeline = true;
  c.schedule = name == "gpipe"   ? pp::PipeSchedule::gpipe
               : name == "1f1b"  ? pp::PipeSchedule::one_f_one_b
               : name == "zb-h1" ? pp::PipeSchedule::zb_h1
               : name == "zb-v"  ? pp::PipeSchedule::zb_v
                                 : pp::PipeSchedule::interleaved;
  c.virtual_stages = name == "interleaved" ? int(o.get_int("virtual_stages"))
                     : name == "zb-v"      ? 2
                                           : 1;
  c.sequence_parallel = o.get("sp") == "on";
  c.dp = mp::dp_mode(o.get("dp"));
  c.stage_layers = parse_stage_layers(o.get("stage_layers"));
  c.microbatches = int(o.get_int("microbatches"));
  c.prefetch = int(o.get_int("prefetch"));
  c.offload_optimizer = o.get("offload") == "optimizer";
  c.expert_parallel = true;   // at --mesh ep > 1
  c.context_parallel = true;  // at --mesh cp > 1
  return std::make_unique<mp::MpStrategy>(c);
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
