// Collective bandwidth of every transport built in, the nccl-tests way, on Google Benchmark.
// Run it under mpirun: every rank executes every benchmark; only rank 0 reports.
//
// BM_Coll/<transport>/<op>/<in-place|out-of-place>/bytes:<B>: one Group call of <op> over one
// group of all ranks (strata::split_group(<transport>, ...)), float32 data, a fixed number of
// times. <transport>: strata::transports_built() (mpi; ucx, gloo in builds with them).
// <op>: all_reduce (sum), reduce_scatter (sum), all_gather, broadcast (root 0), reduce (sum to
// root 0), sendrecv (ring: send to rank+1 on a comm stream while receiving from rank-1),
// all_to_all (a block of bytes / n to every rank).
// Conventions (nccl-tests):
//   bytes     the buffer size for all_reduce, broadcast, reduce and sendrecv; the full n x shard
//             size (reduce_scatter's input, all_gather's output, all_to_all's input and output)
//             for the other three, rounded down to a multiple of 4n; <B> in the name is the
//             requested size
//   modes     the Group API has all_reduce, broadcast and reduce only in place (the result
//             overwrites the input), reduce_scatter, sendrecv and all_to_all only out of place,
//             all_gather both (in place: the input is this rank's slot of the output, ZeRO's
//             layout)
//   time      per iteration the slowest rank's time (max over ranks, as nccl-tests reports), each
//             iteration after a barrier; the Time column is its mean over iterations
// Counters:
//   bytes       the nccl-tests size above
//   algbw_GBps  bytes / time / 1e9 (also bytes_per_second, from SetBytesProcessed)
//   busbw_GBps  algbw * strata::bus_factor(op, n): 2(n-1)/n all_reduce, (n-1)/n reduce_scatter,
//               all_gather and all_to_all, 1 otherwise; comparable across rank counts
//   ranks, in_place (0/1)
//   wrong       output elements (all ranks) that differ from the expected result (with --check=1;
//               a nonzero count also reports the benchmark as an error naming the first one)
// Iterations are fixed (->Iterations) so every rank issues the same collectives: --iters, fewer
// for big sizes so that one benchmark moves at most 1 GiB, after --warmup-iters untimed ones.
// The data check runs after the timed loop: inputs refilled with small integers (sums are exact
// in float), one more call, every output element compared exactly; any mismatch: exit status 1.
// Flags (removed before Google Benchmark parses argv; sizes take K, M, G = 1024^1..3):
//   --min-bytes=8 --max-bytes=256M --step-factor=2 --iters=20 --warmup-iters=5 --check=1
//   --transports=mpi,ucx (default: all built) --ops=all_reduce,... (default: all seven)
// Google Benchmark flags work (--benchmark_filter, --benchmark_format=json, --benchmark_out=FILE,
// written by rank 0 only; its context has `ranks` and `ranks_per_node`, so that `runner
// --calibrate --calibrate-from FILE.json` takes the points into a machine profile), except those
// that would make ranks diverge and deadlock:
// --benchmark_enable_random_interleaving and --benchmark_min_warmup_time are refused.
// Run:
//   mpirun -np 4 build/bin/bench_comm --max-bytes=256M --benchmark_format=json
//   mpirun -np 2 build/bin/bench_comm --ops=all_reduce,all_gather --min-bytes=1M --max-bytes=128M
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_transport.hpp"
#include "comm/transport.hpp"
#include "strata/comm.hpp"
#include "strata/types.hpp"

