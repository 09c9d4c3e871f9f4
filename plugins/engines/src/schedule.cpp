// Groups and the per-micro-batch schedule: everything about the sharded engine that is decided
// before running (its plan, with its memory, is sharded_plan.cpp's).
#include <algorithm>
#include <sstream>

#include "strata/engines/sharded.hpp"

namespace strata::sharded {

std::vector<ShardGroup> make_groups(const std::vector<std::pair<std::size_t, std::size_t>>& units,
                                    int first_unit, int shards, const EngineConfig& c) {
  const int n_units = int(units.size());
  std::vector<std::pair<int, int>> ranges;  // [first, last] local units
  if (c.shard_params) {
    for (int u = 0; u < n_units; u += c.units_per_group)
      ranges.emplace_back(u, std::min(n_units, u + c.units_per_group) - 1);
  } else {
    // Buckets as backward fills them: from the head down, units until bucket_mb is reached.
    const double limit = c.bucket_mb * 1024 * 1024;
    int last = n_units - 1;
    double bytes = 0;
    for (int u = n_units - 1; u >= 0; --u) {
      bytes += 4.0 * double(units[u].second);
      if (bytes >= limit || u == 0) {
        ranges.emplace_back(u, last);
        last = u - 1;
        bytes = 0;
      }
    }
    std::reverse(ranges.begin(), ranges.end());
  }
  std::vector<ShardGroup> groups;
  for (auto [first, last] : ranges) {
    ShardGroup g;
    g.first_unit = first_unit + first;
    g.last_unit = first_unit + last;
    g.offset = units[first].first;
    g.count = units[last].first + units[last].second - g.offset;
    g.shards = shards;
    g.chunk = (g.count + shards - 1) / shards;
    g.bucket = int(groups.size());
    groups.push_back(g);
  }
  return groups;
}

namespace {

// Group g cut where its tensors change between the routed experts' and the others'; the units a
// run touches are its first and last unit.
void split_experts(const ShardGroup& g, const std::vector<LocalTensor>& tensors,
                   const std::vector<std::pair<std::size_t, std::size_t>>& units, int first_unit,
                   int expert_shards, std::vector<ShardGroup>& out) {
  auto unit_at = [&](std::size_t offset) {
    int u = 0;
    while (u + 1 < int(units.size()) && units[std::size_t(u) + 1].first <= offset) ++u;
    return first_unit + u;
  };
  const std::size_t first_run = out.size();
  std::size_t covered = 0;
  for (const LocalTensor& t : tensors) {
    if (t.offset < g.offset || t.offset >= g.offset + g.count) continue;
    covered += t.count;
    const bool experts = t.shard == ShardKind::experts;
    if (out.size() == first_run || out.back().experts != experts) {
      ShardGroup run = g;
      run.offset = t.offset;
      run.count = 0;
      run.experts = experts;
      run.shards = experts ? expert_shards : g.shards;
      run.first_unit = unit_at(t.offset);
      out.push_back(run);
    }
    ShardGroup& run = out.back();
    run.count += t.count;
    run.last_unit = unit_at(t.offset + t.count - 1);
    run.chunk = (run.count + std::size_t(run.shards) - 1) / std::size_t(run.shards);
  }
  if (covered != g.count)
    throw Error("make_groups: the local tensors do not tile group of units " +
                std::to_string(g.first_unit) + ".." + std::to_string(g.last_unit));
}

}  // namespace

std::vector<ShardGroup> make_groups(const ModelSpec& model, const std::vector<Partition>& parts,
                                    int shards, const EngineConfig& c) {
  std::vector<ShardGroup> groups;
  int buckets = 0;
  for (int p = 0; p < int(parts.size()); ++p) {
    const Partition& part = parts[std::size_t(p)];
    const auto units = StageModel::unit_ranges(model, part);
    const bool split = part.ep_size > 1 && !c.replicate;
    const auto tensors =
        split ? StageModel::local_tensors(model, part) : std::vector<LocalTensor>{};
    for (ShardGroup g : make_groups(units, part.first_unit, shards, c)) {
      g.part = p;
      g.bucket = buckets++;
      if (split)
        split_experts(g, tensors, units, part.first_unit, shards / part.ep_size, groups);
      else
        groups.push_back(g);
    }
  }
  return groups;
}

std::vector<ShardGroup> bucket_groups(const std::vector<ShardGroup>& groups) {
  std::vector<ShardGroup> buckets;
  for (const ShardGroup& g : groups) {
    if (!buckets.empty() && int(buckets.size()) - 1 == g.bucket) {
      ShardGroup& b = buckets.back();
      b.last_unit = g.last_unit;
      b.count = g.offset + g.count - b.offset;
      continue;
    }
    ShardGroup b = g;
    b.experts = false;
    b.bucket = int(buckets.size());
    buckets.push_back(b);
  }
  return buckets;
}

std::size_t bucket_span(const std::vector<ShardGroup>& groups, int b) {
  std::size_t first = 0, end = 0;
  bool seen = false;
  for (const ShardGroup& g : groups) {
    if (g.bucket != b) continue;
    if (!seen) first = g.offset, seen = true;
    end = std::max(end, g.offset + g.padded());
  }
  return end - first;
}

ReplicaLayout replica_layout(const std::vector<ShardGroup>& groups) {
  ReplicaLayout r;
  r.contiguous = std::any_of(groups.begin(), groups.end(), [](const auto& g) { return g.experts; });
  std::size_t parts_end = 0, part_base = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!r.contiguous) {
      r.base.push_back(r.size);
      r.size += groups[g].padded();
      continue;
    }
    if (g > 0 && groups[g].part != groups[g - 1].part) part_base = parts_end;
    r.base.push_back(part_base + groups[g].offset);
    parts_end = std::max(parts_end, r.base.back() + groups[g].count);
    r.size = std::max({r.size, parts_end, r.base.back() + groups[g].padded()});
  }
  return r;
}

