// The replay of strategies' step plans (strata/step_plan.hpp) with calibrated durations, one
// compute clock per rank: rank 0's pp group, one plan per stage (ranks that differ only in dp or
// tp run the same plan, so their collectives are costs of the rank's own group). Receives pair
// the stages: a recv waits for its send's issue plus the transfer. With equal chunks and free
// transfers this gives GPipe's and 1F1B's bubble (p-1)/(m+p-1).
#include <cstdint>
#include <map>
#include <memory_resource>
#include <tuple>
#include <unordered_map>

#include "predict/costs.hpp"

namespace strata::time_model {
namespace {

struct RankReplay {
  const StepPlan* plan = nullptr;
  int rank = 0;
  std::size_t next = 0, repeated = 0, total = 0;  // repeated: the micro-batch actions, unrolled
  double clock = 0;
  double busy = 0;         // the compute thread working: passes, updates, new buffers
  double tp_inside = 0;    // the tp all-reduces inside those passes
  double blocking = 0;     // comm on the compute thread
  double on_streams = 0;   // comm and copies on streams
  double stream_wait = 0;  // the compute thread waiting for streams
  double recv_wait = 0;    // the compute thread waiting for a stage's send
  double sends = 0;
  std::map<int, double> streams, events;

  const PlanAction& action(std::size_t i) const {
    return i < repeated ? plan->micro_batch[i % plan->micro_batch.size()]
                        : plan->step[i - repeated];
  }
  void compute(double d) { clock += d, busy += d; }
  void wait_until(double t, double& counter) {
    if (t > clock) counter += t - clock, clock = t;
  }
  void issue(const PlanAction& a, double d) {
    double& s = streams[a.stream];
    s = std::max(s, clock) + d, on_streams += d;
    if (a.event >= 0) events[a.event] = s;
  }
};

using SendKey = std::tuple<int, int, int>;  // from, to, tag
struct SendKeyHash {
  std::size_t operator()(const SendKey& k) const {
    const auto [from, to, tag] = k;
    std::uint64_t h = std::uint32_t(from);
    h = h * 0x9E3779B97F4A7C15ull ^ std::uint32_t(to);
    h = h * 0x9E3779B97F4A7C15ull ^ std::uint32_t(tag);
    return std::size_t(h ^ (h >> 29));
  }
};
// The sends not yet received, hashed (found and erased once each: the ordered map's rebalancing
// was a tenth of the advisor's time). Their nodes come from a pool: a node from the heap per send
// was a quarter of the advisor's allocations.
using Sent = std::pmr::unordered_map<SendKey, double, SendKeyHash>;

// A unit pass: its forward, its backward (a split plan's input pass) or a split plan's weight
// pass (no collective inside).
double pass_time(const Costs& c, const PlanAction& a, RankReplay& r) {
  const bool fwd = a.op == PlanOp::forward;
  const std::vector<double>& pass = fwd ? c.fwd : c.bwd;
  if (a.unit < 0 || std::size_t(a.unit) >= pass.size())
    throw NoTimeModel{"the step plan names unit " + std::to_string(a.unit) + " of a model with " +
                      std::to_string(pass.size()) + " units"};
  const std::size_t u = std::size_t(a.unit);
  if (a.op == PlanOp::weight) return c.wgt[u];
  const std::vector<double>& tp = fwd ? c.tp_fwd : c.tp_bwd;
  if (!tp.empty()) r.tp_inside += tp[u];
  return !fwd && r.plan->split_backward ? c.inp[u] : pass[u];
}

// Rank r's next action; false when it must wait for a send not replayed yet.
bool advance(Costs& c, RankReplay& r, Sent& sent) {
  const PlanAction& a = r.action(r.next);
  switch (a.op) {
    case PlanOp::forward:
    case PlanOp::backward:
    case PlanOp::weight:
      r.compute(pass_time(c, a, r));
      break;
    case PlanOp::update:
      r.compute(c.opt_per_param * a.count);
      break;
    case PlanOp::fresh:
      r.compute(c.fresh_per_byte * a.bytes);
      break;
    case PlanOp::comm: {
      const double d = c.comm(a.collective, a.bytes, a.axis);
      if (a.stream < 0)
        r.clock += d, r.blocking += d;
      else
        r.issue(a, d);
      break;
    }
    case PlanOp::copy:
      if (c.copy_per_byte <= 0)
        throw NoTimeModel{"the profile has no copy rate (runner --calibrate measures it)"};
      r.issue(a, c.copy_per_byte * a.bytes);
      break;
    case PlanOp::wait: {
      double t = r.clock;
      if (a.event < 0) {
        for (const auto& [id, end] : r.streams) t = std::max(t, end);
      } else {
        const auto it = r.events.find(a.event);
        if (it == r.events.end())
          throw NoTimeModel{"the step plan waits for event " + std::to_string(a.event) +
                            ", which nothing before it sets"};
        t = it->second;
      }
      r.wait_until(t, r.stream_wait);
      break;
    }
    case PlanOp::send: {
      const double d = c.comm(CommOp::send, a.bytes, a.axis);
      sent[{r.rank, a.peer, a.tag}] = r.clock + d, r.sends += d;
      break;
    }
    case PlanOp::recv: {
      const auto it = sent.find({a.peer, r.rank, a.tag});
      if (it == sent.end()) return false;
      r.wait_until(it->second, r.recv_wait);
      sent.erase(it);
      break;
    }
    case PlanOp::alloc:
    case PlanOp::free:
      break;  // memory, no time (plan_memory)
  }
  ++r.next;
  return true;
}

}  // namespace

StepTime replay_plans(Costs& c, const std::vector<StepPlan>& plans, const std::vector<int>& ranks) {
  if (plans.size() != ranks.size())
    throw NoTimeModel{std::to_string(plans.size()) + " step plan(s) for " +
                      std::to_string(ranks.size()) + " pipeline stage(s)"};
  std::vector<RankReplay> rs(plans.size());
  for (std::size_t i = 0; i < plans.size(); ++i) {
    rs[i].plan = &plans[i], rs[i].rank = ranks[i];
    rs[i].repeated = plans[i].micro_batch.size() * std::size_t(std::max(0, plans[i].micro_batches));
    rs[i].total = rs[i].repeated + plans[i].step.size();
  }
  std::pmr::unsynchronized_pool_resource pool;
  Sent sent(&pool);
  for (bool progress = true; progress;) {
    progress = false;
    for (RankReplay& r : rs)
      while (r.next < r.total && advance(c, r, sent)) progress = true;
  }
  StepTime t;
  std::vector<double> end(rs.size());
  for (std::size_t i = 0; i < rs.size(); ++i) {
    RankReplay& r = rs[i];
    if (r.next < r.total)
      throw NoTimeModel{"the step plans deadlock: rank " + std::to_string(r.rank) +
                        " waits for a send that never comes"};
    for (const auto& [id, stream_end] : r.streams) r.wait_until(stream_end, r.stream_wait);
    // Comm the compute hid (its stream time less the compute thread's waits for it) still slows
    // the compute on CPU ranks (Costs::contention).
    const double slowed = c.slowed_by(r.on_streams - r.stream_wait);
    end[i] = r.clock + slowed;
    t.step_s = std::max(t.step_s, end[i]);
    t.compute_s = std::max(t.compute_s, r.busy - r.tp_inside + slowed);
    t.comm_s = std::max(t.comm_s, r.blocking + r.on_streams + r.sends + r.tp_inside);
    t.exposed_comm_s = std::max(t.exposed_comm_s, r.blocking + r.tp_inside + r.stream_wait);
  }
  // The stages' mean idle time: waiting for their inputs, then for the last stage to finish.
  if (rs.size() > 1)
    for (std::size_t i = 0; i < rs.size(); ++i)
      t.bubble_s += (rs[i].recv_wait + t.step_s - end[i]) / double(rs.size());
  return t;
}

}  // namespace strata::time_model
