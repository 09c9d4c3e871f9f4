// The sharded engine's plan, checked without running: groups tile the parameters, schedules use
// every gathered group only after waiting for it, and predictions follow the ZeRO paper's
// per-rank formulas (fp32: 4 bytes params, 4 grads, 8 AdamW) up to the stated padding.
#include <gtest/gtest.h>

#include <limits>
#include <map>

#include "strata/engines/sharded.hpp"

using namespace strata;
using namespace strata::sharded;

namespace {

ModelSpec small() { return model_preset("small"); }

PredictInput input(int dp, int rank, int nodes = 1) {
  PredictInput in;
  in.model = small();
  in.mesh.dp = dp;
  in.mesh.nodes = nodes;
  in.mesh.ranks_per_node = dp / nodes;
  in.train.micro_batch = 4;
  in.train.global_batch = 4 * dp;
  in.rank = rank;
  return in;
}

double mem(const Prediction& p, MemTag t) { return p.memory_bytes[static_cast<int>(t)]; }

// The memory the core predicts for a rank of the engine: its step plan's.
Prediction predict(const PredictInput& in, const EngineConfig& c) {
  return strata::predict(EngineStrategy("zero", c), in);
}

// The bytes per op name the core predicts for a rank: those its step plan moves.
std::map<std::string, double> planned(const PredictInput& in, const EngineConfig& c) {
  const auto bytes = plan_comm_bytes(plan_step(in, c), in.model, in.train, in.mesh.tp);
  std::map<std::string, double> named;
  for (int op = 0; op < kNumCommOps; ++op)
    if (bytes[op] > 0) named[op_name(CommOp(op))] = bytes[op];
  return named;
}

EngineConfig stage(int s) {
  EngineConfig c;
  c.bucket_mb = 1;
  c.shard_grads = s >= 2;
  c.shard_params = s >= 3;
  return c;
}

}  // namespace

TEST(Groups, TileTheParametersAndPadToTheShardCount) {
  ParamLayout layout(small());
  for (int shards : {1, 3, 4}) {
    for (const EngineConfig& c : {stage(1), stage(3)}) {
      auto groups = make_groups(layout, shards, c);
      std::size_t next = 0;
      for (const ShardGroup& g : groups) {
        EXPECT_EQ(g.offset, next);
        EXPECT_EQ(g.padded() % shards, 0u);
        EXPECT_GE(g.padded(), g.count);
        EXPECT_LT(g.padded() - g.count, std::size_t(shards));
        std::size_t valid = 0;
        for (int i = 0; i < shards; ++i) valid += g.valid(i);
        EXPECT_EQ(valid, g.count);
        next += g.count;
      }
      EXPECT_EQ(next, layout.total());
    }
  }
  EXPECT_EQ(make_groups(layout, 4, stage(3)).size(), std::size_t(layout.num_units()));
}

