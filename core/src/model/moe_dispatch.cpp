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

MoeDispatch moe_dispatch(const std::int32_t* experts, int B, int T, int E, int k, int capacity,
                         const MoeSequenceSplit& split) {
  const std::int64_t N = std::int64_t(B) * T, choices = N * k;
  const int chunks = split.chunks, chunk = T / std::max(chunks, 1);
  if (chunks < 1 || T % chunks != 0 ||
      !(split.before.empty() || split.before.size() == std::size_t(B) * chunks * E))
    throw Error("moe_dispatch: a split of " + std::to_string(T) + " tokens into " +
                std::to_string(chunks) + " chunks with " + std::to_string(split.before.size()) +
                " counts ahead of them (B chunks E = " +
                std::to_string(std::int64_t(B) * chunks * E) + ")");
  MoeDispatch d;
  d.offset.assign(std::size_t(E), 0);
  d.count.assign(std::size_t(E), 0);
  d.row_of.assign(std::size_t(choices), -1);
  // Keep or drop each choice: a sequence's first `capacity` choices of each expert. Up to the
  // capacity every choice is kept, so a chunk starts from the choices ahead of it.
  std::vector<std::int32_t> kept_in_sequence(static_cast<std::size_t>(E));
  for (std::int64_t n = 0; n < N; ++n) {
    if (n % chunk == 0) {
      if (split.before.empty())
        std::fill(kept_in_sequence.begin(), kept_in_sequence.end(), 0);
      else
        std::copy_n(split.before.begin() + (n / chunk) * E, E, kept_in_sequence.begin());
    }
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

std::vector<std::int32_t> moe_chunk_choices(const std::int32_t* experts, int B, int T, int E, int k,
                                            int chunks) {
  if (chunks < 1 || T % chunks != 0)
    throw Error("moe_chunk_choices: " + std::to_string(T) + " tokens in " + std::to_string(chunks) +
                " chunks");
  std::vector<std::int32_t> counts(std::size_t(B) * chunks * E, 0);
  const std::int64_t chunk = T / chunks;
  for (std::int64_t n = 0; n < std::int64_t(B) * T; ++n)
    for (int j = 0; j < k; ++j) ++counts[std::size_t(n / chunk * E + experts[n * k + j])];
  return counts;
}

MoeSequenceChoices moe_sequence_choices(const std::vector<std::int32_t>& all, int cp, int rank,
                                        int B, int E) {
  const int chunks = cp > 1 ? 2 : 1;
  if (cp < 1 || rank < 0 || rank >= cp || all.size() != std::size_t(cp) * B * chunks * E)
    throw Error("moe_sequence_choices: " + std::to_string(all.size()) + " counts from " +
                std::to_string(cp) + " cp ranks of " + std::to_string(B) + " sequences and " +
                std::to_string(E) + " experts");
  MoeSequenceChoices out;
  out.sequence.assign(std::size_t(B) * E, 0);
  if (cp == 1) {
    out.sequence = all;
    return out;
  }
  // The sequence's chunk c: rank c's first, or rank 2 cp - 1 - c's second.
  auto chunk = [&](int c, int b) {
    const int r = c < cp ? c : 2 * cp - 1 - c, h = c < cp ? 0 : 1;
    return all.begin() + ((std::size_t(r) * B + b) * 2 + h) * E;
  };
  out.split.chunks = 2;
  out.split.before.assign(std::size_t(B) * 2 * E, 0);
  const int mine[2] = {rank, 2 * cp - 1 - rank};
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < 2 * cp; ++c) {
      for (int h = 0; h < 2; ++h)
        if (mine[h] == c)  // the choices so far are this chunk's before
          std::copy_n(out.sequence.begin() + std::size_t(b) * E, E,
                      out.split.before.begin() + (std::size_t(b) * 2 + h) * E);
      for (int e = 0; e < E; ++e) out.sequence[std::size_t(b) * E + e] += chunk(c, b)[e];
    }
  return out;
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