namespace {

using strata::BufferView;
using strata::CommOp;
using strata::Group;
namespace mpi = strata::mpi;

constexpr double kBytesPerBenchmark = 1 << 30;  // caps iterations of big sizes
constexpr float kPoison = -1.0f;                // what a buffer holds before the call

// Input element i of rank r: small integers, so any sum over ranks is exact in float.
float value(int r, std::size_t i) { return float((i * 7 + std::size_t(r) * 13) % 61); }
float sum_over_ranks(int n, std::size_t i) {
  float s = 0.0f;
  for (int q = 0; q < n; ++q) s += value(q, i);
  return s;
}

std::string number(float x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", double(x));
  return text;
}

bool g_data_wrong = false;  // some check failed (on every rank alike): exit status 1

struct Ctx {
  Group& g;
  strata::CommStream& stream;  // sendrecv's send side
  strata::CommLedger& ledger;
};

// One op. A rank's input holds `unit` elements, or n x unit when in_all (output: out_all); unit is
// bytes / 4, or bytes / 4 / n when either buffer holds all ranks' units.
struct Coll {
  const char* name;
  CommOp op;  // for strata::bus_factor
  bool out_of_place, in_place;
  bool in_all, out_all;
  float (*input)(int r, std::size_t i);
  float (*expected)(int r, int n, std::size_t unit, std::size_t i);  // NaN: not checked
  void (*run)(Ctx& c, BufferView in, BufferView out);
};

const Coll kColls[] = {
    {"all_reduce", CommOp::all_reduce, false, true, false, false, value,
     [](int, int n, std::size_t, std::size_t i) { return sum_over_ranks(n, i); },
     [](Ctx& c, BufferView, BufferView out) { c.g.all_reduce(out); }},
    {"reduce_scatter", CommOp::reduce_scatter, true, false, true, false, value,
     [](int r, int n, std::size_t unit, std::size_t i) { return sum_over_ranks(n, r * unit + i); },
     [](Ctx& c, BufferView in, BufferView out) { c.g.reduce_scatter(in, out); }},
    {"all_gather", CommOp::all_gather, true, true, false, true, value,
     [](int, int, std::size_t unit, std::size_t i) { return value(int(i / unit), i % unit); },
     [](Ctx& c, BufferView in, BufferView out) { c.g.all_gather(in, out); }},
    // Block k of rank r's output is block r of rank k's input.
    {"all_to_all", CommOp::all_to_all, true, false, true, true, value,
     [](int r, int, std::size_t unit, std::size_t i) {
       return value(int(i / unit), std::size_t(r) * unit + i % unit);
     },
     [](Ctx& c, BufferView in, BufferView out) { c.g.all_to_all(in, out); }},
    {"broadcast", CommOp::broadcast, false, true, false, false,
     [](int r, std::size_t i) { return r == 0 ? value(0, i) : kPoison; },
     [](int, int, std::size_t, std::size_t i) { return value(0, i); },
     [](Ctx& c, BufferView, BufferView out) { c.g.broadcast(out, 0); }},
    {"reduce", CommOp::reduce, false, true, false, false, value,
     [](int r, int n, std::size_t, std::size_t i) { return r == 0 ? sum_over_ranks(n, i) : NAN; },
     [](Ctx& c, BufferView, BufferView out) { c.g.reduce(out, 0); }},
    {"sendrecv", CommOp::send, true, false, false, false, value,
     [](int r, int n, std::size_t, std::size_t i) { return value((r + n - 1) % n, i); },
     [](Ctx& c, BufferView in, BufferView out) {
       const int n = c.g.size(), r = c.g.rank();
       strata::Event sent = c.stream.enqueue([&] { c.g.send(in, (r + 1) % n); });
       c.g.recv(out, (r + n - 1) % n);
       sent.wait();
     }},
};

// A rank's buffers for one benchmark: in place, `in` and `out` are views into the same storage.
struct Buffers {
  std::vector<float> a, b;
  BufferView in, out;

