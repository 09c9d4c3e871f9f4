// Machine profiles (profile.hpp): fits, lookups, merging. The HDF5 file is profile_file.cpp.
#include "predict/profile.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "predict/gemm_model.hpp"
#include "run/summary.hpp"
#include "strata/comm.hpp"

namespace strata {
namespace {

CommOp parse_op(const std::string& op) {
  for (int i = 0; i < kNumCommOps; ++i)
    if (op == kCommOpNames[i]) return static_cast<CommOp>(i);
  throw Error("unknown comm op '" + op + "' in a profile");
}

auto shape_key(const ModelSpec& m) {
  return std::make_tuple(m.layers, m.hidden, m.heads, m.seq, m.vocab, m.arch, m.kv_head_count(),
                         m.ffn_hidden(), m.expert_count(), m.top_k, m.shared_experts,
                         m.capacity_factor);
}

// The samples of one shape by size, without those slower than a larger size of the same op (a
// rank descheduled during the measurement: time only grows with bytes).
std::vector<CommSample> monotone(std::vector<CommSample> points) {
  std::sort(points.begin(), points.end(),
            [](const CommSample& a, const CommSample& b) { return a.bytes < b.bytes; });
  std::vector<CommSample> kept;
  double faster_above = std::numeric_limits<double>::infinity();
  for (auto it = points.rbegin(); it != points.rend(); ++it) {
    // One point per size (two groups of one shape measured alike): the faster.
    if (!kept.empty() && kept.front().bytes == it->bytes) {
      kept.front().time_s = std::min(kept.front().time_s, it->time_s);
      faster_above = kept.front().time_s;
    } else if (it->time_s <= faster_above) {
      kept.insert(kept.begin(), *it), faster_above = it->time_s;
    }
  }
  return kept;
}

// Piecewise-linear in bytes through the samples of one shape (the end segments extended): the
// measured points themselves where an alpha-beta line cannot follow them all (caches, protocols
// switching with the size). Negative with fewer than two sizes.
double interpolate(const std::vector<CommSample>& points, double bytes) {
  if (points.size() < 2) return -1;
  std::size_t i = 1;
  while (i + 1 < points.size() && points[i].bytes < bytes) ++i;
  const CommSample &a = points[i - 1], &b = points[i];
  const double t = a.time_s + (bytes - a.bytes) * (b.time_s - a.time_s) / (b.bytes - a.bytes);
  return std::max(t, bytes < a.bytes ? 0.0 : a.time_s);
}

}  // namespace

bool same_configuration(const ComputeEntry& a, const ComputeEntry& b) {
  return shape_key(a.model) == shape_key(b.model) && a.micro_batch == b.micro_batch &&
         a.device == b.device && a.precision == b.precision && a.threads == b.threads &&
         a.ranks_per_node == b.ranks_per_node && a.tp == b.tp;
}

std::array<double*, 13> timed_fields(ComputeEntry& e) {
  return {&e.embedding_forward_s,    &e.embedding_backward_s,
          &e.block_forward_s,        &e.block_backward_s,
          &e.head_forward_s,         &e.head_backward_s,
          &e.block_recompute_full_s, &e.block_recompute_selective_s,
          &e.block_input_backward_s, &e.block_weight_backward_s,
          &e.optimizer_s_per_param,  &e.fresh_memory_s_per_byte,
          &e.copy_s_per_byte};
}

double pass_seconds(const ComputeEntry& e) {
  return e.embedding_forward_s + e.embedding_backward_s +
         e.model.layers * (e.block_forward_s + e.block_backward_s) + e.head_forward_s +
         e.head_backward_s;
}

ComputeEntry median_entry(const std::vector<ComputeEntry>& entries) {
  ComputeEntry m = entries.front();
  const auto out = timed_fields(m);
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::vector<double> values;
    for (ComputeEntry e : entries) values.push_back(*timed_fields(e)[i]);
    *out[i] = percentile(values, 0.5);
  }
  return m;
}

