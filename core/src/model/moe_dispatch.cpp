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
}  // namespace

MoeRoutingCounts moe_routing_counts() { return {g_choices.load(), g_dropped.load()}; }

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

}  // namespace strata
