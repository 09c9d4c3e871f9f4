// The mixture-of-experts layer's pieces on the CPU (not yet wired into the model): top-k softmax
// routing and its backward against finite differences, the sequence-wise load-balancing loss
// against its formula and gradient, dispatch (gather) and combine against their definitions and
// adjoints, and the dispatch plan's capacity per sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "backends/cpu/layers.hpp"
#include "model/moe_dispatch.hpp"
#include "random_inputs.hpp"
#include "strata/model.hpp"
#include "strata/types.hpp"

namespace cpu = strata::cpu;
using strata::MoeDispatch;

namespace {

// Logits whose values are at least 0.2 apart within each row (a random order of 0.3 e plus noise
// below 0.05), so that a finite-difference step of 1e-2 never changes the top k.
std::vector<float> separated_logits(int N, int E, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
  std::vector<float> l(std::size_t(N) * E);
  std::vector<int> order(E);
  for (int n = 0; n < N; ++n) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int e = 0; e < E; ++e) l[std::size_t(n) * E + e] = 0.3f * float(order[e]) + noise(rng);
  }
  return l;
}

}  // namespace

TEST(MoeRouter, TopKIsTheLargestLogitsAndGatesTheirSoftmax) {
  const int E = 5, k = 2;
  // Row 0: plain; row 1: a tie (experts 1 and 3) goes to the lower index first.
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f,  //
                                     0.5f, 3.0f, 0.2f,  3.0f, -2.0f};
  std::vector<float> probs(10), gates(4);
  std::vector<std::int32_t> experts(4);
  cpu::router_topk_forward(probs.data(), experts.data(), gates.data(), logits.data(), 2, E, k);
  EXPECT_EQ(experts, (std::vector<std::int32_t>{1, 3, 1, 3}));
  for (int n = 0; n < 2; ++n) {
    double z = 0;
    for (int e = 0; e < E; ++e) z += std::exp(double(logits[n * E + e]));
    for (int e = 0; e < E; ++e)
      EXPECT_NEAR(probs[n * E + e], std::exp(double(logits[n * E + e])) / z, 1e-7);
    const double a = logits[n * E + experts[n * k]], b = logits[n * E + experts[n * k + 1]];
    EXPECT_NEAR(gates[n * k], 1.0 / (1.0 + std::exp(b - a)), 1e-7);
    EXPECT_NEAR(gates[n * k] + gates[n * k + 1], 1.0, 1e-7);
  }
  EXPECT_FLOAT_EQ(gates[2], 0.5f);  // the tie
}

// L = sum w_g gates + sum w_p probs: the backward's dlogits against central differences of L (the
// routing unchanged by the step: logits 0.2 apart).
TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  const int N = 7, E = 6, k = 2;
  std::vector<float> logits = separated_logits(N, E, 3);
  const std::vector<float> wg = random_floats(std::size_t(N) * k, 4),
                           wp = random_floats(std::size_t(N) * E, 5);
  std::vector<float> probs(std::size_t(N) * E), gates(std::size_t(N) * k),
      dlogits(std::size_t(N) * E);
  std::vector<std::int32_t> experts(std::size_t(N) * k);
  auto L = [&] {
    cpu::router_topk_forward(probs.data(), experts.data(), gates.data(), logits.data(), N, E, k);
    double s = 0;
    for (std::size_t i = 0; i < gates.size(); ++i) s += double(wg[i]) * gates[i];
    for (std::size_t i = 0; i < probs.size(); ++i) s += double(wp[i]) * probs[i];
    return s;
  };
  L();
  const std::vector<std::int32_t> routed = experts;
  cpu::router_topk_backward(dlogits.data(), probs.data(), experts.data(), gates.data(), wg.data(),
                            wp.data(), N, E, k);
  const float h = 1e-2f;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float x0 = logits[i];
    logits[i] = x0 + h;
    const double up = L();
    ASSERT_EQ(experts, routed);
    logits[i] = x0 - h;
    const double down = L();
    ASSERT_EQ(experts, routed);
    logits[i] = x0;
    const double fd = (up - down) / (2.0 * h);
    EXPECT_NEAR(dlogits[i], fd, 2e-4 + 2e-3 * std::fabs(fd)) << "logit " << i;
  }
}

