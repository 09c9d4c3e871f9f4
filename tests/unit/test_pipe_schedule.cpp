// Megatron-LM's pipeline schedules, ZB-H1 and ZB-V, checked without running: every rank runs each
// forward and backward (and weight pass) once, activations in flight follow the schedule's
// warm-up, and the simulated step (non-blocking sends, zero transfer time) never deadlocks and has
// exactly the bubble the papers predict: (p - 1) / (m + p - 1), (p - 1) / (v * m + p - 1)
// interleaved, and with F, B and W of equal cost (p - 1) / (3 m + p - 1) for zb-h1; zb-v's below
// zb-h1's at 1f1b's memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "strata/engines/model_parallel.hpp"
#include "strata/engines/pipe_schedule.hpp"

using namespace strata::pp;

namespace {

struct Shape {
  PipeSchedule schedule;
  int stages, micro_batches, virtual_stages;
};

std::string describe(const Shape& s) {
  return std::string(schedule_name(s.schedule)) + " p=" + std::to_string(s.stages) +
         " m=" + std::to_string(s.micro_batches) + " v=" + std::to_string(s.virtual_stages);
}

// stages {1, 2, 4} x m {1, 2, 4, 8}; interleaved where m is a multiple of stages, v {2, 3}; zb-v
// (two chunks in a V).
std::vector<Shape> all_shapes() {
  std::vector<Shape> shapes;
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8}) {
      shapes.push_back({PipeSchedule::gpipe, p, m, 1});
      shapes.push_back({PipeSchedule::one_f_one_b, p, m, 1});
      shapes.push_back({PipeSchedule::zb_h1, p, m, 1});
      shapes.push_back({PipeSchedule::zb_v, p, m, 2});
      if (m % p == 0)
        for (int v : {2, 3}) shapes.push_back({PipeSchedule::interleaved, p, m, v});
    }
  return shapes;
}

std::vector<PipeAction> schedule_of(const Shape& s, int stage) {
  return pipeline_schedule(s.schedule, s.stages, stage, s.micro_batches, s.virtual_stages);
}

// Compact spelling for expected lists: F(micro) / B(micro) / W(micro) on chunk 0, or with a chunk.
PipeAction F(int micro, int chunk = 0) { return {PipePass::forward, micro, chunk}; }
PipeAction B(int micro, int chunk = 0) { return {PipePass::backward, micro, chunk}; }
PipeAction W(int micro, int chunk = 0) { return {PipePass::weight, micro, chunk}; }

// Megatron's interleaved warm-up, restated for the in-flight check.
int interleaved_warmup(int p, int stage, int m, int v) {
  if (m == p) return m * v;
  return std::min((p - stage - 1) * 2 + (v - 1) * p, m * v);
}

}  // namespace

TEST(PipeSchedule, Names) {
  EXPECT_STREQ(schedule_name(PipeSchedule::gpipe), "gpipe");
  EXPECT_STREQ(schedule_name(PipeSchedule::one_f_one_b), "1f1b");
  EXPECT_STREQ(schedule_name(PipeSchedule::interleaved), "interleaved");
  EXPECT_STREQ(schedule_name(PipeSchedule::zb_h1), "zb-h1");
  EXPECT_STREQ(schedule_name(PipeSchedule::zb_v), "zb-v");
  EXPECT_TRUE(splits_backward(PipeSchedule::zb_h1));
  EXPECT_TRUE(splits_backward(PipeSchedule::zb_v));
  EXPECT_FALSE(splits_backward(PipeSchedule::one_f_one_b));
}

TEST(PipeSchedule, GlobalChunkIsChunkTimesStagesPlusStage) {
  constexpr ChunkPlacement loop = ChunkPlacement::loop;
  EXPECT_EQ(global_chunk(loop, 1, 0, 0), 0);
  EXPECT_EQ(global_chunk(loop, 4, 0, 0), 0);
  EXPECT_EQ(global_chunk(loop, 4, 3, 0), 3);
  EXPECT_EQ(global_chunk(loop, 4, 0, 1), 4);
  EXPECT_EQ(global_chunk(loop, 4, 2, 2), 10);
  EXPECT_EQ(chunk_stage(loop, 4, 10), 2);
  EXPECT_THROW(global_chunk(loop, 4, 4, 0), std::invalid_argument);
  EXPECT_THROW(global_chunk(loop, 4, 0, -1), std::invalid_argument);
  EXPECT_EQ(chunk_placement(PipeSchedule::interleaved), loop);
}