void split_passes_by_flops(ComputeEntry& e, const ModelSpec& model, double forward_s,
                           double backward_s) {
  const UnitFlops f(model);
  const double total = f.embedding + model.layers * f.block + f.head;
  const double F = forward_s / total, B = backward_s / total;
  e.embedding_forward_s = F * f.embedding, e.embedding_backward_s = B * f.embedding;
  e.block_forward_s = F * f.block, e.block_backward_s = B * f.block;
  e.head_forward_s = F * f.head, e.head_backward_s = B * f.head;
}

void keep_split_shares(ComputeEntry& e, double old_block_backward_s) {
  if (old_block_backward_s <= 0) return;
  for (double* t : {&e.block_input_backward_s, &e.block_weight_backward_s})
    *t *= e.block_backward_s / old_block_backward_s;
}

CommFit fit_alpha_beta(const std::vector<CommSample>& all_points) {
  if (all_points.empty()) throw Error("alpha-beta fit: no points");
  const std::vector<CommSample> points = monotone(all_points);
  CommFit f;
  f.op = points.front().op;
  f.ranks = points.front().ranks;
  f.ranks_per_node = points.front().ranks_per_node;
  f.host_ranks = points.front().host_ranks;
  f.points = int(points.size());
  // Weighted by 1 / time^2: relative errors count, so the small sizes (latency) weigh as much as
  // the large ones (bandwidth) instead of being lost in the large ones' absolute residuals.
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const CommSample& p : points) {
    const double w = p.time_s > 0 ? 1.0 / (p.time_s * p.time_s) : 0.0;
    n += w, sx += w * p.bytes, sy += w * p.time_s;
    sxx += w * p.bytes * p.bytes, sxy += w * p.bytes * p.time_s;
  }
  const double det = n * sxx - sx * sx;
  double slope = det > 0 ? (n * sxy - sx * sy) / det : 0;
  double alpha = det > 0 ? (sy - slope * sx) / n : 0;
  if (det <= 0 || alpha < 0 || slope <= 0) {  // one size, or a negative latency: through 0
    alpha = 0;
    slope = sxx > 0 ? sxy / sxx : 0;
  }
  f.alpha_s = alpha;
  f.beta_bytes_per_s = slope > 0 ? 1.0 / slope : 0;
  for (const CommSample& p : points)
    if (p.time_s > 0 && f.beta_bytes_per_s > 0)
      f.max_rel_error =
          std::max(f.max_rel_error, std::abs(f.time_s(p.bytes) - p.time_s) / p.time_s);
  return f;
}

void refit_comm(MachineProfile& profile) {
  std::map<std::tuple<std::string, int, int, int>, std::vector<CommSample>> by_shape;
  for (const CommSample& s : profile.samples)
    by_shape[{s.op, s.ranks, s.ranks_per_node, s.host_ranks}].push_back(s);
  std::erase_if(profile.comm, [&](const CommFit& f) {
    return by_shape.count({f.op, f.ranks, f.ranks_per_node, f.host_ranks}) > 0;
  });
  for (const auto& [key, points] : by_shape) {
    CommFit f = fit_alpha_beta(points);
    if (f.beta_bytes_per_s > 0) profile.comm.push_back(f);
  }
}

bool same_point(const CommSample& a, const CommSample& b) {
  return a.op == b.op && a.ranks == b.ranks && a.ranks_per_node == b.ranks_per_node &&
         a.host_ranks == b.host_ranks && a.bytes == b.bytes;
}

void merge_profile(MachineProfile& profile, const MachineProfile& more) {
  for (const ComputeEntry& e : more.compute) {
    std::erase_if(profile.compute,
                  [&](const ComputeEntry& old) { return same_configuration(old, e); });
    profile.compute.push_back(e);
  }
  for (const CommSample& s : more.samples) {
    std::erase_if(profile.samples, [&](const CommSample& old) { return same_point(old, s); });
    profile.samples.push_back(s);
  }
  for (const GemmSample& g : more.gemms) {
    std::erase_if(profile.gemms, [&](const GemmSample& old) { return same_gemm(old, g); });
    profile.gemms.push_back(g);
  }
  if (more.node_peak_flops > 0) profile.node_peak_flops = more.node_peak_flops;
  if (more.roofline.flops_per_s > 0) profile.roofline = more.roofline;
  if (!more.host.empty()) profile.host = more.host;
  if (!more.created_utc.empty()) profile.created_utc = more.created_utc;
  refit_comm(profile);
}

