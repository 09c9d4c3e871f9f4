// Pipeline schedules and their simulation (see pipe_schedule.hpp).
#include "strata/engines/pipe_schedule.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace strata::pp {
namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

std::string prefix(PipeSchedule schedule) {
  return std::string(schedule_name(schedule)) + " schedule: ";
}

// The checks every entry point shares; the stage index is checked where one is given.
void check_shape(PipeSchedule schedule, int stages, int micro_batches, int virtual_stages) {
  const std::string at = prefix(schedule);
  if (stages < 1) fail(at + "stages must be >= 1 (got " + std::to_string(stages) + ")");
  if (micro_batches < 1)
    fail(at + "micro_batches must be >= 1 (got " + std::to_string(micro_batches) + ")");
  if (virtual_stages < 1)
    fail(at + "virtual_stages must be >= 1 (got " + std::to_string(virtual_stages) + ")");
  const int chunks = schedule == PipeSchedule::zb_v ? 2 : 1;
  if (schedule != PipeSchedule::interleaved && virtual_stages != chunks)
    fail(at + "virtual_stages must be " + std::to_string(chunks) + " (got " +
         std::to_string(virtual_stages) + ")");
  // Megatron's interleaved order walks micro-batches in groups of `stages`.
  if (schedule == PipeSchedule::interleaved && micro_batches % stages != 0)
    fail(at + "micro-batches (" + std::to_string(micro_batches) +
         ") must be a multiple of pipeline stages (" + std::to_string(stages) + ")");
}

void check_stage(const std::string& at, int stages, int stage) {
  if (stage < 0 || stage >= stages)
    fail(at + "stage (" + std::to_string(stage) + ") must be in [0, " + std::to_string(stages) +
         ")");
}

// The shape 1f1b and interleaved share: `warmup` forwards, then (total - warmup) pairs of one
// forward and one backward, then the remaining backwards. action(k, forward) is the k-th forward
// or backward of the rank.
template <typename ActionOf>
std::vector<PipeAction> flush_schedule(int total, int warmup, ActionOf action) {
  std::vector<PipeAction> actions;
  actions.reserve(2 * static_cast<std::size_t>(total));
  int forwards = 0, backwards = 0;
  while (forwards < warmup) actions.push_back(action(forwards++, true));
  while (forwards < total) {
    actions.push_back(action(forwards++, true));
    actions.push_back(action(backwards++, false));
  }
  while (backwards < total) actions.push_back(action(backwards++, false));
  return actions;
}

std::vector<PipeAction> gpipe(int micro_batches) {
  std::vector<PipeAction> actions;
  for (int m = 0; m < micro_batches; ++m) actions.push_back({PipePass::forward, m, 0});
  // Backwards in micro-batch order, as Megatron's "all forward, all backward" mode runs them.
  for (int m = 0; m < micro_batches; ++m) actions.push_back({PipePass::backward, m, 0});
  return actions;
}

std::vector<PipeAction> one_f_one_b(int stages, int stage, int micro_batches) {
  // Later stages need fewer forwards in flight before their first backward can arrive.
  const int warmup = std::min(stages - stage - 1, micro_batches);
  return flush_schedule(micro_batches, warmup, [](int k, bool forward) {
    return PipeAction{forward ? PipePass::forward : PipePass::backward, k, 0};
  });
}

// 1f1b's forwards and backwards (input gradients only), each weight pass right after its backward
// once the stage has deferred `stage` of them: stage s holds (p - s - 1) + s + 1 = p micro-batches
// at most, 1f1b's first stage's peak, and its deferred weight passes run after its last backward,
// while the earlier stages' backwards travel up the pipeline.
std::vector<PipeAction> zb_h1(int stages, int stage, int micro_batches) {
  std::vector<PipeAction> actions;
  int weights = 0;
  for (const PipeAction& a : one_f_one_b(stages, stage, micro_batches)) {
    actions.push_back(a);
    if (a.pass == PipePass::backward && a.micro >= stage)
      actions.push_back({PipePass::weight, weights++, 0});
  }
  while (weights < micro_batches) actions.push_back({PipePass::weight, weights++, 0});
  return actions;
}