// zb-v's V: rank s holds chunks s and 2p - 1 - s, so rank 0 holds the first and the last, rank
// p - 1 the two in the middle; chunk_stage inverts global_chunk.
TEST(PipeSchedule, ZeroBubbleVPlacesChunksInAV) {
  constexpr ChunkPlacement v = ChunkPlacement::v_shape;
  EXPECT_EQ(chunk_placement(PipeSchedule::zb_v), v);
  EXPECT_EQ(global_chunk(v, 4, 0, 0), 0);
  EXPECT_EQ(global_chunk(v, 4, 0, 1), 7);
  EXPECT_EQ(global_chunk(v, 4, 3, 0), 3);
  EXPECT_EQ(global_chunk(v, 4, 3, 1), 4);
  EXPECT_EQ(global_chunk(v, 4, 1, 1), 6);
  for (int p : {1, 2, 4})
    for (int k = 0; k < 2 * p; ++k) {
      const int s = chunk_stage(v, p, k);
      EXPECT_EQ(global_chunk(v, p, s, k < p ? 0 : 1), k) << p << " " << k;
    }
  EXPECT_THROW(global_chunk(v, 4, 0, 2), std::invalid_argument);
  EXPECT_THROW(chunk_stage(v, 4, 8), std::invalid_argument);
}

TEST(PipeSchedule, EveryPairOnceForwardBeforeBackward) {
  for (const Shape& s : all_shapes())
    for (int stage = 0; stage < s.stages; ++stage) {
      SCOPED_TRACE(describe(s) + " stage " + std::to_string(stage));
      const std::vector<PipeAction> actions = schedule_of(s, stage);
      const int passes = splits_backward(s.schedule) ? 3 : 2;
      ASSERT_EQ(actions.size(), std::size_t(passes * s.micro_batches * s.virtual_stages));
      std::map<std::pair<int, int>, int> at[3];  // by pass
      for (int i = 0; i < int(actions.size()); ++i) {
        const PipeAction& a = actions[i];
        ASSERT_GE(a.micro, 0);
        ASSERT_LT(a.micro, s.micro_batches);
        ASSERT_GE(a.chunk, 0);
        ASSERT_LT(a.chunk, s.virtual_stages);
        ASSERT_TRUE(at[int(a.pass)].emplace(std::pair(a.micro, a.chunk), i).second)
            << "repeated action";
      }
      const auto& forward_at = at[int(PipePass::forward)];
      const auto& backward_at = at[int(PipePass::backward)];
      const auto& weight_at = at[int(PipePass::weight)];
      ASSERT_EQ(forward_at.size(), std::size_t(s.micro_batches * s.virtual_stages));
      ASSERT_EQ(backward_at.size(), forward_at.size());
      ASSERT_EQ(weight_at.size(), passes == 3 ? forward_at.size() : 0);
      for (const auto& [pair, i] : forward_at) EXPECT_LT(i, backward_at.at(pair));
      for (const auto& [pair, i] : weight_at) EXPECT_LT(backward_at.at(pair), i);
    }
}

TEST(PipeSchedule, GpipeHoldsEveryMicroBatch) {
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8})
      for (int stage = 0; stage < p; ++stage) {
        const auto actions = pipeline_schedule(PipeSchedule::gpipe, p, stage, m);
        EXPECT_EQ(max_in_flight(actions), m);
        EXPECT_EQ(max_in_flight(actions, 0), m);
      }
}

TEST(PipeSchedule, OneFOneBHoldsAtMostStagesMinusStage) {
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8})
      for (int stage = 0; stage < p; ++stage) {
        const auto actions = pipeline_schedule(PipeSchedule::one_f_one_b, p, stage, m);
        EXPECT_EQ(max_in_flight(actions), std::min(p - stage, m)) << p << " " << m << " " << stage;
        EXPECT_LE(max_in_flight(actions), p);
      }
}