std::vector<CommSample> samples_from_run(const RunRecord& run) {
  std::map<std::string, std::string> config(run.config.begin(), run.config.end());
  auto number = [&](const std::string& key, int fallback) {
    auto it = config.find(key);
    return it == config.end() ? fallback : std::atoi(it->second.c_str());
  };
  const int nodes = number("nodes", 1), per_node = number("ranks_per_node", run.ranks);
  // The ranks on rank 0's host (virtual nodes: all of them); unknown without hostnames.
  const int host_ranks =
      run.hostnames.empty()
          ? 0
          : int(std::count(run.hostnames.begin(), run.hostnames.end(), run.hostnames.front()));
  std::vector<CommSample> out;
  for (const CalibrationPoint& c : run.calibration) {
    CommSample s{c.op, int(c.ranks), 0, c.bytes, c.time_s, host_ranks};
    // dp spans the world; the intra-node group is one node's; the inter-node one rank per node.
    // tp sits inside a node when it fits; pp stages one per node when there are nodes.
    if (c.group == "dp_intra_node")
      s.ranks_per_node = s.ranks;
    else if (c.group == "dp_inter_node")
      s.ranks_per_node = 1;
    else if (c.group == "pp")
      s.ranks_per_node = nodes > 1 ? std::max(1, s.ranks / nodes) : s.ranks;
    else
      s.ranks_per_node = std::min(s.ranks, per_node);
    if (s.time_s > 0) out.push_back(s);
  }
  return out;
}

namespace {

// A published profile's entry carried to another shape at the same achieved FLOP rate: every
// pass scaled by its FLOPs per token (tokens per micro-batch: model.seq).
void scale_to_shape(ComputeEntry& e, const ModelSpec& model) {
  const UnitFlops from(e.model), to(model);
  const double tokens = double(model.seq) / e.model.seq;
  const double emb = tokens * to.embedding / from.embedding, blk = tokens * to.block / from.block;
  const double att = tokens * to.attention / from.attention, head = tokens * to.head / from.head;
  e.embedding_forward_s *= emb, e.embedding_backward_s *= emb;
  e.block_forward_s *= blk, e.block_backward_s *= blk, e.block_recompute_full_s *= blk;
  e.block_input_backward_s *= blk, e.block_weight_backward_s *= blk;
  e.block_recompute_selective_s *= att;
  e.head_forward_s *= head, e.head_backward_s *= head;
  e.model = model;
}

}  // namespace