// ZB-V's order (the ZB paper's section 6, as torchtitan's ZBVZeroBubble writes it) for
// max(m, 2p - 1) micro-batches, those past m dropped: the forwards through chunk 0 fill the way
// down the V, the last p - s forwards through chunk 1 each followed by its B and W, then a steady
// F0 B0 W0 F1 B1 W1, and the cool-down's B passes before the deferred W passes. Stage s holds at
// most 2p chunks' micro-batches, each half a stage: 1f1b's first stage's peak.
std::vector<PipeAction> zb_v(int stages, int stage, int micro_batches) {
  const int p = stages, s = stage, n = std::max(micro_batches, 2 * p - 1);
  constexpr PipePass F = PipePass::forward, B = PipePass::backward, W = PipePass::weight;
  std::vector<PipeAction> actions;
  int next[2][3] = {};  // [chunk][pass]: the next micro-batch of each
  auto run = [&](int chunk, PipePass pass) {
    const int micro = next[chunk][int(pass)]++;
    if (micro < micro_batches) actions.push_back({pass, micro, chunk});
  };
  for (int i = 0; i < 2 * (p - s) - 1; ++i) run(0, F);
  for (int i = 0; i < s; ++i) run(1, F), run(0, F);
  for (int i = 0; i < p - s; ++i) run(1, F), run(1, B), run(1, W);
  while (next[1][int(F)] < next[0][int(F)] || next[0][int(F)] < n) {
    if (next[0][int(F)] < n) run(0, F);
    run(0, B), run(0, W), run(1, F), run(1, B), run(1, W);
  }
  for (int i = 0; i < s; ++i) run(0, B), run(1, B);
  for (int i = 0; i < p - s; ++i) run(0, B), run(0, W);
  while (next[1][int(W)] < next[1][int(B)]) run(1, W);
  while (next[0][int(W)] < next[0][int(B)]) run(0, W);
  return actions;
}

// Megatron's warm-up length: (v - 1) * p forwards fill every chunk but the last, and
// 2 * (p - stage - 1) more cover the round trip to the last stage and back. With exactly p
// micro-batches Megatron runs all forwards first.
int interleaved_warmup(int stages, int stage, int micro_batches, int virtual_stages) {
  const int total = micro_batches * virtual_stages;
  if (micro_batches == stages) return total;
  return std::min((stages - stage - 1) * 2 + (virtual_stages - 1) * stages, total);
}

std::vector<PipeAction> interleaved(int stages, int stage, int micro_batches, int virtual_stages) {
  const int group = stages * virtual_stages;
  // Each group of `stages` micro-batches runs through chunk 0, then chunk 1, ... (backwards from
  // the last chunk down), so every rank has work while the group travels around the ring.
  auto action = [=](int k, bool forward) {
    const int in_group = k % group;
    const int chunk = in_group / stages;
    const int micro = (k / group) * stages + in_group % stages;
    return PipeAction{forward ? PipePass::forward : PipePass::backward, micro,
                      forward ? chunk : virtual_stages - 1 - chunk};
  };
  return flush_schedule(micro_batches * virtual_stages,
                        interleaved_warmup(stages, stage, micro_batches, virtual_stages), action);
}

bool has_weight_passes(const std::vector<PipeAction>& actions) {
  return std::any_of(actions.begin(), actions.end(),
                     [](const PipeAction& a) { return a.pass == PipePass::weight; });
}

int max_in_flight_where(const std::vector<PipeAction>& actions, int chunk, bool all_chunks) {
  const PipePass last = has_weight_passes(actions) ? PipePass::weight : PipePass::backward;
  // The open (micro, chunk) pairs as flags: the advisor asks this of every stage it plans, and a
  // tree's node per forward was a sixth of its allocations.
  int micros = 0, chunks = 0;
  for (const PipeAction& a : actions)
    micros = std::max(micros, a.micro + 1), chunks = std::max(chunks, a.chunk + 1);
  std::vector<char> open(std::size_t(micros) * std::size_t(chunks), 0);
  int now = 0, peak = 0;
  for (const PipeAction& a : actions) {
    if (!all_chunks && a.chunk != chunk) continue;
    char& is_open = open[std::size_t(a.micro) * std::size_t(chunks) + std::size_t(a.chunk)];
    if (a.forward() && !is_open) {
      is_open = 1;
      peak = std::max(peak, ++now);
    } else if (a.pass == last && is_open) {
      is_open = 0;
      --now;
    }
  }
  return peak;
}