// The loss against f and P computed here in double; uniform routing gives exactly coef; the
// gradient is scale * coef * f / T at every token of the sequence.
TEST(MoeAuxLoss, IsTheSequenceWiseFormulaAndItsGradient) {
  const int B = 3, T = 8, E = 4, k = 2, N = B * T;
  const float coef = 0.01f, scale = 0.25f;
  std::mt19937 rng(6);
  std::vector<std::int32_t> experts(std::size_t(N) * k);
  for (int n = 0; n < N; ++n) {  // two different experts per token, the first sequence uniform
    const int a = n < T ? n % E : int(rng() % E);
    experts[std::size_t(n) * k] = a;
    experts[std::size_t(n) * k + 1] = n < T ? (a + 2) % E : (a + 1 + int(rng() % (E - 1))) % E;
  }
  std::vector<float> probs(std::size_t(N) * E, 1.0f / E);
  for (int n = T; n < N; ++n) {  // the others: any distribution
    const std::vector<float> r = random_floats(E, 7 + n, 0.1f, 1.0f);
    const float s = std::accumulate(r.begin(), r.end(), 0.0f);
    for (int e = 0; e < E; ++e) probs[std::size_t(n) * E + e] = r[e] / s;
  }
  std::vector<float> loss(B), dprobs(std::size_t(N) * E);
  const std::vector<std::int32_t> choices =
      strata::moe_chunk_choices(experts.data(), B, T, E, k, 1);  // [B, E]
  cpu::moe_aux_loss_forward(loss.data(), probs.data(), choices.data(), B, T, T, E, k, coef);
  cpu::moe_aux_loss_backward(dprobs.data(), choices.data(), B, T, T, E, k, coef * scale);
  EXPECT_NEAR(loss[0], coef, 1e-8);
  for (int b = 0; b < B; ++b) {
    double want = 0;
    for (int e = 0; e < E; ++e) {
      double f = 0, P = 0;
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j < k; ++j) f += experts[std::size_t(b * T + t) * k + j] == e;
        P += probs[std::size_t(b * T + t) * E + e];
      }
      f *= double(E) / (k * T), P /= T;
      want += f * P;
      for (int t = 0; t < T; ++t)
        EXPECT_NEAR(dprobs[std::size_t(b * T + t) * E + e], scale * coef * f / T, 1e-9);
    }
    EXPECT_NEAR(loss[b], coef * want, 1e-8) << "sequence " << b;
  }
  // Two ranks holding half of each sequence (context parallelism; any split of the tokens): with
  // the whole sequences' counts, their losses add up to the sequences' and their d(probs) are the
  // sequences' rows.
  const int H = T / 2;
  std::vector<float> halves[2], half_loss[2] = {std::vector<float>(B), std::vector<float>(B)};
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < 2; ++h)
      halves[h].insert(halves[h].end(), probs.begin() + std::ptrdiff_t(b * T + h * H) * E,
                       probs.begin() + std::ptrdiff_t(b * T + h * H + H) * E);
  for (int h = 0; h < 2; ++h) {
    std::vector<float> dhalf(halves[h].size());
    cpu::moe_aux_loss_forward(half_loss[h].data(), halves[h].data(), choices.data(), B, H, T, E, k,
                              coef);
    cpu::moe_aux_loss_backward(dhalf.data(), choices.data(), B, H, T, E, k, coef * scale);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < H * E; ++i)
        EXPECT_EQ(dhalf[std::size_t(b * H * E + i)], dprobs[std::size_t((b * T + h * H) * E + i)]);
  }
  for (int b = 0; b < B; ++b) EXPECT_NEAR(half_loss[0][b] + half_loss[1][b], loss[b], 1e-8);
}

