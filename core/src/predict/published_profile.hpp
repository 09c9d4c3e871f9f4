// A machine profile made from published figures (source "published"), not from measurement: a
// small text table (profiles/*.txt, docs/predict.md "The advisor") of a device's peak FLOP/s, the
// fraction of it GEMM-bound passes achieve, memory bandwidth, and the links within and between
// nodes, turned into one compute entry (a reference shape; others scale FLOP-proportionally,
// find_compute) and alpha-beta comm fits for groups inside one node and across nodes.
//   runner --calibrate --calibrate-from profiles/h100-sxm-published.txt --profile h100.h5
#pragma once
#include <string>

#include "predict/profile.hpp"

namespace strata {

// The table: one "key value" per line, '#' starts a comment. Throws ConfigError naming the file,
// the line and the key on a missing, unknown or malformed entry.
MachineProfile profile_from_table(const std::string& path);

}  // namespace strata
