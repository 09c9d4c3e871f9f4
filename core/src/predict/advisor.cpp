// advise, format_advice (advisor.hpp).
#include "predict/advisor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "runner/plugin_loader.hpp"
#include "strata/mesh.hpp"
#include "util/format.hpp"

namespace strata {
namespace {

struct Variant {
  std::string label;  // "dp=zero1", "dp=zero1 attention=ring", "" for the defaults
  Options options;
  std::shared_ptr<Strategy> strategy;
  // Its twin at cp 1 (the label without the attention choice), and whether it differs from that
  // twin only with cp > 1 (a context-parallel attention).
  std::string twin;
  bool cp_only = false;
};

// The strategy with its defaults, and once per other choice of its `dp` option (what the dp
// axis of a model-parallel mesh does); each of those also with every other choice of its
// `attention` option (the context-parallel attention: cp's ring beside Ulysses). Other options
// keep their defaults.
std::vector<Variant> variants_of(const AdviseStrategy& s) {
  auto choices = [&](const std::string& name) {
    std::vector<std::string> kvs;
    for (const OptionSpec& o : s.spec->options)
      if (o.name == name && o.type == OptionType::choice)
        for (const std::string& c : o.choices)
          if (c != o.default_value) kvs.push_back(name + "=" + c);
    return kvs;
  };
  std::vector<Variant> out;
  auto add = [&](const std::vector<std::string>& kvs, const std::string& twin) {
    std::string label;
    for (const std::string& kv : kvs) label += (label.empty() ? "" : " ") + kv;
    const Options o = validate_options(*s.spec, kvs);
    out.push_back({label, o, s.create(o), twin, label != twin});
  };
  std::vector<std::vector<std::string>> dps = {{}};
  for (const std::string& kv : choices("dp")) dps.push_back({kv});
  for (const auto& dp : dps) {
    const std::string twin = dp.empty() ? "" : dp.front();
    add(dp, twin);
    for (const std::string& attention : choices("attention")) {
      std::vector<std::string> kvs = dp;
      kvs.push_back(attention);
      add(kvs, twin);
    }
  }
  return out;
}

// Whether the one validation (validate_strategy) accepts `s` on a probe mesh and model.
bool accepts(const std::string& name, const Strategy& s, const MeshSpec& mesh,
             const ModelSpec& model, int global_batch) {
  TrainSpec t;
  t.micro_batch = 1, t.global_batch = global_batch;
  try {
    validate_strategy(name, s, mesh, t, model);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// A small dense model every axis splits: 8 layers, 8 heads, hidden 64, seq 64, vocabulary 256.
ModelSpec dense_probe() {
  ModelSpec probe;
  probe.layers = 8, probe.hidden = 64, probe.heads = 8, probe.seq = 64, probe.vocab = 256;
  return probe;
}

// Whether a strategy takes a tp (pp) axis at all: on a small model that every axis divides. A
// strategy that refuses both is data-parallel only.
bool takes_axis(const std::string& name, const Strategy& s, int tp, int pp) {
  return accepts(name, s, MeshSpec{1, tp, pp, 1, tp * pp}, dense_probe(), 8 * pp);
}

// Whether a strategy splits a mixture of experts over an ep axis: on a small moe at dp = ep = 2,
// without a pipeline or with one of 2 stages.
bool takes_ep(const std::string& name, const Strategy& s) {
  ModelSpec moe = model_preset("tiny-moe");
  moe.layers = 8;  // interleaved's 2 x 2 chunks
  for (const int pp : {1, 2}) {
    MeshSpec mesh{2, 1, pp, 1, 2 * pp};
    mesh.ep = 2;
    if (accepts(name, s, mesh, moe, 2 * pp)) return true;
  }
  return false;
}

// Whether a strategy splits sequences over a cp axis: on a small dense model at cp = 2, without a
// pipeline or with one of 2 stages.
bool takes_cp(const std::string& name, const Strategy& s) {
  for (const int pp : {1, 2}) {
    MeshSpec mesh{1, 1, pp, 1, 2 * pp};
    mesh.cp = 2;
    if (accepts(name, s, mesh, dense_probe(), 2 * pp)) return true;
  }
  return false;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// A candidate's plans, each rank's made once: the checks below ask for overlapping ranks (rank 0
// of validation, the four corners of device_memory, the pp group of the step time; at pp = 1 the
// corners are two ranks). Plans are large (a pipeline's whole schedule), and --advise makes them
// for thousands of candidates.
class CandidatePlans {
 public:
  CandidatePlans(const Strategy& s, const MeshSpec& mesh, const ModelSpec& model,
                 const TrainSpec& train)
      : strategy_(s), in_{mesh, model, train, 0} {}
  const PredictInput& input(int rank) {
    in_.rank = rank;
    return in_;
  }
  const StepPlan& at(int rank) {
    auto it = plans_.find(rank);
    if (it == plans_.end()) it = plans_.emplace(rank, strategy_.plan_step(input(rank))).first;
    return it->second;
  }
  StepPlan take(int rank) {  // the last question asked of it
    at(rank);
    return std::move(plans_.at(rank));
  }

 private:
  const Strategy& strategy_;
  PredictInput in_;
  std::map<int, StepPlan> plans_;
};

// The largest rank's device memory: the first and last pipeline stage (the first holds the most
// blocks, the embedding and the most micro-batches in flight; the last the head), each at both
// ends of dp and tp (the last dp shard and the last vocabulary rows may be padded).
double device_memory(const MeshSpec& mesh, CandidatePlans& plans) {
  const Mesh m(mesh);
  double worst = 0;
  for (int pp : {0, mesh.pp - 1})
    for (const auto& [dp, tp] : {std::pair{0, 0}, std::pair{mesh.dp - 1, mesh.tp - 1}}) {
      const int rank = m.rank_of(dp, tp, pp, 0);
      const Prediction p = predict(plans.at(rank), plans.input(rank));
      double total = 0;
      for (int t = 0; t < kNumMemTags; ++t)
        if (!is_host_tag(MemTag(t))) total += p.memory_bytes[t];
      worst = std::max(worst, total);
    }
  return worst;
}

// One configuration through the checks, in order, then into `out`; true when it is ranked.
bool check(const MachineProfile& profile, const AdviseRequest& r, const Variant& v, Candidate c,
           Advice& out) {
  auto exclude = [&](Exclusion why, std::string detail) {  // a copy: it may be c.time.why
    out.excluded.push_back({std::move(c), why, std::move(detail)});
    return false;
  };
  const int per_step = c.micro_batch * c.mesh.dp;
  c.global_batch = r.global_batch ? r.global_batch : per_step;
  if (c.global_batch % per_step != 0)
    return exclude(Exclusion::divisibility,
                   "--global-batch " + std::to_string(c.global_batch) +
                       " is not a multiple of micro-batch x dp = " + std::to_string(per_step));
  TrainSpec train = r.train;
  train.micro_batch = c.micro_batch, train.global_batch = c.global_batch;
  train.recompute = c.recompute;
  CandidatePlans plans(*v.strategy, c.mesh, r.model, train);
  try {
    validate_strategy(c.strategy, *v.strategy, c.mesh, train, r.model,
                      [&]() -> const StepPlan& { return plans.at(0); });
  } catch (const std::exception& e) {
    return exclude(Exclusion::divisibility, one_line(e.what()));
  }
  c.memory_bytes = device_memory(c.mesh, plans);
  if (c.memory_bytes > r.memory_limit) return exclude(Exclusion::memory, "");
  StepQuery q{c.strategy, c.mesh, r.model, train, r.threads, 0, {}};
  for (const int rank : step_query_ranks(c.mesh)) q.plans.push_back(plans.take(rank));
  c.time = predict_step_time(profile, q);
  if (!c.time.modelled) return exclude(Exclusion::no_time_model, c.time.why);
  out.ranked.push_back(std::move(c));
  return true;
}

// The shortest slice of a sequence the advisor gives a cp rank: the predictor scales the profile's
// passes by 1 / cp, a per-token rate measured on whole sequences, which thinner GEMMs do not keep.
constexpr int kMinCpSlice = 1024;

// The twins of a configuration across cp: (variant, ep, micro-batch, recompute).
using Twin = std::tuple<std::string, int, int, int>;

// Every configuration of one strategy on `mesh` (its tp, pp and cp): each ep (a strategy that
// splits experts at each ep >= 2 dividing dp, for a moe; ep 1 as well unless ep is its only axis,
// where ep 1 is its dp mode), variant (an attention choice at cp > 1 only), micro-batch and
// recompute mode. At cp 1 the twins that fit are put in `fit`; at cp > 1 those are skipped.
void try_mesh(const MachineProfile& profile, const AdviseRequest& r, const std::string& name,
              const std::vector<Variant>& variants, bool ep_only, bool ep_axis, MeshSpec mesh,
              std::set<Twin>& fit, Advice& out) {
  std::vector<int> eps;
  if (!ep_only) eps.push_back(1);
  if (ep_axis && r.model.arch == Arch::moe)
    for (const int ep : divisors(mesh.dp))
      if (ep > 1) eps.push_back(ep);
  for (const int ep : eps)
    for (const Variant& v : variants) {
      if (!v.twin.empty() && mesh.replicas() == 1) continue;  // dp's choices change nothing
      if (v.cp_only && mesh.cp == 1) continue;  // the attention choice: its twin there
      mesh.ep = ep;
      for (const int mb : r.micro_batches)
        for (const Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
          const Twin twin{v.twin, ep, mb, int(rc)};
          if (mesh.cp > 1 && fit.count(twin)) continue;
          if (check(profile, r, v, {name, v.options, v.label, mesh, mb, 0, rc, 0, {}}, out) &&
              mesh.cp == 1)
            fit.insert(twin);
        }
    }
}

}  // namespace

std::string Candidate::label() const {
  std::ostringstream s;
  s << strategy << (variant.empty() ? "" : " " + variant) << " dp" << mesh.dp << " tp" << mesh.tp
    << " pp" << mesh.pp;
  if (mesh.ep > 1) s << " ep" << mesh.ep;
  if (mesh.cp > 1) s << " cp" << mesh.cp;
  s << " mb" << micro_batch << " " << recompute_name(recompute);
  return s.str();
}

Advice advise(const MachineProfile& profile, const AdviseRequest& r,
              const std::vector<AdviseStrategy>& strategies) {
  Advice out;
  const int world = r.nodes * r.ranks_per_node;
  for (const AdviseStrategy& s : strategies) {
    const std::vector<Variant> variants = variants_of(s);
    const Strategy& probe = *variants.front().strategy;  // interleaved needs pp >= 2 for tp
    const bool tp_axis = takes_axis(s.name, probe, 2, 1) || takes_axis(s.name, probe, 2, 2);
    const bool pp_axis = takes_axis(s.name, probe, 1, 2) || takes_axis(s.name, probe, 2, 2);
    const bool ep_axis = takes_ep(s.name, probe);
    const bool cp_axis = takes_cp(s.name, probe);
    out.notes.push_back(s.name + ": " +
                        (tp_axis && pp_axis ? "dp x tp x pp (pp >= 2)"
                         : tp_axis          ? "dp x tp (tp >= 2)"
                         : pp_axis          ? "dp x pp (pp >= 2)"
                         : ep_axis          ? "dp with ep dividing it (ep >= 2; a moe only)"
                                            : "dp only") +
                        (cp_axis ? ", x cp" : "") +
                        (ep_axis && (tp_axis || pp_axis) ? ", ep dividing dp (a moe only)" : ""));
    for (const int tp : tp_axis ? divisors(r.ranks_per_node) : std::vector<int>{1})
      for (const int pp : pp_axis ? divisors(world / tp) : std::vector<int>{1}) {
        // cp inside a node beside tp (Ulysses' all-to-alls each block, as DeepSpeed runs them on
        // the node's links), on whole heads, each rank's slice at least kMinCpSlice tokens; a
        // cp > 1 only where its cp = 1 twin does not fit: cp splits activations, and where they
        // fit dp splits the same compute for less traffic.
        std::set<Twin> fit;
        for (const int cp : cp_axis ? divisors(r.ranks_per_node / tp) : std::vector<int>{1}) {
          // Without its own axis a model-parallel strategy is its dp mode, enumerated as such.
          if (world % (tp * pp * cp) != 0 || (pp_axis && pp == 1) ||
              (tp_axis && !pp_axis && tp == 1 && cp == 1) ||
              (cp > 1 && (r.model.heads % (tp * cp) != 0 || r.model.seq / cp < kMinCpSlice)))
            continue;
          MeshSpec mesh{world / (tp * pp * cp), tp, pp, r.nodes, r.ranks_per_node};
          mesh.cp = cp;
          try_mesh(profile, r, s.name, variants, ep_axis && !tp_axis && !pp_axis, ep_axis, mesh,
                   fit, out);
        }
      }
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [](const auto& a, const auto& b) {
    if (a.time.tokens_per_s != b.time.tokens_per_s)
      return a.time.tokens_per_s > b.time.tokens_per_s;
    return a.memory_bytes < b.memory_bytes;  // as fast: the one leaving more memory free
  });
  return out;
}

namespace {

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(1ull << 30));
  return b;
}

void print_ranked(std::ostringstream& o, const Advice& a, int top) {
  char line[512];
  std::snprintf(line, sizeof line, "%4s  %-40s %10s %12s %6s %10s %10s %8s\n", "rank",
                "configuration", "step", "tokens/s", "MFU", "memory", "exp. comm", "bubble");
  o << line;
  for (int i = 0; i < std::min<int>(top, int(a.ranked.size())); ++i) {
    const Candidate& c = a.ranked[std::size_t(i)];
    const StepTime& t = c.time;
    char step[32];  // ms below a second
    std::snprintf(step, sizeof step, t.step_s < 1 ? "%.2f ms" : "%.3f s",
                  t.step_s < 1 ? 1e3 * t.step_s : t.step_s);
    std::snprintf(line, sizeof line, "%4d  %-40s %10s %12.0f %5.1f%% %10s %8.1f %% %6.1f %%\n",
                  i + 1, c.label().c_str(), step, t.tokens_per_s, t.mfu >= 0 ? 100 * t.mfu : 0,
                  human_bytes(c.memory_bytes).c_str(), 100 * t.exposed_comm_s / t.step_s,
                  100 * t.bubble_s / t.step_s);
    o << line;
  }
}

// `text` with each run of digits as one "N": the reasons that differ only in their numbers.
// (std::regex_replace did this at 11% of a 4,096-device search, far more under ASan.)
std::string digits_as_n(const std::string& text) {
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (!is_digit(text[i]))
      out += text[i];
    else if (i == 0 || !is_digit(text[i - 1]))
      out += 'N';
  }
  return out;
}

// Divisibility and "no time model" exclusions grouped by their message with the numbers taken
// out; one example each with the numbers in.
void print_grouped(std::ostringstream& o, const Advice& a, Exclusion why, const char* title) {
  std::map<std::string, std::pair<int, const Excluded*>> groups;
  int n = 0;
  for (const Excluded& e : a.excluded)
    if (e.why == why) {
      auto& g = groups[digits_as_n(e.detail)];
      if (!g.second) g.second = &e;
      ++g.first, ++n;
    }
  if (n == 0) return;
  o << "excluded, " << title << ": " << n << "\n";
  for (const auto& [key, g] : groups)
    o << "  " << g.first << " x " << g.second->detail << "  (e.g. " << g.second->candidate.label()
      << ")\n";
}

}  // namespace

std::string format_advice(const Advice& a, const AdviseRequest& r, int top) {
  std::ostringstream o;
  const int world = r.nodes * r.ranks_per_node;
  o << "advise: " << r.model.preset << " (" << params_text(r.model) << ") on " << world
    << " devices (" << r.nodes << " node(s) x " << r.ranks_per_node << "), memory limit "
    << gib(r.memory_limit) << " per device, global batch "
    << (r.global_batch ? std::to_string(r.global_batch) : std::string("micro-batch x dp")) << "\n";
  o << "strategies: ";
  for (std::size_t i = 0; i < a.notes.size(); ++i) o << (i ? "; " : "") << a.notes[i];
  o << "\n"
    << a.ranked.size() + a.excluded.size() << " configurations: " << a.ranked.size()
    << " fit and are ranked by predicted tokens/s, " << a.excluded.size() << " excluded\n";
  if (a.ranked.empty())
    o << "no configuration fits\n";
  else
    print_ranked(o, a, top);
  std::vector<const Excluded*> memory;
  for (const Excluded& e : a.excluded)
    if (e.why == Exclusion::memory) memory.push_back(&e);
  std::sort(memory.begin(), memory.end(), [](const Excluded* x, const Excluded* y) {
    return x->candidate.memory_bytes < y->candidate.memory_bytes;
  });
  if (!memory.empty()) {
    o << "excluded, memory: " << memory.size() << " need more than " << gib(r.memory_limit)
      << "; the closest:\n";
    for (std::size_t i = 0; i < std::min<std::size_t>(3, memory.size()); ++i)
      o << "  " << memory[i]->candidate.label() << " needs "
        << gib(memory[i]->candidate.memory_bytes) << " ("
        << human_bytes(memory[i]->candidate.memory_bytes - r.memory_limit) << " over)\n";
    o << "  the largest: " << memory.back()->candidate.label() << " needs "
      << gib(memory.back()->candidate.memory_bytes) << "\n";
  }
  print_grouped(o, a, Exclusion::divisibility, "divisibility");
  print_grouped(o, a, Exclusion::no_time_model, "no time model");
  if (!a.ranked.empty() && !a.ranked.front().time.notes.empty())
    o << "assumptions (rank 1): " << a.ranked.front().time.notes << "\n";
  return o.str();
}

}  // namespace strata
