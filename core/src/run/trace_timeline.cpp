#include "run/trace_timeline.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>

#include "strata/comm.hpp"
#include "strata/context.hpp"
#include "strata/types.hpp"

namespace strata {
namespace {

const std::vector<std::string> kTraceStreams = {"compute", "comm0", "comm1", "comm2", "comm3",
                                                "comm4",   "comm5", "comm6", "comm7"};

// The compute phases, then every comm op (kCommOpNames, d2h and h2d included).
std::vector<std::string> trace_kinds() {
  std::vector<std::string> kinds(kPhaseNames.begin(), kPhaseNames.end());
  kinds.insert(kinds.end(), kCommOpNames.begin(), kCommOpNames.end());
  return kinds;
}
const std::vector<std::string> kTraceKinds = trace_kinds();
const std::vector<std::string> kTraceNames = {
    "", "dp", "tp", "pp", "dp_intra_node", "dp_inter_node", "host", "ep", "ep_dp", "cp"};

// Streams and kinds are closed sets: one missing from its table would put the interval under
// another's name. Group names are the mesh's axes; another group is traced unnamed.
double index_of(const std::vector<std::string>& table, const std::string& s, bool known) {
  auto it = std::find(table.begin(), table.end(), s);
  if (it != table.end()) return double(it - table.begin());
  if (known) throw Error("--trace: no trace index for '" + s + "'", "this is a bug in strata");
  return 0;
}

}  // namespace

void add_trace(std::vector<double>& out, const std::string& stream, const std::string& kind,
               const std::string& name, double t0, double t1, double bytes) {
  const double e[6] = {index_of(kTraceStreams, stream, true),
                       index_of(kTraceKinds, kind, true),
                       index_of(kTraceNames, name, false),
                       t0,
                       t1,
                       bytes};
  out.insert(out.end(), e, e + 6);
}

void collect_trace(const std::vector<std::vector<double>>& per_rank, RunRecord& rec,
                   const std::string& json_path) {
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    for (std::size_t i = 0; i + 6 <= per_rank[r].size(); i += 6) {
      const double* e = per_rank[r].data() + i;
      rec.trace.push_back({int(r), kTraceStreams[std::size_t(e[0])], kTraceKinds[std::size_t(e[1])],
                           kTraceNames[std::size_t(e[2])], e[3], e[4], e[5]});
    }
  std::FILE* f = std::fopen(json_path.c_str(), "w");
  if (!f) throw Error("--trace: cannot write " + json_path, "check --out");
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  for (std::size_t i = 0; i < rec.trace.size(); ++i) {
    const TraceEvent& e = rec.trace[i];
    const std::string label = e.name.empty() ? e.kind : e.kind + " " + e.name;
    std::fprintf(f,
                 "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, "
                 "\"dur\": %.3f, \"pid\": %d, \"tid\": \"%s\", \"args\": {\"bytes\": %.0f}}%s\n",
                 label.c_str(), e.kind.c_str(), e.t0 * 1e6, (e.t1 - e.t0) * 1e6, e.rank,
                 e.stream.c_str(), e.bytes, i + 1 < rec.trace.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  if (std::fclose(f) != 0) throw Error("--trace: cannot write " + json_path, "check --out");
}

std::string trace_json_path(const std::string& run_file) {
  return std::filesystem::path(run_file).replace_extension(".trace.json").string();
}

}  // namespace strata