// Every group gathered before its passes, everything released at the end; a tied model's embedding
// group (the head reads its wte, writes its gradient) held from its forward to its backward, an
// untied one's (a llama's) resharded after its forward like the others.
TEST(Schedule, GatheredBeforeUseAndEverythingReleased) {
  ParamLayout layout(small());
  EngineConfig fsdp = stage(3);
  for (bool tied : {true, false})
    for (int prefetch : {0, 1, 2})
      for (bool post : {false, true})
        for (bool reshard : {false, true}) {
          SCOPED_TRACE(std::string(tied ? "tied" : "untied") + " prefetch " +
                       std::to_string(prefetch) + (post ? " post" : "") +
                       (reshard ? " reshard" : ""));
          bool embedding_freed_in_forward = false;
          EngineConfig c = fsdp;
          c.forward_prefetch = c.backward_prefetch = prefetch;
          c.prefetch_post = post;
          c.reshard_after_forward = reshard;
          c.max_gathers_in_flight = 2;
          auto groups = make_groups(layout, 4, c);
          std::vector<int> group_of;
          for (std::size_t g = 0; g < groups.size(); ++g)
            for (int u = groups[g].first_unit; u <= groups[g].last_unit; ++u)
              group_of.push_back(int(g));
          std::vector<int> state(groups.size(), 0);  // 0 free, 1 issued, 2 ready
          std::vector<bool> grads(groups.size(), false), reducing(groups.size(), false);
          int fwd = 0, bwd = 0, in_flight = 0, max_in_flight = 0;
          for (const Action& a : micro_batch_schedule(groups, layout.num_units(), c, tied)) {
            switch (a.act) {
              case Act::gather:
                ASSERT_EQ(state[a.index], 0);
                state[a.index] = 1;
                max_in_flight = std::max(max_in_flight, ++in_flight);
                break;
              case Act::wait_gather:
                ASSERT_EQ(state[a.index], 1);
                state[a.index] = 2;
                --in_flight;
                break;
              case Act::forward:
                ASSERT_EQ(state[group_of[a.index]], 2) << "forward of unit " << a.index;
                ++fwd;
                if (tied && a.index == layout.num_units() - 1)
                  ASSERT_EQ(state[0], 2) << "tied weight";
                break;
              case Act::backward:
                ASSERT_EQ(state[group_of[a.index]], 2);
                ASSERT_TRUE(grads[group_of[a.index]]);
                ++bwd;
                if (tied && a.index == layout.num_units() - 1)
                  ASSERT_TRUE(grads[0]) << "tied gradient";
                break;
              case Act::free_params:
                ASSERT_EQ(state[a.index], 2);
                state[a.index] = 0;
                if (a.index == 0 && bwd == 0) embedding_freed_in_forward = true;
                break;
              case Act::alloc_grads:
                ASSERT_FALSE(grads[a.index]);
                grads[a.index] = true;
                break;
              case Act::reduce_grads:
                ASSERT_TRUE(grads[a.index]);
                reducing[a.index] = true;
                break;
              case Act::finish_grads:
                ASSERT_TRUE(reducing[a.index]);
                reducing[a.index] = grads[a.index] = false;
                break;
            }
          }
          EXPECT_EQ(fwd, layout.num_units());
          EXPECT_EQ(bwd, layout.num_units());
          EXPECT_LE(max_in_flight, 2);
          EXPECT_EQ(embedding_freed_in_forward, !tied && reshard);
          for (std::size_t g = 0; g < groups.size(); ++g) {
            EXPECT_EQ(state[g], 0) << "group " << g << " still gathered";
            EXPECT_FALSE(grads[g] || reducing[g]);
          }
        }
}

TEST(Predict, FollowsTheZeroPaperPerRank) {
  const double P = double(small().total_params());
  const int n = 4;
  const double pad = 4.0 * n;  // at most n-1 padding elements per group, a handful of groups
  for (int s : {1, 2, 3}) {
    Prediction p = predict(input(n, 1), stage(s));
    // Optimizer state: 8 bytes per parameter, divided by n in every stage.
    EXPECT_NEAR(mem(p, MemTag::optimizer), 8 * P / n, 8 * pad) << "zero" << s;
    // Parameters: replicated in zero1/2, divided by n in zero3.
    EXPECT_NEAR(mem(p, MemTag::params), s == 3 ? 4 * P / n : 4 * P, 4 * pad * 8) << "zero" << s;
  }
  // zero1 keeps full gradients plus its reduced shard; zero2/3 the shard plus working buckets.
  EXPECT_NEAR(mem(predict(input(n, 0), stage(1)), MemTag::grads), 4 * P + 4 * P / n, 4 * pad * 8);
  EXPECT_LT(mem(predict(input(n, 0), stage(2)), MemTag::grads), 4 * P);
  // Bytes on the wire: 2x parameters for zero1/2, about 3x for zero3 (nccl-tests sizes).
  auto bytes = [](const std::map<std::string, double>& planned_bytes) {
    double b = 0;
    for (const auto& [op, v] : planned_bytes) b += v;
    return b;
  };
  EXPECT_NEAR(bytes(planned(input(n, 0), stage(1))), 8 * P, 8 * 4 * n * 8);
  EXPECT_NEAR(bytes(planned(input(n, 0), stage(2))), 8 * P, 8 * 4 * n * 8);
  // zero3: 3x (gather for forward, again for backward, reduce-scatter) less the first and last
  // groups, which stay gathered from forward to backward (tied embedding; head).
  auto groups = make_groups(ParamLayout(small()), n, stage(3));
  double padded = 0;
  for (const auto& g : groups) padded += double(g.padded());
  double kept = double(groups.front().padded() + groups.back().padded());
  EXPECT_DOUBLE_EQ(bytes(planned(input(n, 0), stage(3))), 4 * (3 * padded - kept) + 8);
  EXPECT_GT(bytes(planned(input(n, 0), stage(3))), 2.7 * 4 * P);
  // Hybrid: the inter-node all-reduce moves one node-shard of the gradients.
  EngineConfig hybrid = stage(3);
  hybrid.hybrid = true;
  EXPECT_NEAR(planned(input(4, 0, 2), hybrid).at("all_reduce"), 4 * P / 2 + 8, 4 * 2 * 8);
  // One rank: nothing to communicate.
  EXPECT_TRUE(planned(input(1, 0), stage(3)).empty());
}