Placement placement(const MeshSpec& m, int rank, const EngineConfig& c) {
  const Mesh mesh(m);
  Placement at;
  if (c.replicate) {  // one shard; the replicas are the dp group
    at.replica_axis = Axis::dp;
    at.replicas = m.replicas();
    return at;
  }
  at.shard_axis = c.hybrid ? Axis::dp_intra_node : Axis::dp;
  at.shards = int(mesh.group(at.shard_axis, rank).size());
  at.index = mesh.index_in_group(at.shard_axis, rank);
  at.replicas = m.replicas() / at.shards;  // hybrid: the nodes
  if (m.ep > 1) {
    at.expert_shards = int(mesh.group(Axis::ep_dp, rank).size());
    at.expert_index = mesh.index_in_group(Axis::ep_dp, rank);
  }
  return at;
}

int Placement::index_of(const ShardGroup& g) const { return g.experts ? expert_index : index; }
Axis Placement::axis_of(const ShardGroup& g) const { return g.experts ? Axis::ep_dp : shard_axis; }

std::vector<ShardSlice> owned_slices(const std::vector<std::vector<LocalTensor>>& tensors,
                                     const std::vector<ShardGroup>& groups, const Placement& at,
                                     const std::function<bool(const LocalTensor&)>& keep) {
  std::vector<ShardSlice> r;
  for (int g = 0; g < int(groups.size()); ++g) {
    const ShardGroup& grp = groups[std::size_t(g)];
    const int index = at.index_of(grp);
    const std::size_t begin = grp.offset + std::size_t(index) * grp.chunk;
    const std::size_t end = begin + grp.valid(index);
    for (const LocalTensor& t : tensors[std::size_t(grp.part)]) {
      const std::size_t lo = std::max(t.offset, begin), hi = std::min(t.offset + t.count, end);
      if (lo >= hi || !keep(t)) continue;
      if (!r.empty() && r.back().group == g && r.back().at + r.back().count == lo - begin)
        r.back().count += hi - lo;
      else
        r.push_back({g, lo - begin, hi - lo});
    }
  }
  return r;
}

double partial_count(const ModelSpec& model, const std::vector<Partition>& parts,
                     const std::vector<ShardGroup>& groups, const Placement& at) {
  if (!parts[0].sequence_parallel || parts[0].tp_size == 1) return 0;
  std::vector<std::vector<LocalTensor>> tensors;
  for (const Partition& part : parts) tensors.push_back(StageModel::local_tensors(model, part));
  double n = 0;
  for (const ShardSlice& s : owned_slices(tensors, groups, at, [](const LocalTensor& t) {
         return t.shard == ShardKind::replicated;
       }))
    n += double(s.count);
  return n;
}

std::vector<ShardGroup> make_groups(const ParamLayout& layout, int shards, const EngineConfig& c) {
  std::vector<std::pair<std::size_t, std::size_t>> units;
  for (const UnitInfo& u : layout.units()) units.emplace_back(u.offset, u.count);
  return make_groups(units, 0, shards, c);
}

