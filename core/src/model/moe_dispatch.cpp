// The mixture-of-experts dispatch plan (moe_dispatch.hpp).
#include "model/moe_dispatch.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "strata/types.hpp"

namespace strata {
namespace {
std::atomic<std::int64_t> g_choices{0}, g_dropped{0};
std::atomic<double> g_aux_loss{0};
}  // namespace

MoeRoutingCounts moe_routing_counts() {
  return {g_choices.load(), g_dropped.load(), g_aux_loss.load()};
}

void add_moe_aux_loss(double sum) { g_aux_loss += sum; }

void add_moe_routing(std::int64_t choices, std::int64_t dropped) {
  g_choices += choices;
  g_dropped += dropped;
}

int moe_capacity(double capacity_factor, int T, int E, int k) {
  if (capacity_factor <= 0) return 0;
  return int(std::ceil(capacity_factor * double(k) * double(T) / double(E) - 1e-9));
}

std::int64_t moe_max_rows(int B, int T, int E, int k, int capacity) {
  const std::int64_t all = std::int64_t(B) * T * k;
  return capacity > 0 ? std::min(all, std::int64_t(B) * E * capacity) : all;
}

std::int64_t moe_max_rows_received(int B, int T, int E, int k, int capacity, int ep) {
  const int local = E / ep;  // a token's k choices are distinct experts
  const std::int64_t from_one = std::int64_t(B) * T * std::min(k, local);
  return std::int64_t(ep) *
         (capacity > 0 ? std::min(from_one, std::int64_t(B) * local * capacity) : from_one);
}

MoeDispatch moe_dispatch(const std::int32_t* experts, int B, int T, int E, int k, int capacity) {
  const std::int64_t N = std::int64_t(B) * T, choices = N * k;
  MoeDispatch d;
  d.offset.assign(std::size_t(E), 0);
  d.count.assign(std::size_t(E), 0);
  d.row_of.assign(std::size_t(choices), -1);
  // Keep or drop each choice: a sequence's first `capacity` choices of each expert.
  std::vector<std::int32_t> kept_in_sequence(static_cast<std::size_t>(E));
  for (std::int64_t n = 0; n < N; ++n) {
    if (n % T == 0) std::fill(kept_in_sequence.begin(), kept_in_sequence.end(), 0);
    for (int j = 0; j < k; ++j) {
      const std::int32_t e = experts[n * k + j];
      if (e < 0 || e >= E)
        throw Error("moe_dispatch: token " + std::to_string(n) + " chose expert " +
                    std::to_string(e) + " of " + std::to_string(E));
      if (capacity > 0 && kept_in_sequence[std::size_t(e)] >= capacity) {
        ++d.dropped;
        continue;
      }
      ++kept_in_sequence[std::size_t(e)];
      d.row_of[std::size_t(n * k + j)] = d.count[std::size_t(e)]++;  // the row within e for now
    }
  }
  for (int e = 1; e < E; ++e) d.offset[std::size_t(e)] = d.offset[e - 1] + d.count[e - 1];
  d.token_of.assign(std::size_t(d.offset[E - 1] + d.count[E - 1]), 0);
  for (std::int64_t n = 0; n < N; ++n)
    for (int j = 0; j < k; ++j) {
      std::int32_t& r = d.row_of[std::size_t(n * k + j)];
      if (r < 0) continue;
      r += d.offset[std::size_t(experts[n * k + j])];
      d.token_of[std::size_t(r)] = std::int32_t(n);
    }
  return d;
}

MoeExchange moe_exchange(const std::vector<std::int32_t>& counts, int rank, int ep, int E) {
  if (ep < 1 || E % ep != 0 || rank < 0 || rank >= ep ||
      counts.size() != std::size_t(ep) * std::size_t(E))
    throw Error("moe_exchange: " + std::to_string(counts.size()) + " counts for rank " +
                std::to_string(rank) + " of " + std::to_string(ep) + " ranks and " +
                std::to_string(E) + " experts (E a multiple of ep, ep x E counts)");
  const int local = E / ep, first = rank * local;
  auto count = [&](int s, int e) { return std::int64_t(counts[std::size_t(s) * E + e]); };
  MoeExchange x;
  x.send_rows.assign(std::size_t(ep), 0);
  x.recv_rows.assign(std::size_t(ep), 0);
  x.expert_rows.assign(std::size_t(local), 0);
  for (int d = 0; d < ep; ++d)
    for (int l = 0; l < local; ++l) {
      x.send_rows[std::size_t(d)] += count(rank, d * local + l);
      x.recv_rows[std::size_t(d)] += count(d, first + l);
      x.expert_rows[std::size_t(l)] += std::int32_t(count(d, first + l));
    }
  auto offsets = [](const auto& n, auto& off) {
    off.assign(n.size(), 0);
    for (std::size_t i = 1; i < n.size(); ++i) off[i] = off[i - 1] + n[i - 1];
  };
  offsets(x.send_rows, x.send_offset);
  offsets(x.recv_rows, x.recv_offset);
  offsets(x.expert_rows, x.expert_offset);
  // Regrouped row i <- received row order[i]: walk the local experts, each source's chunk of it
  // (a cursor per source through its received rows, which are in its local-expert order).
  std::vector<std::int64_t> cursor = x.recv_offset;
  x.order.reserve(std::size_t(x.recv_offset.back() + x.recv_rows.back()));
  for (int l = 0; l < local; ++l)
    for (int s = 0; s < ep; ++s)
      for (std::int64_t r = 0; r < count(s, first + l); ++r)
        x.order.push_back(std::int32_t(cursor[std::size_t(s)]++));
  return x;
}

}  // namespace strata