TEST(PipeSchedule, InterleavedHoldsWarmupPlusOne) {
  for (int p : {1, 2, 4})
    for (int m : {4, 8})
      for (int v : {2, 3})
        for (int stage = 0; stage < p; ++stage) {
          const auto actions = pipeline_schedule(PipeSchedule::interleaved, p, stage, m, v);
          // Steady state runs one forward before each backward, so it adds one to the warm-up.
          const int expected = std::min(interleaved_warmup(p, stage, m, v) + 1, m * v);
          EXPECT_EQ(max_in_flight(actions), expected) << p << " " << m << " " << v << " " << stage;
        }
  // Per chunk, stage 0 of p=4, m=8, v=2: the warm-up of 10 runs chunk 0 micros 0-3, chunk 1
  // micros 0-3, chunk 0 micros 4-5; steady state adds chunk 0 micro 6 before the first backward
  // (chunk 1 micro 0), and chunk 0 fills to all 8 micros before its first backward.
  const auto stage0 = pipeline_schedule(PipeSchedule::interleaved, 4, 0, 8, 2);
  EXPECT_EQ(max_in_flight(stage0), 11);
  EXPECT_EQ(max_in_flight(stage0, 0), 8);
  EXPECT_EQ(max_in_flight(stage0, 1), 4);
}

TEST(PipeSchedule, HandWrittenLists) {
  using List = std::vector<PipeAction>;
  EXPECT_EQ(pipeline_schedule(PipeSchedule::gpipe, 4, 2, 3),
            (List{F(0), F(1), F(2), B(0), B(1), B(2)}));
  EXPECT_EQ(pipeline_schedule(PipeSchedule::one_f_one_b, 4, 0, 8),
            (List{F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), F(6), B(3), F(7), B(4),
                  B(5), B(6), B(7)}));
  EXPECT_EQ(pipeline_schedule(PipeSchedule::one_f_one_b, 4, 3, 8),
            (List{F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3), F(4), B(4), F(5), B(5), F(6),
                  B(6), F(7), B(7)}));
  // Fewer micro-batches than the warm-up: all forwards, then all backwards.
  EXPECT_EQ(pipeline_schedule(PipeSchedule::one_f_one_b, 4, 0, 2), (List{F(0), F(1), B(0), B(1)}));
  // Interleaved p=2, v=2, m=4: groups of 2 micro-batches through chunk 0 then chunk 1; backwards
  // from chunk 1 down. Stage 0 warms up 2 * 1 + 1 * 2 = 4 forwards, stage 1 warms up 2.
  EXPECT_EQ(pipeline_schedule(PipeSchedule::interleaved, 2, 0, 4, 2),
            (List{F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(2, 0), B(0, 1), F(3, 0), B(1, 1), F(2, 1),
                  B(0, 0), F(3, 1), B(1, 0), B(2, 1), B(3, 1), B(2, 0), B(3, 0)}));
  EXPECT_EQ(pipeline_schedule(PipeSchedule::interleaved, 2, 1, 4, 2),
            (List{F(0, 0), F(1, 0), F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 0), B(0, 0), F(3, 0),
                  B(1, 0), F(2, 1), B(2, 1), F(3, 1), B(3, 1), B(2, 0), B(3, 0)}));
  // m == p: Megatron runs all forwards, then all backwards.
  EXPECT_EQ(pipeline_schedule(PipeSchedule::interleaved, 2, 1, 2, 2),
            (List{F(0, 0), F(1, 0), F(0, 1), F(1, 1), B(0, 1), B(1, 1), B(0, 0), B(1, 0)}));
}

TEST(PipeSchedule, SimulationNeverDeadlocks) {
  for (const Shape& s : all_shapes()) {
    const PipeSimulation sim =
        simulate_pipeline(s.schedule, s.stages, s.micro_batches, s.virtual_stages);
    EXPECT_FALSE(sim.deadlock) << describe(s);
    ASSERT_EQ(sim.busy.size(), std::size_t(s.stages));
    ASSERT_EQ(sim.idle.size(), std::size_t(s.stages));
  }
}

