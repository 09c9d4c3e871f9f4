// Compute time by GEMM shape (gemm_model.hpp).
#include "predict/gemm_model.hpp"

#include <algorithm>
#include <cmath>

#include "predict/profile.hpp"
#include "strata/device.hpp"

namespace strata {

bool same_gemm(const GemmSample& a, const GemmSample& b) {
  return a.device == b.device && a.precision == b.precision && a.threads == b.threads &&
         a.ranks_per_node == b.ranks_per_node && a.pass == b.pass && a.m == b.m && a.n == b.n &&
         a.k == b.k;
}

namespace {

bool same_conditions(const GemmSample& s, const ComputeEntry& e) {
  return s.device == e.device && s.precision == e.precision && s.threads == e.threads &&
         s.ranks_per_node == e.ranks_per_node;
}

double log_distance(const GemmSample& s, int m, int n, int k) {
  return std::abs(std::log(double(m) / s.m)) + std::abs(std::log(double(n) / s.n)) +
         std::abs(std::log(double(k) / s.k));
}

// Bytes one block keeps for a micro-batch (its activation slot): the memory-bound work of a block
// pass grows with it (a row of LayerNorm, GELU, residual per element; the attention's T x T
// probabilities on the CPU).
double block_activation_bytes(const ModelSpec& m, int micro_batch, const ComputeEntry& e) {
  const Partition block{1, 1, 1, 0, false};
  const DType dtype = e.precision == "bf16" ? DType::bf16 : DType::f32;
  const Device device = e.device == "cuda" ? Device::cuda : Device::cpu;
  return double(predict_activations(m, micro_batch, block, Recompute::none, dtype, device).slot);
}

double gemms_seconds(const GemmSeconds& gemm, const std::vector<Linear>& layers, const char* pass,
                     int m) {
  double t = 0;
  for (const Linear& l : layers) t += gemm(pass, m, l.n, l.k);
  return t;
}

}  // namespace

double GemmRoofline::seconds(const std::string& pass, int m, int n, int k) const {
  // out[M,N] = A[M,K] B[K,N]: the waves of output tiles at one SM's rate, or the bytes.
  auto one = [&](double M, double N, double K) {
    const double tiles = std::ceil(M / tile) * std::ceil(N / tile);
    const double waves = std::ceil(tiles / sms);
    const double compute = waves * 2.0 * tile * tile * K / (flops_per_s / sms);
    const double memory = element_bytes * (M * K + K * N + M * N) / bytes_per_s;
    return std::max(compute, memory);
  };
  return pass == "forward" ? one(m, n, k) : one(m, k, n) + one(n, k, m);
}

std::vector<Linear> block_linears(const ModelSpec& m) {
  const int C = m.hidden, F = m.ffn_hidden();
  const int kv = int(std::int64_t(C) * m.kv_head_count() / m.heads);  // K's (and V's) outputs
  if (m.arch == Arch::moe)  // the router, then a token's top_k experts as one GEMM each way
    return {
        {C + 2 * kv, C}, {C, C}, {m.experts, C}, {m.top_k * int(m.fc_rows()), C}, {C, m.top_k * F}};
  return {{C + 2 * kv, C}, {C, C}, {int(m.fc_rows()), C}, {C, F}};
}

std::vector<Linear> head_linears(const ModelSpec& m) { return {{m.vocab, m.hidden}}; }

std::vector<GemmSample> gemm_sweep_shapes(const ComputeEntry& e) {
  std::vector<GemmSample> out;
  for (double scale : {0.25, 0.5, 0.75, 1.0, 1.5}) {
    ModelSpec at = e.model;
    at.hidden = std::max(16, int(std::lround(e.model.hidden * scale / 16)) * 16);
    if (at.ffn > 0) at.ffn = std::max(16, int(std::lround(e.model.ffn * scale / 16)) * 16);
    std::vector<Linear> layers = block_linears(at);
    for (const Linear& l : head_linears(at)) layers.push_back(l);
    for (const Linear& l : layers)
      for (const char* pass : {"forward", "backward"}) {
        GemmSample s{
            e.device, e.precision, e.threads, e.ranks_per_node, pass, e.micro_batch * e.model.seq,
            l.n,      l.k,         0};
        if (std::none_of(out.begin(), out.end(),
                         [&](const GemmSample& o) { return same_gemm(o, s); }))
          out.push_back(s);
      }
  }
  return out;
}

std::vector<GemmSample> sweep_of(const MachineProfile& p, const ComputeEntry& e) {
  std::vector<GemmSample> out;
  for (const GemmSample& s : p.gemms)
    if (same_conditions(s, e) && s.time_s > 0) out.push_back(s);
  const auto has = [&](const char* pass) {
    return std::any_of(out.begin(), out.end(), [&](const GemmSample& s) { return s.pass == pass; });
  };
  if (!has("forward") || !has("backward")) out.clear();
  return out;
}

double sweep_gemm_seconds(const std::vector<GemmSample>& sweep, const std::string& pass, int m,
                          int n, int k) {
  std::vector<std::pair<double, const GemmSample*>> near;
  for (const GemmSample& s : sweep)
    if (s.pass == pass && s.time_s > 0) near.emplace_back(log_distance(s, m, n, k), &s);
  if (near.empty()) return -1;
  const std::size_t two = std::min<std::size_t>(2, near.size());
  std::partial_sort(near.begin(), near.begin() + long(two), near.end(),
                    [](const auto& a, const auto& b) { return a.first < b.first; });
  const double flops = linear_flops(pass, m, n, k);
  const auto log_rate = [](const GemmSample* s) { return std::log(s->flops() / s->time_s); };
  if (two == 1 || near[0].first < 1e-9) return flops / std::exp(log_rate(near[0].second));
  const double w0 = 1 / near[0].first, w1 = 1 / near[1].first;
  const double rate =
      std::exp((w0 * log_rate(near[0].second) + w1 * log_rate(near[1].second)) / (w0 + w1));
  return flops / rate;
}

void carry_by_gemms(ComputeEntry& e, const ModelSpec& to, int micro_batch,
                    const GemmSeconds& gemm) {
  const ModelSpec from = e.model;
  const int m_from = e.micro_batch * from.seq, m_to = micro_batch * to.seq;
  // A unit pass: its GEMMs, plus the rest of what the entry holds, scaled.
  auto carry = [&](double& t, const std::vector<Linear>& layers_from,
                   const std::vector<Linear>& layers_to, const char* pass, double rest_ratio) {
    const double rest = std::max(0.0, t - gemms_seconds(gemm, layers_from, pass, m_from));
    t = gemms_seconds(gemm, layers_to, pass, m_to) + rest * rest_ratio;
  };
  const double block_forward = e.block_forward_s, block_backward = e.block_backward_s;
  const double activations =
      block_activation_bytes(to, micro_batch, e) / block_activation_bytes(from, e.micro_batch, e);
  carry(e.block_forward_s, block_linears(from), block_linears(to), "forward", activations);
  carry(e.block_backward_s, block_linears(from), block_linears(to), "backward", activations);
  const double tokens = double(m_to) / m_from;
  const double logits = tokens * double(to.vocab) / from.vocab;
  carry(e.head_forward_s, head_linears(from), head_linears(to), "forward", logits);
  carry(e.head_backward_s, head_linears(from), head_linears(to), "backward", logits);
  const double rows = tokens * double(to.hidden) / from.hidden;
  e.embedding_forward_s *= rows, e.embedding_backward_s *= rows;
  if (block_forward > 0) e.block_recompute_full_s *= e.block_forward_s / block_forward;
  keep_split_shares(e, block_backward);
  e.block_recompute_selective_s *= tokens * double(to.seq) * to.hidden / (from.seq * from.hidden);
  e.model = to;
  e.micro_batch = micro_batch;
}

}  // namespace strata