  Buffers(const Coll& c, bool in_place, std::size_t unit, int n, int r) {
    const std::size_t in_count = c.in_all ? unit * n : unit,
                      out_count = c.out_all ? unit * n : unit;
    a.resize(in_place ? std::max(in_count, out_count) : in_count);
    b.resize(in_place ? 0 : out_count);
    float* out_base = in_place ? a.data() : b.data();
    in = strata::view(a.data() + (in_place && c.out_all ? r * unit : 0), in_count);
    out = strata::view(out_base + (in_place && c.in_all ? r * unit : 0), out_count);
  }
  void fill(const Coll& c, int r) {
    std::fill(a.begin(), a.end(), kPoison);
    std::fill(b.begin(), b.end(), kPoison);
    float* p = static_cast<float*>(in.data);
    for (std::size_t i = 0; i < in.count; ++i) p[i] = c.input(r, i);
  }
};

void run_coll(benchmark::State& state, Ctx ctx, const Coll& coll, bool in_place, std::size_t unit,
              int warmup, bool check) try {
  const int n = ctx.g.size(), r = ctx.g.rank();
  Buffers buf(coll, in_place, unit, n, r);
  const double bytes = double(std::max(buf.in.count, buf.out.count) * sizeof(float));
  buf.fill(coll, r);
  for (int i = 0; i < warmup; ++i) coll.run(ctx, buf.in, buf.out);
  double total = 0.0;
  for (auto _ : state) {
    mpi::control_barrier();
    const double t0 = strata::now();
    coll.run(ctx, buf.in, buf.out);
    double t = strata::now() - t0;
    mpi::control_allreduce_max(&t, 1);  // the slowest rank's time
    state.SetIterationTime(t);
    total += t;
  }
  const double iters = double(state.iterations()), algbw = bytes * iters / total / 1e9;
  state.SetBytesProcessed(std::int64_t(bytes * iters));
  state.counters["bytes"] =
      benchmark::Counter(bytes, benchmark::Counter::kDefaults, benchmark::Counter::OneK::kIs1024);
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * strata::bus_factor(coll.op, n);
  state.counters["ranks"] = n;
  state.counters["in_place"] = in_place ? 1 : 0;
  ctx.ledger.clear();
  if (!check) return;

  buf.fill(coll, r);
  mpi::control_barrier();
  coll.run(ctx, buf.in, buf.out);
  ctx.ledger.clear();
  double wrong = 0.0;
  std::string first;
  const float* out = static_cast<const float*>(buf.out.data);
  for (std::size_t i = 0; i < buf.out.count; ++i) {
    const float want = coll.expected(r, n, unit, i);
    if (std::isnan(want) || out[i] == want) continue;
    if (wrong++ == 0)
      first = std::string(coll.name) + " data check: rank " + std::to_string(r) + ", element " +
              std::to_string(i) + ": got " + number(out[i]) + " expected " + number(want);
  }
  mpi::control_allreduce_sum(&wrong, 1);  // every rank agrees on the verdict
  const std::vector<std::string> firsts = mpi::control_gather_strings(first);  // rank 0 only
  for (const std::string& f : firsts)
    if (first.empty()) first = f;
  state.counters["wrong"] = wrong;
  if (wrong > 0) {
    g_data_wrong = true;
    if (first.empty()) first = std::string(coll.name) + " data check failed on another rank";
    first += " (" + std::to_string(std::int64_t(wrong)) + " wrong elements over all ranks)";
    state.SkipWithError(first.c_str());
  }
} catch (const std::exception& e) {  // the other ranks would hang in the next collective
  std::fprintf(stderr, "bench_comm: rank %d: %s\n", mpi::world_rank(), e.what());
  mpi::abort_job(1);
}

// Rank != 0: runs every benchmark, prints nothing.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

struct Options {
  std::size_t min_bytes = 8, max_bytes = std::size_t(256) << 20;
  int step_factor = 2, iters = 20, warmup = 5;
  bool check = true;
  std::vector<std::string> transports = strata::transports_built(), ops;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= s.size();) {
    std::size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

long long parse_number(const std::string& flag, const std::string& v, bool sizes) {
  std::size_t used = 0;
  long long x = -1;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
  }
  const std::string suffix = v.substr(std::min(used, v.size()));
  const std::string units = "KMG";
  const std::size_t u = suffix.size() == 1 ? units.find(char(std::toupper(suffix[0]))) : 0;
  if (x < 0 || (!suffix.empty() && (!sizes || u == std::string::npos)))
    throw strata::ConfigError("--" + flag + "=" + v + ": expected a non-negative integer" +
                              (sizes ? " with an optional K, M or G suffix" : ""));
  return suffix.empty() ? x : x << (10 * (u + 1));
}

// Takes this harness's flags out of argv; on ranks other than 0 also --benchmark_out.
Options parse_flags(int* argc, char** argv, bool strip_out) {
  Options o;
  for (const Coll& c : kColls) o.ops.push_back(c.name);
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i], key = arg.substr(0, arg.find('='));
    const bool has_value = key.size() < arg.size();
    const std::string flag = key.substr(std::min<std::size_t>(2, key.size()));
    const std::string v = has_value ? arg.substr(key.size() + 1) : "";
    auto number = [&](bool sizes) { return parse_number(flag, v, sizes); };
    if ((key == "--benchmark_enable_random_interleaving" && v != "false" && v != "0") ||
        (key == "--benchmark_min_warmup_time" && v != "0"))
      throw strata::ConfigError(key +
                                " is not supported: ranks would run different benchmarks "
                                "or iteration counts and deadlock");
    if (!has_value || key.rfind("--", 0) != 0) {
      argv[kept++] = argv[i];
    } else if (flag == "min-bytes") {
      o.min_bytes = number(true);
    } else if (flag == "max-bytes") {
      o.max_bytes = number(true);
    } else if (flag == "step-factor") {
      o.step_factor = int(number(false));
    } else if (flag == "iters") {
      o.iters = int(number(false));
    } else if (flag == "warmup-iters") {
      o.warmup = int(number(false));
    } else if (flag == "check") {
      o.check = number(false) != 0;
    } else if (flag == "transports") {
      o.transports = split_list(v);
    } else if (flag == "ops") {
      o.ops = split_list(v);
    } else if (!(strip_out && key == "--benchmark_out")) {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  if (o.min_bytes < 1 || o.min_bytes > o.max_bytes || o.step_factor < 2 || o.iters < 1)
    throw strata::ConfigError(
        "need 1 <= --min-bytes <= --max-bytes, --step-factor >= 2, --iters >= 1");
  std::string built;
  for (const std::string& t : strata::transports_built()) built += (built.empty() ? "" : ",") + t;
  for (const std::string& t : o.transports)
    if (!strata::transport_built(t))
      throw strata::ConfigError("--transports: '" + t +
                                "' is not built into this binary (built: " + built + ")");
  for (const std::string& op : o.ops)
    if (std::none_of(std::begin(kColls), std::end(kColls),
                     [&](const Coll& c) { return op == c.name; }))
      throw strata::ConfigError("--ops: unknown op '" + op + "'");
  return o;
}

void register_all(const Options& o, const std::vector<std::unique_ptr<Group>>& groups,
                  strata::CommStream& stream, strata::CommLedger& ledger) {
  const int n = mpi::world_size();
  for (std::size_t t = 0; t < groups.size(); ++t)
    for (const std::string& op : o.ops)
      for (const Coll& c : kColls) {
        if (op != c.name) continue;
        for (bool in_place : {false, true}) {
          if (!(in_place ? c.in_place : c.out_of_place)) continue;
          for (std::size_t b = o.min_bytes; b <= o.max_bytes; b *= o.step_factor) {
            const std::size_t unit = b / sizeof(float) / (c.in_all || c.out_all ? n : 1);
            if (unit == 0) continue;
            const double bytes = double(unit * (c.in_all || c.out_all ? n : 1) * sizeof(float));
            const int iters = int(std::clamp(kBytesPerBenchmark / bytes, 1.0, double(o.iters)));
            const std::string name = "BM_Coll/" + o.transports[t] + "/" + c.name +
                                     (in_place ? "/in-place" : "/out-of-place") +
                                     "/bytes:" + std::to_string(b);
            Ctx ctx{*groups[t], stream, ledger};
            const int warmup = std::min(o.warmup, iters);
            const bool check = o.check;
            benchmark::RegisterBenchmark(name.c_str(),
                                         [=, &c](benchmark::State& s) {
                                           run_coll(s, ctx, c, in_place, unit, warmup, check);
                                         })
                ->Iterations(iters)
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
            if (b > o.max_bytes / o.step_factor) break;  // the next size would overflow or pass max
          }
        }
      }
}

}  // namespace