TEST(PipeSchedule, SimulatedBubbleMatchesPaper) {
  const double f = 1.0, b = 2.0;
  for (const Shape& s : all_shapes()) {
    if (splits_backward(s.schedule)) continue;  // below
    SCOPED_TRACE(describe(s));
    const int p = s.stages, m = s.micro_batches, v = s.virtual_stages;
    const PipeSimulation sim = simulate_pipeline(s.schedule, p, m, v, {f, b, b / 2});
    // Useful work m * (f + b) per rank, plus the ramp of (p - 1) chunk slots of (f + b) / v.
    EXPECT_NEAR(sim.makespan, m * (f + b) + (p - 1) * (f + b) / v, 1e-12);
    const double expected = double(p - 1) / (v * m + p - 1);
    EXPECT_NEAR(predicted_bubble_fraction(s.schedule, p, m, v), expected, 1e-15);
    for (int r = 0; r < p; ++r) {
      EXPECT_NEAR(sim.busy[r], m * (f + b), 1e-12) << "rank " << r;
      EXPECT_NEAR(sim.idle[r] / sim.makespan, expected, 1e-12) << "rank " << r;
    }
  }
}

TEST(PipeSchedule, SimulatedBubbleStages4Micro8) {
  const auto fraction = [](PipeSchedule schedule, int v) {
    const PipeSimulation sim = simulate_pipeline(schedule, 4, 8, v);
    return sim.idle[0] / sim.makespan;
  };
  EXPECT_NEAR(fraction(PipeSchedule::gpipe, 1), 3.0 / 11, 1e-12);
  EXPECT_NEAR(fraction(PipeSchedule::one_f_one_b, 1), 3.0 / 11, 1e-12);
  EXPECT_NEAR(fraction(PipeSchedule::interleaved, 2), 3.0 / 19, 1e-12);
  EXPECT_NEAR(simulate_pipeline(PipeSchedule::interleaved, 4, 8, 2).makespan, 28.5, 1e-12);
}

// ZB-H1 with F, B and W of equal cost: every rank busy 3m, the step 3m + (p - 1) where m >= p
// (the paper's bubble of (p - 1)(f + b - w)), a third of 1f1b's (p - 1)(f + b + w) on the same
// work. With fewer micro-batches than stages the ramp is longer, still below 1f1b's.
TEST(PipeSchedule, ZeroBubbleH1HasAThirdOfOneFOneBsBubble) {
  const PassCosts equal{1.0, 2.0, 1.0};
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const PipeSimulation zb = simulate_pipeline(PipeSchedule::zb_h1, p, m, 1, equal);
      const PipeSimulation fb = simulate_pipeline(PipeSchedule::one_f_one_b, p, m, 1, equal);
      ASSERT_FALSE(zb.deadlock);
      for (int r = 0; r < p; ++r) EXPECT_NEAR(zb.busy[r], 3.0 * m, 1e-12);
      EXPECT_NEAR(fb.makespan, 3.0 * (m + p - 1), 1e-12);
      if (m >= p) {
        EXPECT_NEAR(zb.makespan, 3.0 * m + (p - 1), 1e-12);
        for (int r = 0; r < p; ++r)
          EXPECT_NEAR(zb.idle[r] / zb.makespan,
                      predicted_bubble_fraction(PipeSchedule::zb_h1, p, m), 1e-12);
      }
      if (p > 1) EXPECT_LT(zb.makespan, fb.makespan);
    }
  EXPECT_NEAR(predicted_bubble_fraction(PipeSchedule::zb_h1, 4, 8), 3.0 / 27, 1e-15);
}