std::optional<ComputeEntry> find_compute(const MachineProfile& p, const ModelSpec& model,
                                         int micro_batch, const std::string& device,
                                         const std::string& precision, int threads,
                                         int ranks_per_node, std::string* how, int tp) {
  const ComputeEntry* best = nullptr;
  std::tuple<int, int, int, int, int> best_distance{};
  // Measured entries answer for their own shape, or for another one by their GEMM sweep; a
  // published profile's for any shape (its roofline). Among those, the nearest FLOPs per token.
  const bool published = p.source == "published";
  for (const ComputeEntry& e : p.compute) {
    const bool same = shape_key(e.model) == shape_key(model);
    if (e.device != device || e.precision != precision) continue;
    if (!same && !published && !(e.tp == 1 && !sweep_of(p, e).empty())) continue;
    const double flop_gap = std::abs(std::log(e.model.flops_per_token() / model.flops_per_token()));
    if (e.tp != 1 && e.tp != tp) continue;  // another tp's passes say nothing of this one's
    const std::tuple<int, int, int, int, int> d{
        int(1e6 * flop_gap), e.tp == tp ? 0 : 1, std::abs(e.threads - threads),
        std::abs(e.ranks_per_node - ranks_per_node), std::abs(e.micro_batch - micro_batch)};
    if (!best || d < best_distance) best = &e, best_distance = d;
  }
  if (!best) return std::nullopt;
  ComputeEntry e = *best;
  std::string differs;
  auto note = [&](const std::string& s) { differs += (differs.empty() ? "" : ", ") + s; };
  if (shape_key(e.model) != shape_key(model)) {
    if (!published) {
      const std::vector<GemmSample> sweep = sweep_of(p, e);
      note("compute carried from the " + e.model.preset + " entry (h " +
           std::to_string(e.model.hidden) + ", " + std::to_string(e.model.layers) +
           " layers) by its GEMM sweep");
      carry_by_gemms(e, model, micro_batch, [&](const std::string& pass, int m, int n, int k) {
        return sweep_gemm_seconds(sweep, pass, m, n, k);
      });
    } else if (p.roofline.flops_per_s > 0) {
      note("compute carried from the " + e.model.preset + " entry by the GEMM roofline (" +
           std::to_string(p.roofline.sms) + " SMs, " + std::to_string(p.roofline.tile) + "x" +
           std::to_string(p.roofline.tile) + " tiles)");
      carry_by_gemms(e, model, micro_batch, [&](const std::string& pass, int m, int n, int k) {
        return p.roofline.seconds(pass, m, n, k);
      });
    } else {
      note("compute scaled FLOP-proportionally from the " + e.model.preset + " entry");
      scale_to_shape(e, model);
    }
  }
  if (e.threads != threads) note("measured with " + std::to_string(e.threads) + " thread(s)");
  if (e.ranks_per_node != ranks_per_node)
    note("measured with " + std::to_string(e.ranks_per_node) + " rank(s) per node");
  if (e.micro_batch != micro_batch) {
    // Passes scale with the tokens of the micro-batch (GEMM rows): linear, a first-order model.
    const double r = double(micro_batch) / e.micro_batch;
    for (double* t :
         {&e.embedding_forward_s, &e.embedding_backward_s, &e.block_forward_s, &e.block_backward_s,
          &e.head_forward_s, &e.head_backward_s, &e.block_recompute_full_s,
          &e.block_recompute_selective_s, &e.block_input_backward_s, &e.block_weight_backward_s})
      *t *= r;
    note("scaled from micro-batch " + std::to_string(e.micro_batch));
    e.micro_batch = micro_batch;
  }
  if (how) *how = differs;
  return e;
}

double comm_time(const MachineProfile& p, const std::string& op, double bytes, int ranks,
                 int ranks_per_node, std::string* how, int host_ranks) {
  if (ranks < 2 || bytes <= 0) return 0;
  const bool intra = ranks_per_node >= ranks;
  // Measured with as many ranks sharing the host first (unknown on either side: no preference).
  auto host_gap = [&](int h) { return h > 0 && host_ranks > 0 ? std::abs(h - host_ranks) : 0; };
  const CommFit* best = nullptr;
  std::tuple<int, int, int, int> best_distance{};
  for (const CommFit& f : p.comm) {
    if (f.op != op) continue;
    const std::tuple<int, int, int, int> d{
        (f.ranks_per_node >= f.ranks) != intra, host_gap(f.host_ranks),
        std::abs(f.ranks_per_node - ranks_per_node), std::abs(f.ranks - ranks)};
    if (!best || d < best_distance) best = &f, best_distance = d;
  }
  if (!best) return -1;
  if (best->ranks == ranks && best->ranks_per_node == ranks_per_node) {
    std::vector<CommSample> same;
    for (const CommSample& s : p.samples)
      if (s.op == op && s.ranks == ranks && s.ranks_per_node == ranks_per_node &&
          s.host_ranks == best->host_ranks)
        same.push_back(s);
    const double t = interpolate(monotone(same), bytes);
    if (how) *how = t >= 0 ? "" : "alpha-beta fit (no samples to interpolate)";
    return t >= 0 ? t : best->time_s(bytes);
  }
  const CommOp o = parse_op(op);
  const double busbw = best->beta_bytes_per_s * bus_factor(o, best->ranks);
  if (how)
    *how = op + " fit of " + std::to_string(best->ranks) + " rank(s), " +
           std::to_string(best->ranks_per_node) + " per node, at its bus bandwidth";
  return best->alpha_s + bytes * bus_factor(o, ranks) / busbw;
}

}  // namespace strata