// Context parallelism: cp ranks each hold two zig-zag chunks of every sequence (cp_position). From
// their chunks' counts, all-gathered, each rank's plan keeps and drops exactly the choices the
// whole sequences' plan does, and every rank sees the sequences' counts.
TEST(MoeDispatchPlan, ContextParallelChunksDropAsTheWholeSequence) {
  const int B = 2, T = 24, E = 4, k = 2;
  std::mt19937 rng(17);
  std::vector<std::int32_t> experts(std::size_t(B) * T * k);
  for (std::size_t c = 0; c < experts.size(); c += k) {  // crowded: experts 0 and 1 take most
    experts[c] = int(rng() % 2);
    experts[c + 1] = 2 + int(rng() % 2);
  }
  const int cap = strata::moe_capacity(0.75, T, E, k);  // 9 of ~12 choices an expert
  const MoeDispatch whole = strata::moe_dispatch(experts.data(), B, T, E, k, cap);
  ASSERT_GT(whole.dropped, 0);
  const std::vector<std::int32_t> counts = strata::moe_chunk_choices(experts.data(), B, T, E, k, 1);
  for (const int cp : {2, 4}) {
    const int Tl = T / cp;
    std::vector<std::vector<std::int32_t>> local(cp);  // each rank's choices [B Tl, k]
    std::vector<std::int32_t> all;
    for (int r = 0; r < cp; ++r) {
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tl; ++t) {
          const auto at =
              experts.begin() + (std::ptrdiff_t(b) * T + strata::cp_position(T, cp, r, t)) * k;
          local[r].insert(local[r].end(), at, at + k);
        }
      const auto mine = strata::moe_chunk_choices(local[r].data(), B, Tl, E, k, 2);
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::int64_t dropped = 0;
    for (int r = 0; r < cp; ++r) {
      const strata::MoeSequenceChoices seq = strata::moe_sequence_choices(all, cp, r, B, E);
      EXPECT_EQ(seq.sequence, counts) << "cp " << cp << " rank " << r;
      const MoeDispatch plan = strata::moe_dispatch(local[r].data(), B, Tl, E, k, cap, seq.split);
      dropped += plan.dropped;
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tl; ++t)
          for (int j = 0; j < k; ++j) {
            const std::size_t n = std::size_t(b) * T + strata::cp_position(T, cp, r, t);
            EXPECT_EQ(plan.row_of[(std::size_t(b) * Tl + t) * k + j] >= 0,
                      whole.row_of[n * k + j] >= 0)
                << "cp " << cp << " rank " << r << " sequence " << b << " token " << t;
          }
    }
    EXPECT_EQ(dropped, whole.dropped) << "cp " << cp;
  }
}