// offload=optimizer moves AdamW state (8 bytes per element of the rank's shard, 12 with bf16
// masters) off the device into the host tag, beside host copies of the rank's gradient and
// parameter shards; nothing else on the device and no byte on the wire changes; the device<->host
// copies are predicted as ops d2h and h2d.
TEST(Predict, OffloadMovesTheOptimizerStateToTheHost) {
  const int n = 4, rank = 1;
  for (bool bf16 : {false, true})
    for (int s : {1, 3}) {
      PredictInput in = input(n, rank);
      if (bf16) in.train.precision.param = DType::bf16;
      EngineConfig off = stage(s);
      off.offload_optimizer = true;
      const Prediction base = predict(in, stage(s)), p = predict(in, off);
      double valid = 0;
      for (const ShardGroup& g : make_groups(ParamLayout(small()), n, off))
        valid += double(g.valid(rank));
      const double state = bf16 ? 12 : 8, staged = 4 + (bf16 ? 2 : 4);
      EXPECT_EQ(mem(p, MemTag::optimizer), 0) << "zero" << s;
      EXPECT_EQ(mem(base, MemTag::optimizer), state * valid) << "zero" << s;
      EXPECT_EQ(mem(base, MemTag::offload), 0) << "zero" << s;
      EXPECT_EQ(mem(p, MemTag::offload), (state + staged) * valid) << "zero" << s;
      for (MemTag t : {MemTag::params, MemTag::grads, MemTag::activations, MemTag::comm_buffers,
                       MemTag::workspace})
        EXPECT_EQ(mem(p, t), mem(base, t)) << tag_name(t) << " zero" << s;
      // The transfers, once per step: the gradient shard (fp32 reduce: 4 bytes per element)
      // and, with fp32 parameters, the parameter shard down; the parameter shard back up.
      std::map<std::string, double> wire = planned(in, off);
      const std::map<std::string, double> base_wire = planned(in, stage(s));
      EXPECT_EQ(wire.at("d2h"), (bf16 ? 4 : 8) * valid) << "zero" << s;
      EXPECT_EQ(wire.at("h2d"), (bf16 ? 2 : 4) * valid) << "zero" << s;
      wire.erase("d2h"), wire.erase("h2d");
      EXPECT_EQ(wire, base_wire) << "zero" << s;
      EXPECT_FALSE(base_wire.count("d2h") || base_wire.count("h2d"));
    }
}

namespace {

// dp 4 carved into 2 ep groups of 2 (each run of experts over the 2 ranks of ep_dp), a micro-batch
// of 1 a rank.
PredictInput ep_input(const ModelSpec& moe) {
  PredictInput in;
  in.model = moe;
  in.mesh.dp = 4, in.mesh.ep = 2, in.mesh.ranks_per_node = 4;
  in.train.micro_batch = 1, in.train.global_batch = 4;
  return in;
}

// Rank `rank`'s whole model with its ep group's half of the experts.
Partition ep_part(const ModelSpec& moe, int rank) {
  Partition part = whole_model(moe);
  part.ep_size = 2, part.ep_rank = rank % 2;
  return part;
}

// The AdamW state (plan_state's MemTag::optimizer) of `rank` on `part`.
double optimizer_state(PredictInput in, int rank, const EngineConfig& c, const Partition& part) {
  in.rank = rank;
  std::vector<PlanAction> setup;
  plan_state(in, c, {part}, rank_shards(in, c, {part}), setup);
  double bytes = 0;
  for (const PlanAction& a : setup)
    if (a.op == PlanOp::alloc && a.memory == MemTag::optimizer) bytes += a.bytes;
  return bytes;
}

}  // namespace

