#include "comm/intervals.hpp"

#include <algorithm>

namespace strata {

Intervals interval_union(Intervals v) {
  std::erase_if(v, [](const auto& iv) { return iv.second <= iv.first; });
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second)
      out.back().second = std::max(out.back().second, iv.second);
    else
      out.push_back(iv);
  }
  return out;
}

double union_length(const Intervals& v) {
  double total = 0;
  for (const auto& [a, b] : interval_union(v)) total += b - a;
  return total;
}

double intersection_length(const Intervals& a, const Intervals& b) {
  Intervals ua = interval_union(a), ub = interval_union(b);
  double total = 0;
  std::size_t i = 0, j = 0;
  while (i < ua.size() && j < ub.size()) {
    double lo = std::max(ua[i].first, ub[j].first);
    double hi = std::min(ua[i].second, ub[j].second);
    if (hi > lo) total += hi - lo;
    (ua[i].second < ub[j].second) ? ++i : ++j;
  }
  return total;
}

}  // namespace strata