// Dispatch, combine and their backwards against their definitions, over a plan with dropped
// choices; the gather's backward is the gather's adjoint: <gather(x), d> = <x, gather^T(d)>.
TEST(MoeCombine, GatherCombineAndBackwardsFollowTheirDefinitions) {
  const int B = 2, T = 6, E = 3, k = 2, C = 5, N = B * T;
  std::vector<std::int32_t> experts(std::size_t(N) * k);
  for (int n = 0; n < N; ++n)
    experts[std::size_t(n) * k] = 0, experts[std::size_t(n) * k + 1] = 1 + n % 2;
  const MoeDispatch plan = strata::moe_dispatch(experts.data(), B, T, E, k, 4);
  ASSERT_GT(plan.dropped, 0);
  const int R = plan.rows();
  const std::vector<float> x = random_floats(std::size_t(N) * C, 8),
                           eout = random_floats(std::size_t(R) * C, 9),
                           gates = random_floats(std::size_t(N) * k, 10, 0.1f, 1.0f),
                           dy = random_floats(std::size_t(N) * C, 11),
                           din = random_floats(std::size_t(R) * C, 12);
  std::vector<float> xd(std::size_t(R) * C), y(std::size_t(N) * C), deout(std::size_t(R) * C, NAN),
      dgates(std::size_t(N) * k, NAN), dx(std::size_t(N) * C, 0.0f);
  cpu::moe_gather(xd.data(), x.data(), plan.token_of.data(), R, C);
  cpu::moe_combine(y.data(), eout.data(), plan.row_of.data(), gates.data(), N, k, C);
  cpu::moe_combine_backward(deout.data(), dgates.data(), dy.data(), eout.data(), plan.row_of.data(),
                            gates.data(), N, k, C);
  cpu::moe_gather_backward(dx.data(), din.data(), plan.row_of.data(), N, k, C);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(xd[std::size_t(r) * C + c], x[std::size_t(plan.token_of[r]) * C + c]);
  double lhs = 0, rhs = 0;
  for (std::size_t i = 0; i < xd.size(); ++i) lhs += double(xd[i]) * din[i];
  for (std::size_t i = 0; i < x.size(); ++i) rhs += double(x[i]) * dx[i];
  EXPECT_NEAR(lhs, rhs, 1e-4 * std::fabs(lhs) + 1e-5);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      double want = 0;
      for (int j = 0; j < k; ++j) {
        const int r = plan.row_of[std::size_t(n) * k + j];
        if (r >= 0) want += double(gates[std::size_t(n) * k + j]) * eout[std::size_t(r) * C + c];
      }
      EXPECT_NEAR(y[std::size_t(n) * C + c], want, 1e-6);
    }
    for (int j = 0; j < k; ++j) {
      const int r = plan.row_of[std::size_t(n) * k + j];
      double dot = 0;
      for (int c = 0; c < C; ++c) {
        if (r < 0) continue;
        dot += double(dy[std::size_t(n) * C + c]) * eout[std::size_t(r) * C + c];
        EXPECT_FLOAT_EQ(deout[std::size_t(r) * C + c],
                        gates[std::size_t(n) * k + j] * dy[std::size_t(n) * C + c]);
      }
      EXPECT_NEAR(dgates[std::size_t(n) * k + j], dot, 1e-6);
    }
  }
  for (float v : deout) EXPECT_FALSE(std::isnan(v)) << "a row no choice wrote";
}

// Dropless keeps every choice, each expert's rows in token order; a capacity keeps each sequence's
// first choices of an expert, so the plan of a batch is the plans of its sequences one by one.
TEST(MoeDispatchPlan, CapacityPerSequenceAndDropless) {
  const int B = 3, T = 10, E = 4, k = 2, N = B * T;
  std::mt19937 rng(13);
  std::vector<std::int32_t> experts(std::size_t(N) * k);
  for (int n = 0; n < N; ++n) {
    experts[std::size_t(n) * k] = int(rng() % 2);  // crowded: experts 0 and 1 take most
    experts[std::size_t(n) * k + 1] = 2 + int(rng() % 2);
  }
  const MoeDispatch all = strata::moe_dispatch(experts.data(), B, T, E, k, 0);
  EXPECT_EQ(all.rows(), N * k);
  EXPECT_EQ(all.dropped, 0);
  for (int e = 0; e < E; ++e)
    for (int r = all.offset[e] + 1; r < all.offset[e] + all.count[e]; ++r)
      EXPECT_LT(all.token_of[r - 1], all.token_of[r]);
  const int cap = strata::moe_capacity(1.0, T, E, k);
  EXPECT_EQ(cap, 5);  // ceil(1.0 x 2 x 10 / 4)
  EXPECT_EQ(strata::moe_capacity(0.0, T, E, k), 0);
  const MoeDispatch capped = strata::moe_dispatch(experts.data(), B, T, E, k, cap);
  EXPECT_LE(capped.rows(), strata::moe_max_rows(B, T, E, k, cap));
  EXPECT_GT(capped.dropped, 0);
  EXPECT_EQ(capped.rows() + capped.dropped, N * k);
  for (int b = 0; b < B; ++b) {
    const MoeDispatch one =
        strata::moe_dispatch(experts.data() + std::size_t(b) * T * k, 1, T, E, k, cap);
    std::vector<int> seen(E, 0);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) {
        const int e = experts[std::size_t(b * T + t) * k + j];
        const bool kept = capped.row_of[std::size_t(b * T + t) * k + j] >= 0;
        EXPECT_EQ(kept, seen[e]++ < cap) << "sequence " << b << " token " << t;
        EXPECT_EQ(kept, one.row_of[std::size_t(t) * k + j] >= 0);
        if (kept)
          EXPECT_EQ(capped.token_of[capped.row_of[std::size_t(b * T + t) * k + j]], b * T + t);
      }
  }
}

