// Interval arithmetic for exposed-communication time: how long a comm stream was busy while the
// compute stream was idle, from recorded [t0, t1) intervals (never estimated).
#pragma once
#include <utility>
#include <vector>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

using Intervals = std::vector<std::pair<double, double>>;

// Sorted, disjoint union of the intervals (empty ones dropped).
Intervals interval_union(Intervals v);
// Total length of the union.
double union_length(const Intervals& v);
// Length of (union of a) intersected with (union of b).
double intersection_length(const Intervals& a, const Intervals& b);

}  // namespace strata
STRATA_EXPORT_END
