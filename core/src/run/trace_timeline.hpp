// --trace: every compute and comm interval of every rank, gathered on rank 0 into /trace and a
// Chrome/Perfetto JSON timeline beside the run file.
#pragma once
#include <string>
#include <vector>

#include "results/run_record.hpp"

namespace strata {

// Append one interval to this rank's events (6 doubles each; strings as indices into fixed
// tables, so that the events travel to rank 0 in one gather of doubles).
void add_trace(std::vector<double>& events, const std::string& stream, const std::string& kind,
               const std::string& name, double t0, double t1, double bytes);

// Rank 0: the gathered events (index = rank) into record.trace, and the timeline as Chrome trace
// JSON at json_path (chrome://tracing, ui.perfetto.dev): one process per rank, one thread per
// stream.
void collect_trace(const std::vector<std::vector<double>>& per_rank, RunRecord& record,
                   const std::string& json_path);

// <out>/<id>.trace.json beside <out>/<id>.h5.
std::string trace_json_path(const std::string& run_file);

}  // namespace strata