// Activations are held from a forward to its weight pass: zb-h1's stage s defers s weight passes
// after 1f1b's warm-up of p - s - 1 forwards, so every stage holds min(p, m) micro-batches at most,
// 1f1b's first stage's peak.
TEST(PipeSchedule, ZeroBubbleH1HoldsOneFOneBsPeak) {
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8})
      for (int stage = 0; stage < p; ++stage) {
        const auto zb = pipeline_schedule(PipeSchedule::zb_h1, p, stage, m);
        const auto fb = pipeline_schedule(PipeSchedule::one_f_one_b, p, 0, m);
        EXPECT_EQ(max_in_flight(zb), max_in_flight(fb)) << p << " " << m << " " << stage;
      }
  using List = std::vector<PipeAction>;
  EXPECT_EQ(pipeline_schedule(PipeSchedule::zb_h1, 2, 0, 4),
            (List{F(0), F(1), B(0), W(0), F(2), B(1), W(1), F(3), B(2), W(2), B(3), W(3)}));
  EXPECT_EQ(pipeline_schedule(PipeSchedule::zb_h1, 2, 1, 4),
            (List{F(0), B(0), F(1), B(1), W(0), F(2), B(2), W(1), F(3), B(3), W(2), W(3)}));
}

// ZB-V with F, B and W of equal cost (a chunk's each half a stage's): every rank busy 3m. Its ramp
// is zb-h1's (p - 1) up to m = p and shorter beyond; from m = 2p on it is (p - 1) / 2, a chunk's
// forward per stage: half zb-h1's bubble.
TEST(PipeSchedule, ZeroBubbleVHasLessBubbleThanZeroBubbleH1) {
  const PassCosts equal{1.0, 2.0, 1.0};
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 2, 4, 8, 16, 32}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const PipeSimulation zv = simulate_pipeline(PipeSchedule::zb_v, p, m, 2, equal);
      const PipeSimulation zh = simulate_pipeline(PipeSchedule::zb_h1, p, m, 1, equal);
      ASSERT_FALSE(zv.deadlock);
      for (int r = 0; r < p; ++r) EXPECT_NEAR(zv.busy[r], 3.0 * m, 1e-12);
      if (m <= p) EXPECT_NEAR(zv.makespan, zh.makespan, 1e-12);
      if (m > p && p > 1) EXPECT_LT(zv.makespan, zh.makespan);
      if (m >= 2 * p) EXPECT_NEAR(zv.makespan, 3.0 * m + (p - 1) / 2.0, 1e-12);
      double idle = 0;
      for (double i : zv.idle) idle += i;
      EXPECT_NEAR(predicted_bubble_fraction(PipeSchedule::zb_v, p, m, 2), idle / p / zv.makespan,
                  1e-12);
    }
}

// Every rank holds at most 2p chunk micro-batches, each half a stage: 1f1b's first stage's p.
// The turn at rank p - 1 is local: chunk 1's B of a micro-batch leaves its d(input) in chunk 0's
// d(output) scratch, which chunk 0's B of that micro-batch reads, so no backward or weight pass
// of chunk 0 (which would use that scratch) comes between.
TEST(PipeSchedule, ZeroBubbleVHoldsOneFOneBsPeakAndKeepsTheTurnsSlot) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 2, 4, 8, 16}) {
      int peak = 0;
      for (int stage = 0; stage < p; ++stage) {
        SCOPED_TRACE(std::to_string(p) + " " + std::to_string(m) + " " + std::to_string(stage));
        const auto zv = pipeline_schedule(PipeSchedule::zb_v, p, stage, m, 2);
        peak = std::max(peak, max_in_flight(zv));
        if (stage != p - 1) continue;
        for (int micro = 0; micro < m; ++micro) {
          const auto at = [&](PipeAction a) { return std::find(zv.begin(), zv.end(), a); };
          const auto passes = std::count_if(at(B(micro, 1)), at(B(micro, 0)),
                                            [](auto& a) { return !a.forward() && a.chunk == 0; });
          EXPECT_LT(at(B(micro, 1)), at(B(micro, 0)));
          EXPECT_EQ(passes, 0) << "micro " << micro;
        }
      }
      EXPECT_EQ(peak, 2 * std::min(p, m)) << p << " " << m;
    }
  using List = std::vector<PipeAction>;
  // p = 2, m = 4: stage 0 runs 3 forwards down the V, stage 1 one; then each its chunk 1's passes.
  EXPECT_EQ(pipeline_schedule(PipeSchedule::zb_v, 2, 0, 4, 2),
            (List{F(0),    F(1),    F(2),    F(0, 1), B(0, 1), W(0, 1), F(1, 1), B(1, 1),
                  W(1, 1), F(3),    B(0),    W(0),    F(2, 1), B(2, 1), W(2, 1), B(1),
                  W(1),    F(3, 1), B(3, 1), W(3, 1), B(2),    W(2),    B(3),    W(3)}));
}