// Expert parallelism under zero1 (Megatron-Core's distributed optimizer with EP): a moe block's
// groups are runs of its dense tensors (over the 4 dp ranks), its routed experts' (over the 2
// ranks of ep_dp holding the same experts) and its shared experts' after them; they tile the
// partition in its own order (a unit's view spans them) with less than a shard of room after it,
// and the 4 ranks' AdamW state together is the whole model's once (ZeRO-1: 8 bytes a parameter
// over dp, nothing replicated), the experts' of both ep groups included.
TEST(Groups, ExpertParallelZero1ShardsTheExpertsOverTheirReplicas) {
  ModelSpec moe = model_preset("tiny-moe");
  moe.shared_experts = 1;
  EngineConfig zero1;
  zero1.bucket_mb = std::numeric_limits<double>::infinity();
  const PredictInput in = ep_input(moe);
  double state = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const Partition part = ep_part(moe, rank);
    const Placement at = placement(in.mesh, rank, zero1);
    EXPECT_EQ(at.index, rank);
    EXPECT_EQ(at.expert_shards, 2);
    EXPECT_EQ(at.expert_index, rank / 2);
    const auto groups = make_groups(moe, {part}, at.shards, zero1);
    const auto tensors = StageModel::local_tensors(moe, part);
    std::size_t next = 0, total = 0;
    for (const LocalTensor& t : tensors) total += t.count;
    int expert_groups = 0;
    for (const ShardGroup& g : groups) {
      EXPECT_EQ(g.offset, next);
      EXPECT_EQ(g.shards, g.experts ? 2 : 4);
      for (const LocalTensor& t : tensors)
        if (t.offset >= g.offset && t.offset < g.offset + g.count)
          EXPECT_EQ(t.shard == ShardKind::experts, g.experts) << "tensor " << t.global;
      expert_groups += g.experts;
      next += g.count;
    }
    EXPECT_EQ(next, total);
    EXPECT_EQ(expert_groups, moe.layers);
    const auto buckets = bucket_groups(groups);  // zero1: the chunk is one bucket of every run
    ASSERT_EQ(buckets.size(), 1u);
    EXPECT_EQ(buckets[0].count, total);
    EXPECT_EQ(groups.size(), std::size_t(2 * moe.layers + 1));  // the shared experts join the
                                                                // next block's dense run
    const ReplicaLayout layout = replica_layout(groups);
    EXPECT_TRUE(layout.contiguous);
    for (std::size_t g = 0; g < groups.size(); ++g) EXPECT_EQ(layout.base[g], groups[g].offset);
    EXPECT_GE(layout.size, total);
    EXPECT_LT(layout.size - total, 4u);
    state += optimizer_state(in, rank, zero1, part);
  }
  EXPECT_DOUBLE_EQ(state, 8.0 * double(moe.total_params()));
}

// FSDP with expert parallelism (torchtitan's FSDP2 with EP): every unit a bucket, a moe block's
// cut into its dense run (over dp) and its experts' (over ep_dp); the schedule sees the units
// (bucket_groups), whose one buffer holds its runs back to back with less than a shard of each
// run's padding after it; the ranks' AdamW state together is the model's once.
TEST(Groups, ExpertParallelFsdpBucketsAreUnitsOfRuns) {
  const ModelSpec moe = model_preset("tiny-moe");
  EngineConfig fsdp = stage(3);
  fsdp.units_per_group = 1;
  const PredictInput in = ep_input(moe);
  double state = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const Partition part = ep_part(moe, rank);
    const Placement at = placement(in.mesh, rank, fsdp);
    const auto groups = make_groups(moe, {part}, at.shards, fsdp);
    const auto buckets = bucket_groups(groups);
    const auto units = StageModel::unit_ranges(moe, part);
    ASSERT_EQ(buckets.size(), units.size());
    EXPECT_EQ(groups.size(), units.size() + std::size_t(moe.layers));  // + each block's experts
    for (int b = 0; b < int(buckets.size()); ++b) {
      EXPECT_EQ(buckets[b].first_unit, b);
      EXPECT_EQ(buckets[b].last_unit, b);
      EXPECT_EQ(buckets[b].offset, units[std::size_t(b)].first);
      EXPECT_EQ(buckets[b].count, units[std::size_t(b)].second);
      std::size_t runs = 0, padding = 0;
      for (const ShardGroup& g : groups)
        if (g.bucket == b) ++runs, padding += g.padded() - g.count;
      EXPECT_EQ(runs, b == 0 || b == moe.layers + 1 ? 1u : 2u);
      EXPECT_GE(bucket_span(groups, b), buckets[b].count);
      EXPECT_LE(bucket_span(groups, b), buckets[b].count + padding);
    }
    state += optimizer_state(in, rank, fsdp, part);
  }
  EXPECT_DOUBLE_EQ(state, 8.0 * double(moe.total_params()));
}
