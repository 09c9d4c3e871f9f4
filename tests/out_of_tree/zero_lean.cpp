// zero-lean: a ZeRO variant written outside the strata tree on the installed sharded engine
// (strata/engines/sharded.hpp): ZeRO-3 that gathers each unit only when it computes (no prefetch)
// and waits for every reduce-scatter at once (no overlap): the least memory in flight, the most
// exposed communication. Same algorithm, same losses as zero3.
#include "strata/engines/sharded.hpp"

namespace {

using namespace strata;

const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "zero-lean",
      "out-of-tree example: ZeRO-3 without prefetch or overlap, on the installed engine",
      {{"zero-lean", "ZeRO-3, each unit gathered only when it computes, reductions waited for", {}}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string& name, const Options&) {
  sharded::EngineConfig c;
  c.shard_grads = c.shard_params = true;
  c.forward_prefetch = c.backward_prefetch = 0;
  c.overlap = false;
  return std::make_unique<sharded::EngineStrategy>(name, c);
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