TEST(PipeSchedule, SimulationDetectsDeadlock) {
  // Rank 0's backward of micro 0 waits for rank 1's, which runs after rank 1's forward of micro 1,
  // which waits for rank 0's forward of micro 1, which runs after rank 0's backward of micro 0.
  const std::vector<std::vector<PipeAction>> lists = {{F(0), B(0), F(1), B(1)},
                                                      {F(1), B(1), F(0), B(0)}};
  EXPECT_TRUE(simulate_actions(lists, 2).deadlock);
  // The 1f1b order of the same two ranks runs.
  const std::vector<std::vector<PipeAction>> good = {{F(0), F(1), B(0), B(1)},
                                                     {F(0), B(0), F(1), B(1)}};
  const PipeSimulation sim = simulate_actions(good, 2);
  EXPECT_FALSE(sim.deadlock);
  EXPECT_DOUBLE_EQ(sim.makespan, 9.0);
  EXPECT_THROW(simulate_actions(lists, 1), std::invalid_argument);  // micro 1 out of range
}

TEST(PipeSchedule, InvalidArgumentsThrow) {
  const auto message = [](auto&& call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_EQ(message([] { pipeline_schedule(PipeSchedule::interleaved, 4, 0, 6, 2); }),
            "interleaved schedule: micro-batches (6) must be a multiple of pipeline stages (4)");
  EXPECT_EQ(message([] { pipeline_schedule(PipeSchedule::interleaved, 4, 0, 8, 0); }),
            "interleaved schedule: virtual_stages must be >= 1 (got 0)");
  EXPECT_EQ(message([] { pipeline_schedule(PipeSchedule::one_f_one_b, 4, 4, 8); }),
            "1f1b schedule: stage (4) must be in [0, 4)");
  EXPECT_EQ(message([] { pipeline_schedule(PipeSchedule::gpipe, 4, 0, 0); }),
            "gpipe schedule: micro_batches must be >= 1 (got 0)");
  EXPECT_EQ(message([] { pipeline_schedule(PipeSchedule::gpipe, 4, 0, 8, 2); }),
            "gpipe schedule: virtual_stages must be 1 (got 2)");
  EXPECT_THROW(pipeline_schedule(PipeSchedule::one_f_one_b, 4, -1, 8), std::invalid_argument);
  EXPECT_THROW(pipeline_schedule(PipeSchedule::one_f_one_b, 0, 0, 8), std::invalid_argument);
  EXPECT_THROW(simulate_pipeline(PipeSchedule::interleaved, 4, 6, 2), std::invalid_argument);
  EXPECT_THROW(simulate_pipeline(PipeSchedule::gpipe, 4, 8, 1, {-1.0, 2.0, 1.0}),
               std::invalid_argument);
  EXPECT_THROW(simulate_pipeline(PipeSchedule::zb_h1, 4, 8, 1, {1.0, 1.0, 2.0}),
               std::invalid_argument);  // the weight part larger than the backward
  EXPECT_THROW(predicted_bubble_fraction(PipeSchedule::interleaved, 4, 6, 2),
               std::invalid_argument);
}

// How often each of Shards' actions ran per group, and the reductions in flight.
struct DpCounts {
  std::vector<int> gathered, waited, freed, allocated, reduced, finished;
  int in_flight = 0, most_in_flight = 0;
  explicit DpCounts(int groups)
      : gathered(groups),
        waited(groups),
        freed(groups),
        allocated(groups),
        reduced(groups),
        finished(groups) {}
  void apply(const strata::sharded::Action& a) {
    using strata::sharded::Act;
    const int g = a.index;
    switch (a.act) {
      case Act::gather:
        ++gathered[g];
        break;
      case Act::wait_gather:
        ++waited[g];
        break;
      case Act::free_params:
        ++freed[g];
        break;
      case Act::alloc_grads:
        ++allocated[g];
        break;
      case Act::reduce_grads:
        ++reduced[g], most_in_flight = std::max(most_in_flight, ++in_flight);
        break;
      case Act::finish_grads:
        ++finished[g], --in_flight;
        break;
      default:
        ADD_FAILURE() << "a pass among the data-parallel actions";
    }
  }
};

// The data-parallel axis under a pipeline (model_parallel.hpp: dp_schedule, torchtitan's FSDP2
// with PP): each unit gathered once per step, in its chunk's first forward and before that unit's
// pass, freed after its chunk's last backward; gradients allocated before the chunk's first
// backward and reduced once, after the unit's pass in the chunk's last backward (the units holding
// the tied embedding at the end), at most one reduction left in flight behind the next.
TEST(PipeDpSchedule, GathersAndReducesOncePerStepAtTheChunksFirstAndLastPass) {
  using namespace strata;
  ModelSpec model = model_preset("tiny");
  model.layers = 8;
  for (const char* dp : {"zero2", "fsdp"})
    for (int stage : {0, 1}) {
      SCOPED_TRACE(std::string(dp) + " stage " + std::to_string(stage));
      mp::MpConfig cfg;
      cfg.dp = mp::dp_mode(dp);
      cfg.prefetch = 2;
      const int P = 2, v = 2, m = 4;
      const auto units = mp::chunk_units(model, P * v, {});
      std::vector<Partition> parts;
      for (int c = 0; c < v; ++c) {
        const auto [first, last] =
            units[std::size_t(global_chunk(ChunkPlacement::loop, P, stage, c))];
        parts.push_back(Partition{first, last, 1, 0, false});
      }
      const sharded::EngineConfig c = mp::dp_axis_config(cfg);
      const auto groups = sharded::make_groups(model, parts, 2, c);
      const auto actions = pipeline_schedule(PipeSchedule::interleaved, P, stage, m, v);
      const mp::DpSchedule s = mp::dp_schedule(actions, parts, groups, c, true, model.layers + 1);
      ASSERT_EQ(s.actions(), actions.size());
      DpCounts n(int(groups.size()));
      std::vector<int> last_backward(v, -1);
      for (int i = 0; i < int(actions.size()); ++i)
        if (!actions[std::size_t(i)].forward()) last_backward[actions[std::size_t(i)].chunk] = i;
      for (int i = 0; i < int(actions.size()); ++i) {
        const PipeAction& a = actions[std::size_t(i)];
        const Partition& part = parts[std::size_t(a.chunk)];
        const auto passes = s.passes(std::size_t(i));
        ASSERT_EQ(int(passes.size()), part.last_unit - part.first_unit + 1);
        for (int k = 0; k < int(passes.size()); ++k) {
          const int u = a.forward() ? part.first_unit + k : part.last_unit - k;
          int g = 0;
          while (groups[std::size_t(g)].last_unit < u) ++g;
          for (const auto& x : passes[std::size_t(k)].before) n.apply(x);
          if (cfg.dp == mp::DpMode::fsdp) EXPECT_EQ(n.waited[g], 1) << "unit " << u;
          if (!a.forward()) EXPECT_EQ(n.allocated[g], 1) << "unit " << u;
          EXPECT_EQ(n.reduced[g], 0) << "unit " << u << " reduced before a pass";
          for (const auto& x : passes[std::size_t(k)].after) n.apply(x);
          const bool tied = u == 0 || u == model.layers + 1;
          EXPECT_EQ(n.reduced[g], i == last_backward[a.chunk] && !a.forward() && !tied ? 1 : 0);
        }
      }
      for (const auto& x : s.end) n.apply(x);
      const int gathers = cfg.dp == mp::DpMode::fsdp ? 1 : 0;
      for (int g = 0; g < int(groups.size()); ++g) {
        EXPECT_EQ(n.gathered[g], gathers);
        EXPECT_EQ(n.waited[g], gathers);
        EXPECT_EQ(n.freed[g], gathers);
        EXPECT_EQ(n.allocated[g], 1);
        EXPECT_EQ(n.reduced[g], 1);
        EXPECT_EQ(n.finished[g], 1);
      }
      EXPECT_EQ(n.in_flight, 0);
      EXPECT_LE(n.most_in_flight, 2);
    }
}