int main(int argc, char** argv) {
  mpi::init(&argc, &argv);
  const int rank = mpi::world_rank();
  int status = 0;
  try {
    Options opt = parse_flags(&argc, argv, rank != 0);
    strata::CommLedger ledger;
    strata::CommStream stream(ledger, "sendrecv");
    std::vector<std::unique_ptr<Group>> groups;  // one group of every rank per transport
    for (const std::string& t : opt.transports)
      groups.push_back(strata::split_group(t, "bench_" + t, 0, rank, &ledger));
    register_all(opt, groups, stream, ledger);
    const int on_host = mpi::node_ranks_with(0);  // rank 0's host: what a profile keys samples by
    benchmark::Initialize(&argc, argv);
    if (argc > 1) {  // the same argv on every rank: all stop
      if (rank == 0) benchmark::ReportUnrecognizedArguments(argc, argv);
      status = 2;
    } else {
      benchmark::AddCustomContext("ranks", std::to_string(mpi::world_size()));
      benchmark::AddCustomContext("ranks_per_node", std::to_string(on_host));
      for (const std::string& t : opt.transports)
        benchmark::AddCustomContext("transport." + t, strata::transport_version(t));
      NullReporter null;
      if (rank == 0)
        benchmark::RunSpecifiedBenchmarks();
      else
        benchmark::RunSpecifiedBenchmarks(&null);
    }
    benchmark::Shutdown();
  } catch (const strata::ConfigError& e) {  // every rank parsed the same flags: all stop here
    if (rank == 0) std::fprintf(stderr, "bench_comm: %s\n", e.what());
    status = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm: rank %d: %s\n", rank, e.what());
    mpi::abort_job(1);
  }
  mpi::finalize();
  return status != 0 ? status : g_data_wrong ? 1 : 0;
}