// Finish times of every forward and backward, indexed by (global chunk, micro); negative: not run.
class Timeline {
 public:
  Timeline(int chunks, int micro_batches)
      : chunks_(chunks),
        micro_batches_(micro_batches),
        forward_(static_cast<std::size_t>(chunks) * micro_batches, -1.0),
        backward_(forward_.size(), -1.0) {}

  // The time when all dependencies of the action on global chunk k are done; negative if one is
  // not done yet.
  double ready_time(const PipeAction& a, int k) const {
    if (a.forward()) return k == 0 ? 0.0 : forward_[slot(k - 1, a.micro)];
    if (a.pass == PipePass::weight) return backward_[slot(k, a.micro)];
    const double own_forward = forward_[slot(k, a.micro)];
    if (k == chunks_ - 1 || own_forward < 0) return own_forward;
    const double next_backward = backward_[slot(k + 1, a.micro)];
    return next_backward < 0 ? next_backward : std::max(own_forward, next_backward);
  }

  void finish(const PipeAction& a, int k, double time) {
    if (a.pass != PipePass::weight) (a.forward() ? forward_ : backward_)[slot(k, a.micro)] = time;
  }

 private:
  std::size_t slot(int k, int micro) const {
    return static_cast<std::size_t>(k) * micro_batches_ + micro;
  }

  int chunks_, micro_batches_;
  std::vector<double> forward_, backward_;
};

void check_actions(const std::vector<std::vector<PipeAction>>& rank_actions, int micro_batches,
                   int virtual_stages, const PassCosts& costs) {
  const std::string at = "pipeline simulation: ";
  if (costs.forward < 0 || costs.backward < 0 || costs.weight < 0 || costs.weight > costs.backward)
    fail(at + "costs must be >= 0, the weight part at most the backward");
  if (rank_actions.empty()) fail(at + "needs at least one rank");
  if (micro_batches < 1)
    fail(at + "micro_batches must be >= 1 (got " + std::to_string(micro_batches) + ")");
  if (virtual_stages < 1)
    fail(at + "virtual_stages must be >= 1 (got " + std::to_string(virtual_stages) + ")");
  for (const auto& actions : rank_actions)
    for (const PipeAction& a : actions)
      if (a.micro < 0 || a.micro >= micro_batches || a.chunk < 0 || a.chunk >= virtual_stages)
        fail(at + "action (micro " + std::to_string(a.micro) + ", chunk " +
             std::to_string(a.chunk) + ") out of range");
}

}  // namespace

const char* schedule_name(PipeSchedule schedule) {
  switch (schedule) {
    case PipeSchedule::gpipe:
      return "gpipe";
    case PipeSchedule::one_f_one_b:
      return "1f1b";
    case PipeSchedule::interleaved:
      return "interleaved";
    case PipeSchedule::zb_h1:
      return "zb-h1";
    case PipeSchedule::zb_v:
      return "zb-v";
  }
  return "unknown";
}

bool splits_backward(PipeSchedule schedule) {
  return schedule == PipeSchedule::zb_h1 || schedule == PipeSchedule::zb_v;
}

ChunkPlacement chunk_placement(PipeSchedule schedule) {
  return schedule == PipeSchedule::zb_v ? ChunkPlacement::v_shape : ChunkPlacement::loop;
}

std::vector<PipeAction> pipeline_schedule(PipeSchedule schedule, int stages, int stage,
                                          int micro_batches, int virtual_stages) {
  check_shape(schedule, stages, micro_batches, virtual_stages);
  check_stage(prefix(schedule), stages, stage);
  switch (schedule) {
    case PipeSchedule::gpipe:
      return gpipe(micro_batches);
    case PipeSchedule::one_f_one_b:
      return one_f_one_b(stages, stage, micro_batches);
    case PipeSchedule::interleaved:
      return interleaved(stages, stage, micro_batches, virtual_stages);
    case PipeSchedule::zb_h1:
      return zb_h1(stages, stage, micro_batches);
    case PipeSchedule::zb_v:
      return zb_v(stages, stage, micro_batches);
  }
  fail("pipeline schedule: unknown schedule");
}

int global_chunk(ChunkPlacement placement, int stages, int stage, int chunk) {
  if (stages < 1) fail("global_chunk: stages must be >= 1 (got " + std::to_string(stages) + ")");
  check_stage("global_chunk: ", stages, stage);
  if (chunk < 0 || (placement == ChunkPlacement::v_shape && chunk > 1))
    fail("global_chunk: chunk must be >= 0 (0 or 1 in a V; got " + std::to_string(chunk) + ")");
  if (placement == ChunkPlacement::v_shape) return chunk == 0 ? stage : 2 * stages - 1 - stage;
  return chunk * stages + stage;
}