// Expert parallelism's exchange: 3 ranks, 6 experts (2 each), each rank's own routing and plan.
// The all_to_allv the layout describes, simulated with each row labelled (source rank, its row
// in the source's plan): every rank receives exactly the rows its experts were given, and the
// regrouped order puts each local expert's rows together, sources in rank order, each source's
// rows in its plan's order. Counts that cannot be a layout are refused.
TEST(MoeDispatchPlan, ExpertParallelExchange) {
  const int ep = 3, E = 6, local = E / ep, B = 2, T = 7, k = 2, N = B * T;
  std::mt19937 rng(29);
  std::vector<MoeDispatch> plans;
  std::vector<std::int32_t> counts;
  for (int s = 0; s < ep; ++s) {
    std::vector<std::int32_t> experts(std::size_t(N) * k);
    for (int n = 0; n < N; ++n) {
      experts[std::size_t(n) * k] = int(rng() % E);
      experts[std::size_t(n) * k + 1] = (experts[std::size_t(n) * k] + 1 + int(rng() % 5)) % E;
    }
    plans.push_back(strata::moe_dispatch(experts.data(), B, T, E, k, s == 1 ? 2 : 0));
    counts.insert(counts.end(), plans.back().count.begin(), plans.back().count.end());
  }
  std::vector<strata::MoeExchange> x;
  for (int r = 0; r < ep; ++r) x.push_back(strata::moe_exchange(counts, r, ep, E));
  for (int r = 0; r < ep; ++r) {
    // What rank r receives: from each source s, s's rows for r, at recv_offset[s].
    std::vector<std::pair<int, int>> received;
    for (int s = 0; s < ep; ++s) {
      EXPECT_EQ(x[r].recv_rows[s], x[s].send_rows[r]) << r << " from " << s;
      EXPECT_EQ(x[r].recv_offset[s], std::int64_t(received.size()));
      for (std::int64_t i = 0; i < x[s].send_rows[r]; ++i)
        received.emplace_back(s, int(x[s].send_offset[r] + i));
    }
    ASSERT_EQ(x[r].order.size(), received.size());
    // Regrouped: local expert l's rows, source by source, each in its plan's order.
    std::vector<std::pair<int, int>> want;
    for (int l = 0; l < local; ++l) {
      const int e = r * local + l;
      EXPECT_EQ(x[r].expert_offset[l], std::int32_t(want.size()));
      for (int s = 0; s < ep; ++s)
        for (int i = 0; i < plans[s].count[e]; ++i) want.emplace_back(s, plans[s].offset[e] + i);
      EXPECT_EQ(x[r].expert_offset[l] + x[r].expert_rows[l], std::int32_t(want.size()));
    }
    std::vector<std::pair<int, int>> regrouped;
    for (std::int32_t i : x[r].order) regrouped.push_back(received[std::size_t(i)]);
    EXPECT_EQ(regrouped, want) << "rank " << r;
  }
  EXPECT_THROW(strata::moe_exchange(counts, 0, 4, E), strata::Error);      // 6 experts on 4 ranks
  EXPECT_THROW(strata::moe_exchange(counts, 3, ep, E), strata::Error);     // no rank 3
  EXPECT_THROW(strata::moe_exchange({1, 2, 3}, 0, ep, E), strata::Error);  // not ep x E counts
}
