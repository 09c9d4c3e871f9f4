// Everything one run file holds (schema strata-run/1.1, see docs/architecture.md "Run file"), gathered on rank 0
// before writing. Matrices are row-major [ranks x steps] or [ranks x tags].
//
// strata-run/1.1 has the layout of strata-run/1 with typed values: /config attributes typed by
// their option (ConfigType), counts (bytes, calls, tokens, ranks) stored as int64, and the
// dimension scales /rank and /step attached to every per-rank and per-step dataset. The reader
// reads both; a reader that knows only strata-run/1 refuses 1.1 files by their schema.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace strata {

inline constexpr const char* kRunSchema = "strata-run/1.1";
// Every schema read_run_file reads (files from before typed values are strata-run/1).
inline constexpr const char* kRunSchemasRead[] = {"strata-run/1", "strata-run/1.1"};

// How a /config value is stored. The value itself stays text in RunRecord (as printed at start);
// the writer stores it as int64, float64, a boolean (an HDF5 enum of int8 with FALSE = 0 and
// TRUE = 1, h5py's own bool type, read by h5py as numpy.bool_) or a UTF-8 string.
enum class ConfigType { text, integer, real, boolean };

// The shortest "%g" text that reads back as `value` ("0.0003", "300", "1e-300", "1e+16"), in
// fixed notation for whole powers below 1e16 (300, not 3e+02): /config floats as text, the same
// on writing and reading (results/strata_results.py real_text formats them alike).
inline std::string real_text(double value) {
  char text[40];
  int digits = 1;
  for (; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  const char* e = std::strchr(text, 'e');
  const int exponent = e ? std::atoi(e + 1) : -1;
  if (exponent >= 0 && exponent < 16) std::snprintf(text, sizeof text, "%.*g", exponent + 1, value);
  return text;
}

// The units of values that count something (bytes, calls, tokens, FLOPs, ranks): stored as int64,
// rounded to the nearest whole; a value that is unknown (NaN, a rank that never reported) keeps
// its dataset float64.
inline bool is_count_unit(const std::string& unit) {
  return unit == "bytes" || unit == "count" || unit == "tokens" || unit == "FLOP" ||
         unit == "ranks" || unit == "rank";
}

// A named value with its unit ("s", "bytes", "tokens/s", "1" for a ratio, ...).
struct Measure {
  std::string name;
  double value = 0;
  std::string unit;
};

struct CommSeries {
  std::vector<double> calls;            // [ranks x steps], count
  std::vector<double> bytes;            // [ranks x steps], bytes (nccl-tests size convention)
  std::vector<double> time_s;           // [ranks x steps], s
  double predicted_bytes_per_step = 0;  // per rank, bytes: max over ranks
  std::vector<double> algbw;            // [ranks x steps], bytes/s: bytes / time_s
  std::vector<double> busbw;  // [ranks x steps], bytes/s: sum(bytes x bus factor) / time_s
  std::vector<double> predicted_bytes_per_rank;  // [ranks], bytes (stages of a pipeline differ)
};

// One interval of the --trace timeline. Times in s since the ranks' common start of training.
struct TraceEvent {
  int rank = 0;
  std::string stream;  // "compute", "comm0", "comm1", ...
  std::string kind;    // a phase (forward, backward, optimizer, bubble) or a comm op
  std::string name;    // the comm group (dp, tp, pp, ...), or the phase again
  double t0 = 0, t1 = 0;
  double bytes = 0;
};

// One (group, op, size) point of --calibrate-comm (calibrate.hpp). group: dp, tp, pp,
// dp_intra_node or dp_inter_node; op: all_reduce, reduce_scatter or all_gather; bytes in the
// nccl-tests size convention; algbw = bytes / time_s and busbw = algbw x bus_factor(op, ranks),
// in bytes/s.
struct CalibrationPoint {
  std::string group, op;
  double ranks = 0, bytes = 0, time_s = 0, algbw = 0, busbw = 0;
};

// One distinct host of a run (/provenance/topology/<host>, topology.hpp): its numbers are int64
// attributes, its text string attributes, both in this order.
struct NodeTopology {
  std::string host;
  std::vector<std::pair<std::string, std::int64_t>> numbers;  // packages, cores, l3_bytes, ...
  std::vector<std::pair<std::string, std::string>> text;      // nic_names, gpu_links, ...
  std::int64_t number(const std::string& key) const {         // -1 when absent
    for (const auto& [k, v] : numbers)
      if (k == key) return v;
    return -1;
  }
  std::string str(const std::string& key) const {  // "" when absent
    for (const auto& [k, v] : text)
      if (k == key) return v;
    return "";
  }
};

struct RunRecord {
  // "/" attributes
  std::string run_id;
  std::string status = "ok";  // ok | oom | failed | timeout | cancelled
  std::string error;
  std::string created_utc;  // ISO 8601, e.g. 2026-11-22T02:48:53Z
  std::string command_line;

  std::vector<std::pair<std::string, std::string>> config;  // /config attrs, in order
  // How each /config value is stored; a key not listed is text (and every key of a strata-run/1
  // file, whose /config holds only strings).
  std::map<std::string, ConfigType> config_types;
  std::vector<std::pair<std::string, std::string>> provenance;  // /provenance attrs, in order
  std::vector<std::string> hostnames;                           // /provenance/hostnames [ranks]
  std::vector<NodeTopology> topology;  // /provenance/topology/<host>: one per distinct host

  int ranks = 0;
  int steps = 0;
  // /steps/<metric>: [ranks x steps] float64, with the unit of each metric.
  std::vector<std::string> step_metrics;                   // in order: step_s, forward_s, ...
  std::map<std::string, std::string> step_units;           // metric -> unit
  std::map<std::string, std::vector<double>> step_values;  // metric -> [ranks x steps]

  std::map<std::string, CommSeries> comm;     // op name -> series
  std::vector<TraceEvent> trace;              // /trace, --trace only
  std::vector<CalibrationPoint> calibration;  // /calibration, --calibrate-comm only

  // /memory
  std::vector<std::string> memory_tags;
  std::vector<double> peak_bytes;                // [ranks x tags]
  std::vector<double> predicted_bytes;           // [tags]: max over ranks of the prediction
  std::vector<double> predicted_bytes_per_rank;  // [ranks x tags]
  std::vector<double> process_peak_bytes;        // [ranks]: peak RSS (CPU) or device peak
  // [ranks]: the runtime's resident bytes before the strategy allocates (MPI, libraries, BLAS
  // workspace); empty in files written before it existed (unknown).
  std::vector<double> baseline_bytes;
  // [ranks]: the ledger's peak of its total (all tags at one moment, <= the sum of the tag
  // peaks); empty in older files. Untracked = process peak - baseline - tracked peak.
  std::vector<double> tracked_peak_bytes;
  // [ranks]: a GPU run's device peak (the stream-ordered pool's high-water mark plus library
  // workspaces: everything the run held on the GPU at once); empty for CPU runs and older files.
  std::vector<double> device_peak_bytes;

  std::vector<Measure> summary;  // /summary attrs
};

// Write `record` to `path` atomically: a temporary file in the same directory, then rename. With
// replace = false an existing file at `path` is left as it is (a fallback writer's file never
// replaces the one rank 0 wrote).
void write_run_file(const RunRecord& record, const std::string& path, bool replace = true);
// Read a run file back (tests, tools). Throws strata::Error naming the file on any problem.
RunRecord read_run_file(const std::string& path);

}  // namespace strata