int chunk_stage(ChunkPlacement placement, int stages, int k) {
  if (stages < 1) fail("chunk_stage: stages must be >= 1 (got " + std::to_string(stages) + ")");
  if (k < 0 || (placement == ChunkPlacement::v_shape && k >= 2 * stages))
    fail("chunk_stage: chunk must be >= 0 (below 2 stages in a V; got " + std::to_string(k) + ")");
  if (placement == ChunkPlacement::v_shape) return k < stages ? k : 2 * stages - 1 - k;
  return k % stages;
}

int max_in_flight(const std::vector<PipeAction>& actions) {
  return max_in_flight_where(actions, 0, true);
}

int max_in_flight(const std::vector<PipeAction>& actions, int chunk) {
  return max_in_flight_where(actions, chunk, false);
}

PipeSimulation simulate_actions(const std::vector<std::vector<PipeAction>>& rank_actions,
                                int micro_batches, int virtual_stages, PassCosts costs,
                                ChunkPlacement placement) {
  check_actions(rank_actions, micro_batches, virtual_stages, costs);
  const bool split = std::any_of(rank_actions.begin(), rank_actions.end(), has_weight_passes);
  const double pass_cost[] = {costs.forward, split ? costs.backward - costs.weight : costs.backward,
                              costs.weight};
  const int stages = static_cast<int>(rank_actions.size());
  Timeline timeline(stages * virtual_stages, micro_batches);
  std::vector<std::size_t> next(stages, 0);
  std::vector<double> clock(stages, 0.0);
  PipeSimulation sim;
  sim.busy.assign(stages, 0.0);
  // An action starts when its rank is free and its dependencies are done, so its time depends only
  // on those; relaxing ranks in any order until none can progress gives the times an event queue
  // would, and a rank left with actions is deadlocked.
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < rank_actions[s].size()) {
        const PipeAction& a = rank_actions[s][next[s]];
        const int k = global_chunk(placement, stages, s, a.chunk);
        const double ready = timeline.ready_time(a, k);
        if (ready < 0) break;
        const double cost = pass_cost[int(a.pass)] / virtual_stages;
        clock[s] = std::max(clock[s], ready) + cost;
        sim.busy[s] += cost;
        timeline.finish(a, k, clock[s]);
        ++next[s];
        progressed = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s) sim.deadlock = sim.deadlock || next[s] < rank_actions[s].size();
  sim.makespan = *std::max_element(clock.begin(), clock.end());
  for (int s = 0; s < stages; ++s) sim.idle.push_back(sim.makespan - sim.busy[s]);
  return sim;
}

PipeSimulation simulate_pipeline(PipeSchedule schedule, int stages, int micro_batches,
                                 int virtual_stages, PassCosts costs) {
  check_shape(schedule, stages, micro_batches, virtual_stages);
  std::vector<std::vector<PipeAction>> rank_actions;
  for (int s = 0; s < stages; ++s)
    rank_actions.push_back(pipeline_schedule(schedule, stages, s, micro_batches, virtual_stages));
  return simulate_actions(rank_actions, micro_batches, virtual_stages, costs,
                          chunk_placement(schedule));
}

double predicted_bubble_fraction(PipeSchedule schedule, int stages, int micro_batches,
                                 int virtual_stages) {
  check_shape(schedule, stages, micro_batches, virtual_stages);
  // Ramp-up plus ramp-down of the ideal pipeline lasts (p - 1) chunk slots of f + b; a chunk slot
  // is 1 / v of a full stage, and the step's useful work is v * m chunk slots. zb-h1's bubble is
  // (p - 1) (f + b - w) = (p - 1) passes of one third of a slot.
  const double p = stages, work = double(virtual_stages) * micro_batches;
  if (schedule == PipeSchedule::zb_h1) return (p - 1) / (3 * work + p - 1);
  if (schedule == PipeSchedule::zb_v)
    return simulate_pipeline(schedule, stages, micro_batches, virtual_stages, {1.0, 2.0, 1.0})
        .bubble_fraction();
  return (p - 1) / (work + p - 1);
}

}  // namespace strata::pp
