// The data-parallel axis under a pipeline schedule (model_parallel.hpp: dp_schedule): which of
// Shards' actions run around which unit pass of a step.
#include "strata/engines/model_parallel.hpp"

namespace strata::mp {
namespace {

using sharded::Act;
using sharded::Action;

// Per local chunk: the indices of its first forward, first backward, last backward and (a split
// backward's) last weight pass in the step's pipeline actions.
struct ChunkBounds {
  int first_forward = -1, first_backward = -1, last_backward = -1, last_weight = -1;
  // Where the chunk's gradients are complete: after its last weight pass if it has them.
  int last_gradient() const { return last_weight >= 0 ? last_weight : last_backward; }
};

std::vector<ChunkBounds> chunk_bounds(const std::vector<pp::PipeAction>& actions, int chunks) {
  std::vector<ChunkBounds> b(static_cast<std::size_t>(chunks));
  for (int i = 0; i < int(actions.size()); ++i) {
    ChunkBounds& c = b[std::size_t(actions[std::size_t(i)].chunk)];
    if (actions[std::size_t(i)].forward()) {
      if (c.first_forward < 0) c.first_forward = i;
    } else if (actions[std::size_t(i)].pass == pp::PipePass::backward) {
      if (c.first_backward < 0) c.first_backward = i;
      c.last_backward = i;
    } else {
      c.last_weight = i;
    }
  }
  return b;
}

}  // namespace

std::vector<Action> DpSchedule::flat() const {
  std::vector<Action> r;
  for (const UnitPassActions& p : unit_passes) {
    r.insert(r.end(), p.before.begin(), p.before.end());
    r.insert(r.end(), p.after.begin(), p.after.end());
  }
  r.insert(r.end(), end.begin(), end.end());
  return r;
}

DpSchedule dp_schedule(const std::vector<pp::PipeAction>& actions,
                       const std::vector<Partition>& parts,
                       const std::vector<sharded::ShardGroup>& groups,
                       const sharded::EngineConfig& c, bool tied_exchange, int head_unit) {
  std::vector<int> group_of(std::size_t(head_unit) + 1, -1);
  for (int g = 0; g < int(groups.size()); ++g)
    for (int u = groups[std::size_t(g)].first_unit; u <= groups[std::size_t(g)].last_unit; ++u)
      group_of[std::size_t(u)] = g;
  auto holds_tied = [&](int g) {
    const sharded::ShardGroup& grp = groups[std::size_t(g)];
    return tied_exchange && (grp.first_unit == 0 || grp.last_unit == head_unit);
  };
  const std::vector<ChunkBounds> bounds = chunk_bounds(actions, int(parts.size()));
  sharded::ScheduleBuilder b(groups, c);
  DpSchedule s;
  s.first.reserve(actions.size() + 1);
  std::size_t total = 0;
  for (const pp::PipeAction& a : actions) {
    s.first.push_back(total);
    const Partition& part = parts[std::size_t(a.chunk)];
    total += std::size_t(part.last_unit - part.first_unit + 1);
  }
  s.first.push_back(total);
  s.unit_passes.reserve(total);
  for (int i = 0; i < int(actions.size()); ++i) {
    const pp::PipeAction& a = actions[std::size_t(i)];
    const Partition& part = parts[std::size_t(a.chunk)];
    const ChunkBounds& at = bounds[std::size_t(a.chunk)];
    const int last_group = group_of[std::size_t(part.last_unit)];
    for (int n = 0; n <= part.last_unit - part.first_unit; ++n) {
      const int u = a.forward() ? part.first_unit + n : part.last_unit - n;
      const int g = group_of[std::size_t(u)];
      UnitPassActions p;
      if (a.forward() && c.shard_params && i == at.first_forward) {
        b.want(g, false);
        for (int k = 1; k <= c.forward_prefetch && g + k <= last_group; ++k) b.want(g + k, true);
        b.ready(g);
      }
      if (!a.forward() && c.shard_grads && i == at.first_backward) {
        b.grads(g);
        // A chunk holding the whole model (tp alone): the head's backward also writes the tied
        // embedding's gradient, into unit 0's group.
        if (u == head_unit && part.first_unit == 0) b.grads(group_of[0]);
      }
      p.before = b.take();
      // After the group's last unit of the step's last backward through the chunk: its
      // parameters are free (a weight pass reads none); its gradients are reduced there, or after
      // the last weight pass (zb-h1), which writes the GEMMs' weight gradients.
      if (!a.forward() && u == groups[std::size_t(g)].first_unit) {
        if (c.shard_params && i == at.last_backward) b.release(g);
        if (c.shard_grads && !holds_tied(g) && i == at.last_gradient()) b.reduce(g);
      }
      p.after = b.take();
      s.unit_passes.push_back(std::move(p));
    }
  }
  if (c.shard_grads)
    for (int g = 0; g < int(groups.size()); ++g)
      if (holds_tied(g)) b.reduce(g);
  b.finish_all();
  s.end = b.take();
  return s;
}

}  // namespace strata::mp