ScheduleBuilder::ScheduleBuilder(const std::vector<ShardGroup>& groups, const EngineConfig& c)
    : groups_(groups), c_(c), state_(groups.size(), 0), has_grads_(groups.size(), false) {}

void ScheduleBuilder::want(int g, bool prefetch) {
  if (g < 0 || g >= int(groups_.size()) || state_[g] != 0) return;
  if (prefetch && c_.max_gathers_in_flight > 0 && in_flight_ >= c_.max_gathers_in_flight) return;
  out_.push_back({Act::gather, g});
  state_[g] = 1;
  ++in_flight_;
}

void ScheduleBuilder::ready(int g) {
  want(g, false);
  if (state_[g] == 1) {
    out_.push_back({Act::wait_gather, g});
    state_[g] = 2;
    --in_flight_;
  }
}

void ScheduleBuilder::release(int g) {
  if (state_[g] == 0) return;
  if (state_[g] == 1) ready(g);  // never free a buffer a gather is still writing
  out_.push_back({Act::free_params, g});
  state_[g] = 0;
}

void ScheduleBuilder::grads(int g) {
  if (has_grads_[g]) return;
  out_.push_back({Act::alloc_grads, g});
  has_grads_[g] = true;
}

void ScheduleBuilder::reduce(int g) {
  out_.push_back({Act::reduce_grads, g});
  has_grads_[g] = false;
  pending_.push_back(g);
  // Overlap: keep one reduction in flight behind the next group's backward.
  const std::size_t keep = c_.overlap ? 1 : 0;
  while (pending_.size() > keep) finish_oldest();
}

void ScheduleBuilder::finish_oldest() {
  out_.push_back({Act::finish_grads, pending_.front()});
  pending_.erase(pending_.begin());
}

void ScheduleBuilder::finish_all() {
  while (!pending_.empty()) finish_oldest();
}

std::vector<Action> ScheduleBuilder::take() {
  std::vector<Action> r;
  r.swap(out_);
  return r;
}

std::vector<Action> micro_batch_schedule(const std::vector<ShardGroup>& groups, int units,
                                         const EngineConfig& c, bool tied_head) {
  ScheduleBuilder b(groups, c);
  const int G = int(groups.size());
  // Forward.
  for (int g = 0; g < G; ++g) {
    if (c.shard_params) {
      b.want(g, false);
      for (int k = 1; k <= c.forward_prefetch; ++k) b.want(g + k, true);
      b.ready(g);
    }
    for (int u = groups[g].first_unit; u <= groups[g].last_unit; ++u) b.add({Act::forward, u});
    // A tied model's first group holds the embedding whose weight the head reuses: like FSDP's
    // root unit it stays gathered until its backward. The last group's backward follows at once.
    if (c.shard_params && c.reshard_after_forward && (g != 0 || !tied_head) && g != G - 1)
      b.release(g);
  }
  // Backward. A tied head's backward already writes the embedding's gradient.
  if (c.shard_grads) {
    b.grads(G - 1);
    if (tied_head) b.grads(0);
  }
  for (int g = G - 1; g >= 0; --g) {
    if (c.shard_params) {
      b.ready(g);
      if (!c.prefetch_post)
        for (int k = 1; k <= c.backward_prefetch; ++k) b.want(g - k, true);
    }
    if (c.shard_grads) b.grads(g);
    for (int u = groups[g].last_unit; u >= groups[g].first_unit; --u) b.add({Act::backward, u});
    if (c.shard_params) {
      if (c.prefetch_post)
        for (int k = 1; k <= c.backward_prefetch; ++k) b.want(g - k, true);
      b.release(g);
    }
    if (c.shard_grads) b.reduce(g);
  }
  b.finish_all();
  (void)units;
  return b.take();
}

std::string describe_schedule(const std::vector<Action>& actions) {
  static const char* names[] = {"gather", "wait",  "fwd",    "bwd",
                                "free",   "grads", "reduce", "finish"};
  std::ostringstream s;
  for (std::size_t i = 0; i < actions.size(); ++i)
    s << (i ? " " : "") << names[static_cast<int>(actions[i].act)] << actions[i].index;
  return s.str();
}

Partition tp_partition(const ModelSpec& model, int tp, int tp_rank, bool sequence_parallel) {
  return {0, model.layers + 1, tp, tp_rank, sequence_parallel && tp > 1};
}

}  // namespace strata::sharded
