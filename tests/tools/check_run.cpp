// check_run: assertions on run files, for the end-to-end tests under ctest.
//   check_run layout FILE RANKS STEPS        every DESIGN field present, shaped and plausible
//   check_run trajectory REF FILE TOL        per-step loss equals REF's within TOL (absolute)
//   check_run predicted FILE                 ledger bytes per op per rank per step == predicted
//                                            (a moe run's all_to_all: summed over the ranks);
//                                            params/grads/optimizer/activations/workspace ==
//                                            predicted
//   check_run status FILE STATUS TEXT        status and a substring of the error
//   check_run calls FILE OP N                every rank makes N calls of OP in every step
//   check_run transfers FILE D2H H2D         /comm d2h and h2d (offload copies): every rank and
//                                            step = predicted, D2H and H2D bytes summed over ranks
//   check_run absent FILE OP...              /comm has no series of any OP
//   check_run less-memory A B TAG            A's peak bytes of TAG (max over ranks) < B's
//   check_run comm-ratio A B OP RATIO [BYTES]  A's bytes of OP = RATIO x B's (+ BYTES), every rank
//                                            and step (BYTES: what A keeps of B's unscaled share)
//   check_run memory-ratio A B TAG RATIO BYTES  A's peak bytes of TAG = RATIO x B's within BYTES,
//                                            rank by rank (same mesh)
//   check_run memory-plus A B TAG TAG_B BYTES  A's peak bytes of TAG = B's of TAG_B + BYTES
//                                            exactly, rank by rank (same mesh)
//   check_run summary FILE NAME VALUE        a /summary measure equals VALUE (relative 1e-12)
//   check_run trace FILE                     /trace: forward and backward intervals on every rank,
//                                            comm events whose bytes add up to /comm per rank and
//                                            op, and the JSON timeline next to the file
//   check_run calibration FILE GROUPS        /calibration: a row per listed group (dp,tp,...), op
//                                            and size; sizes, times and busbw consistent
//   check_run untracked FILE BYTES           on every rank, process peak - runtime baseline -
//                                            tracked peak within +-BYTES, plus the rank's largest
//                                            reduction (MPI's scratch) above
//   check_run make-tokens FILE N VOCAB [FORMAT]  write N tokens (a learnable sequence): FORMAT
//                                            flat (uint16, the default), llmc-v1, llmc-v2
//   check_run device FILE DEVICE [ATTENTION] /config device is DEVICE (and attention ATTENTION);
//                                            a GPU run has a device
//                                            peak per rank of at least its tracked peak
// Prints what it compared; exits 1 on the first mismatch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "results/run_record.hpp"
#include "strata/types.hpp"

using namespace strata;

static int failures = 0;

#define EXPECT(cond, ...)                         \
  do {                                            \
    if (!(cond)) {                                \
      std::fprintf(stderr, "FAIL: " __VA_ARGS__); \
      std::fprintf(stderr, "  [%s]\n", #cond);    \
      ++failures;                                 \
    }                                             \
  } while (0)

static double summary(const RunRecord& r, const std::string& name) {
  for (const Measure& m : r.summary)
    if (m.name == name) return m.value;
  return NAN;
}

static std::string config(const RunRecord& r, const std::string& key) {
  for (const auto& [k, v] : r.config)
    if (k == key) return v;
  return "";
}

static const std::string* provenance(const RunRecord& r, const std::string& key) {
  for (const auto& [k, v] : r.provenance)
    if (k == key) return &v;
  return nullptr;
}

// The libraries' versions: oneDNN always (a version or "not built"). The CUDA runtime, driver,
// cuBLAS and NCCL versions in every run on the CUDA backend and NCCL (runner_emu's too, whose GPU
// is the emulator), where the backend's library registers them. In other runs cuda_version and
// nccl_version say "not loaded ..." where the build has them (STRATA_EXPECT_CUDA / _NCCL from
// tests/e2e/common.cmake: the runner loads libstrata_cuda.so only for a run on the cuda device),
// "not built" where not, and no driver, cuBLAS or GPU entries.
static void library_versions(const RunRecord& r) {
  const bool on_cuda = config(r, "device") == "cuda";
  const bool on_nccl = config(r, "transport") == "nccl";
  const std::string* onednn = provenance(r, "onednn_version");
  EXPECT(onednn && !onednn->empty(), "/provenance onednn_version\n");
  EXPECT(provenance(r, "onednn_bf16_gemm_impl"), "/provenance onednn_bf16_gemm_impl\n");
  auto unused = [](bool built) {
    return std::string(built ? "not loaded (not used by this run)" : "not built");
  };
  const std::string* cuda = provenance(r, "cuda_version");
  EXPECT(cuda && (on_cuda ? cuda->rfind("not ", 0) != 0 : *cuda == unused(STRATA_EXPECT_CUDA)),
         "/provenance cuda_version %s\n", cuda ? cuda->c_str() : "(none)");
  for (const char* key : {"cuda_driver_version", "cublas_version", "gpu_count"}) {
    const std::string* v = provenance(r, key);
    EXPECT(bool(v && !v->empty()) == on_cuda, "/provenance %s %s\n", key,
           v ? v->c_str() : "(none)");
  }
  const std::string* nccl = provenance(r, "nccl_version");
  EXPECT(nccl && (on_nccl ? nccl->rfind("not ", 0) != 0 : *nccl == unused(STRATA_EXPECT_NCCL)),
         "/provenance nccl_version %s\n", nccl ? nccl->c_str() : "(none)");
}

static void layout(const RunRecord& r, int ranks, int steps) {
  EXPECT(r.status == "ok", "status %s (error: %s)\n", r.status.c_str(), r.error.c_str());
  EXPECT(r.ranks == ranks && r.steps == steps, "shape %dx%d, want %dx%d\n", r.ranks, r.steps, ranks,
         steps);
  EXPECT(!r.run_id.empty() && r.created_utc.size() == 20, "run_id/created_utc\n");
  EXPECT(r.command_line.find("runner") != std::string::npos, "command_line %s\n",
         r.command_line.c_str());
  for (const char* key :
       {"plugin", "model", "layers", "hidden", "heads", "seq", "vocab", "micro_batch",
        "global_batch", "steps", "seed", "lr", "nodes", "ranks_per_node", "dp", "precision",
        "reduce_dtype", "tp_comm_dtype", "attention"})
    EXPECT(!config(r, key).empty(), "/config missing %s\n", key);
  bool has_mpi = false;
  for (const auto& [k, v] : r.provenance) has_mpi |= k == "mpi_version" && !v.empty();
  EXPECT(has_mpi, "/provenance mpi_version\n");
  library_versions(r);
  EXPECT(int(r.hostnames.size()) == ranks, "hostnames %zu\n", r.hostnames.size());
  for (const char* m : {"step_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
                        "exposed_comm_s", "bubble_s", "loss", "tokens"}) {
    auto it = r.step_values.find(m);
    EXPECT(it != r.step_values.end() && it->second.size() == std::size_t(ranks) * steps,
           "/steps/%s shape\n", m);
    EXPECT(!r.step_units.at(m).empty(), "/steps/%s unit\n", m);
  }
  for (int i = 0; i < ranks * steps; ++i) {
    double st = r.step_values.at("step_s")[i], fw = r.step_values.at("forward_s")[i],
           bw = r.step_values.at("backward_s")[i], c = r.step_values.at("comm_s")[i],
           ex = r.step_values.at("exposed_comm_s")[i];
    EXPECT(st > 0 && fw > 0 && bw > 0 && fw + bw <= st * 1.0001, "phase times at %d\n", i);
    EXPECT(ex >= 0 && ex <= c + 1e-9 && c <= st * 1.0001, "comm %g exposed %g step %g at %d\n", c,
           ex, st, i);
  }
  // Every rank holds the same (global) loss; the loss falls.
  const auto& loss = r.step_values.at("loss");
  for (int k = 1; k < ranks; ++k)
    for (int s = 0; s < steps; ++s)
      EXPECT(loss[k * steps + s] == loss[s], "loss differs across ranks at step %d\n", s);
  EXPECT(loss[steps - 1] < loss[0] - 0.05, "loss did not fall: %g -> %g\n", loss[0],
         loss[steps - 1]);
  EXPECT(r.memory_tags.size() == 7 && r.peak_bytes.size() == 7u * ranks &&
             r.predicted_bytes.size() == 7 && r.process_peak_bytes.size() == std::size_t(ranks) &&
             r.memory_tags.back() == "offload",
         "/memory shapes\n");
  for (const char* s :
       {"tokens_per_s", "step_s_p50", "step_s_p95", "tflops_per_rank", "mfu", "peak_bytes_max",
        "comm_fraction", "exposed_comm_fraction", "bubble_fraction", "loss_first", "loss_last"})
    EXPECT(std::isfinite(summary(r, s)), "/summary %s\n", s);
  EXPECT(summary(r, "tokens_per_s") > 0 && summary(r, "mfu") > 0 && summary(r, "mfu") < 1.5,
         "tokens/s %g mfu %g\n", summary(r, "tokens_per_s"), summary(r, "mfu"));
  EXPECT(summary(r, "loss_first") == loss[0] && summary(r, "loss_last") == loss[steps - 1],
         "loss summary\n");
  std::printf("layout ok: %d ranks x %d steps, loss %.4f -> %.4f, %.0f tokens/s\n", ranks, steps,
              loss[0], loss[steps - 1], summary(r, "tokens_per_s"));
}

static void trajectory(const RunRecord& ref, const RunRecord& r, double tol) {
  EXPECT(ref.steps == r.steps, "steps %d vs %d\n", ref.steps, r.steps);
  EXPECT(config(ref, "global_batch") == config(r, "global_batch"), "global batch differs\n");
  // A mixture of experts' load-balancing term too (rank 0's row holds the step's global value):
  // the same routing on every layout gives the same term.
  const bool moe = config(ref, "arch") == "moe";
  EXPECT(moe == (r.step_values.count("moe_aux_loss") == 1) &&
             moe == (ref.step_values.count("moe_aux_loss") == 1),
         "/steps/moe_aux_loss in a moe run's file only\n");
  double worst = 0, worst_aux = 0;
  for (int s = 0; s < std::min(ref.steps, r.steps); ++s) {
    double a = ref.step_values.at("loss")[s], b = r.step_values.at("loss")[s];
    worst = std::max(worst, std::fabs(a - b));
    EXPECT(std::fabs(a - b) <= tol, "step %d loss %.7f vs reference %.7f\n", s, b, a);
    if (!moe || !r.step_values.count("moe_aux_loss")) continue;
    a = ref.step_values.at("moe_aux_loss")[s], b = r.step_values.at("moe_aux_loss")[s];
    worst_aux = std::max(worst_aux, std::fabs(a - b));
    EXPECT(a > 0 && std::fabs(a - b) <= tol, "step %d moe_aux_loss %.7f vs reference %.7f\n", s, b,
           a);
  }
  std::printf("trajectory: max |loss - reference| = %.3g over %d steps (tolerance %.3g)", worst,
              r.steps, tol);
  if (moe) std::printf(", max |moe_aux_loss - reference| = %.3g", worst_aux);
  std::printf("\n");
}

static void device(const RunRecord& r, const std::string& want, const std::string& attention) {
  EXPECT(config(r, "device") == want, "device %s, want %s\n", config(r, "device").c_str(),
         want.c_str());
  EXPECT(attention.empty() || config(r, "attention") == attention, "attention %s, want %s\n",
         config(r, "attention").c_str(), attention.c_str());
  if (want == "cpu") {
    EXPECT(r.device_peak_bytes.empty(), "a CPU run with a device peak\n");
    return;
  }
  EXPECT(r.device_peak_bytes.size() == std::size_t(r.ranks) &&
             r.tracked_peak_bytes.size() == std::size_t(r.ranks),
         "device_peak_bytes has %zu entries for %d ranks\n", r.device_peak_bytes.size(), r.ranks);
  for (std::size_t k = 0; k < r.device_peak_bytes.size() && k < r.tracked_peak_bytes.size(); ++k)
    EXPECT(r.tracked_peak_bytes[k] > 0 && r.device_peak_bytes[k] >= r.tracked_peak_bytes[k],
           "rank %zu: device peak %.0f below the tracked peak %.0f\n", k, r.device_peak_bytes[k],
           r.tracked_peak_bytes[k]);
  std::printf("device %s: device peak %.0f bytes on rank 0 (tracked %.0f)\n", want.c_str(),
              r.device_peak_bytes.empty() ? 0.0 : r.device_peak_bytes[0],
              r.tracked_peak_bytes.empty() ? 0.0 : r.tracked_peak_bytes[0]);
}

// Bytes on the wire of one op in two runs of the same shape (e.g. gradients reduced in bf16 and
// in fp32): ratio exact to rounding, on every rank and step, and not zero.
static void comm_ratio(const RunRecord& a, const RunRecord& b, const std::string& op, double ratio,
                       double plus) {
  auto ia = a.comm.find(op), ib = b.comm.find(op);
  EXPECT(ia != a.comm.end() && ib != b.comm.end(), "%s missing in /comm\n", op.c_str());
  if (ia == a.comm.end() || ib == b.comm.end()) return;
  const std::vector<double>&x = ia->second.bytes, &y = ib->second.bytes;
  EXPECT(x.size() == y.size() && !x.empty(), "%s: shapes %zu vs %zu\n", op.c_str(), x.size(),
         y.size());
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    EXPECT(y[i] > 0 && std::fabs(x[i] - (ratio * y[i] + plus)) <= 1e-9 * y[i],
           "%s at %zu: %.0f bytes vs %.0f (want ratio %g + %.0f)\n", op.c_str(), i, x[i], y[i],
           ratio, plus);
  std::printf("%s: %.0f bytes per step vs %.0f (ratio %g + %.0f)\n", op.c_str(),
              x.empty() ? 0 : x[0], y.empty() ? 0 : y[0], ratio, plus);
}

static double tag_peak(const RunRecord& r, int k, const std::string& tag) {
  for (std::size_t t = 0; t < r.memory_tags.size(); ++t)
    if (r.memory_tags[t] == tag) return r.peak_bytes[k * r.memory_tags.size() + t];
  return -1.0;
}

static void memory_plus(const RunRecord& a, const RunRecord& b, const std::string& tag,
                        const std::string& tag_b, double extra) {
  EXPECT(a.ranks == b.ranks && a.ranks > 0, "ranks %d vs %d\n", a.ranks, b.ranks);
  for (int k = 0; k < std::min(a.ranks, b.ranks); ++k) {
    const double x = tag_peak(a, k, tag), y = tag_peak(b, k, tag_b);
    EXPECT(x >= 0 && y > 0 && x == y + extra, "%s on rank %d: %.0f bytes, want %s %.0f + %.0f\n",
           tag.c_str(), k, x, tag_b.c_str(), y, extra);
    std::printf("%s on rank %d: %.0f bytes = %s %.0f + %.0f\n", tag.c_str(), k, x, tag_b.c_str(), y,
                x - y);
  }
}

static void memory_ratio(const RunRecord& a, const RunRecord& b, const std::string& tag,
                         double ratio, double slack) {
  auto peak = [](const RunRecord& r, int k, const std::string& tag) {
    for (std::size_t t = 0; t < r.memory_tags.size(); ++t)
      if (r.memory_tags[t] == tag) return r.peak_bytes[k * r.memory_tags.size() + t];
    return -1.0;
  };
  EXPECT(a.ranks == b.ranks && a.ranks > 0, "ranks %d vs %d\n", a.ranks, b.ranks);
  for (int k = 0; k < std::min(a.ranks, b.ranks); ++k) {
    const double x = peak(a, k, tag), y = peak(b, k, tag);
    EXPECT(x >= 0 && y > 0 && std::fabs(x - ratio * y) <= slack,
           "%s on rank %d: %.0f bytes vs %.0f (want ratio %g within %.0f bytes)\n", tag.c_str(), k,
           x, y, ratio, slack);
    std::printf("%s on rank %d: %.0f bytes vs %.0f (ratio %.6f)\n", tag.c_str(), k, x, y, x / y);
  }
}

static void trace(const RunRecord& r, const std::string& path) {
  EXPECT(!r.trace.empty(), "no /trace\n");
  std::map<std::pair<int, std::string>, double> bytes;  // (rank, op) -> bytes in the trace
  std::vector<int> forward(r.ranks, 0), backward(r.ranks, 0);
  for (const TraceEvent& e : r.trace) {
    EXPECT(e.rank >= 0 && e.rank < r.ranks && e.t1 >= e.t0, "bad event rank %d [%g, %g]\n", e.rank,
           e.t0, e.t1);
    if (e.stream == "compute" && e.kind == "forward") ++forward.at(e.rank);
    if (e.stream == "compute" && e.kind == "backward") ++backward.at(e.rank);
    if (r.comm.count(e.kind)) bytes[{e.rank, e.kind}] += e.bytes;
  }
  for (int k = 0; k < r.ranks; ++k)
    EXPECT(forward[k] > 0 && backward[k] > 0, "rank %d: %d forward, %d backward intervals\n", k,
           forward[k], backward[k]);
  // Each rank's compute intervals of a phase add up to its /steps time of that phase (on a GPU
  // both come from the same pair of events per phase).
  std::map<std::pair<int, std::string>, double> traced_s;
  for (const TraceEvent& e : r.trace)
    if (e.stream == "compute") traced_s[{e.rank, e.kind}] += e.t1 - e.t0;
  for (const char* phase : {"forward", "backward", "optimizer"})
    for (int k = 0; k < r.ranks; ++k) {
      double steps_s = 0;
      for (int s = 0; s < r.steps; ++s)
        steps_s += r.step_values.at(std::string(phase) + "_s")[std::size_t(k) * r.steps + s];
      const double t = traced_s[{k, phase}];
      EXPECT(std::fabs(t - steps_s) <= 1e-6 * steps_s + 1e-9,
             "rank %d %s: trace intervals %.9f s, /steps %.9f s\n", k, phase, t, steps_s);
    }
  for (const auto& [op, cs] : r.comm)
    for (int k = 0; k < r.ranks; ++k) {
      double ledger = 0;
      for (int s = 0; s < r.steps; ++s) ledger += cs.bytes[std::size_t(k) * r.steps + s];
      const double traced = bytes[std::make_pair(k, op)];
      EXPECT(traced == ledger, "rank %d %s: trace %.0f bytes, ledger %.0f\n", k, op.c_str(), traced,
             ledger);
    }
  const std::string json = path.substr(0, path.size() - 3) + ".trace.json";
  EXPECT(std::filesystem::file_size(json) > 0, "%s is empty\n", json.c_str());
  std::printf("trace: %zu intervals on %d ranks; comm bytes equal the ledger; %s\n", r.trace.size(),
              r.ranks, json.c_str());
}

// A moe run's all_to_all (expert parallelism): a rank sends its own rows out and what it received
// back, so its bytes follow the routing; over the ranks each step they are the prediction's sum
// (every row out comes back), which the prediction states at a uniform routing per rank.
static bool routed_all_to_all(const RunRecord& r, const std::string& op, const CommSeries& cs) {
  if (op != "all_to_all" || config(r, "arch") != "moe") return false;
  EXPECT(cs.predicted_bytes_per_rank.size() == std::size_t(r.ranks), "%s predicted per rank\n",
         op.c_str());
  if (cs.predicted_bytes_per_rank.size() != std::size_t(r.ranks)) return true;
  double want = 0;
  for (double p : cs.predicted_bytes_per_rank) want += p;
  for (int s = 0; s < r.steps; ++s) {
    double total = 0;
    for (int k = 0; k < r.ranks; ++k) total += cs.bytes[std::size_t(k) * r.steps + s];
    EXPECT(total == want, "%s step %d: %.0f bytes over the ranks, predicted %.0f\n", op.c_str(), s,
           total, want);
  }
  std::printf("comm %-14s %.0f bytes per step over the ranks = predicted (per rank: the routing)\n",
              op.c_str(), want);
  return true;
}

static void predicted(const RunRecord& r) {
  for (const auto& [op, cs] : r.comm) {
    if (routed_all_to_all(r, op, cs)) continue;
    for (std::size_t i = 0; i < cs.bytes.size(); ++i) {
      const std::size_t rank = i / r.steps;
      const double p = cs.predicted_bytes_per_rank.empty() ? cs.predicted_bytes_per_step
                                                           : cs.predicted_bytes_per_rank.at(rank);
      EXPECT(cs.bytes[i] == p, "%s: rank %zu step %zu moved %.0f bytes, predicted %.0f\n",
             op.c_str(), rank, i % r.steps, cs.bytes[i], p);
    }
    for (std::size_t i = 0; i < cs.bytes.size(); ++i)
      if (cs.bytes[i] > 0 && cs.time_s[i] > 0) {
        EXPECT(std::fabs(cs.algbw[i] - cs.bytes[i] / cs.time_s[i]) <= 1e-9 * cs.algbw[i],
               "%s algbw\n", op.c_str());
        EXPECT(cs.busbw[i] > 0 && cs.busbw[i] <= 2 * cs.algbw[i], "%s busbw %g algbw %g\n",
               op.c_str(), cs.busbw[i], cs.algbw[i]);
      }
    std::printf("comm %-14s %.0f bytes per step on the busiest rank = predicted, every rank\n",
                op.c_str(), cs.predicted_bytes_per_step);
  }
  for (std::size_t t = 0; t < r.memory_tags.size(); ++t)
    for (int k = 0; k < r.ranks; ++k) {
      double m = r.peak_bytes[k * r.memory_tags.size() + t];
      double p = r.predicted_bytes_per_rank[k * r.memory_tags.size() + t];
      EXPECT(m == p, "memory %s rank %d: measured %.0f, predicted %.0f\n", r.memory_tags[t].c_str(),
             k, m, p);
    }
  std::printf("memory: every tag on every rank equals its prediction\n");
}

// CPU offload's device<->host copies as /comm ops read back from the file: d2h and h2d on every
// rank and step, with calls, time and bytes equal to predict()'s; summed over the ranks, `d2h` and
// `h2d` bytes per step (a number known from the model: each element has one owner per replica).
// Their time is inside comm_s; exposed comm is what the compute thread waited of it. With --trace,
// every copy must be on a comm stream, not the compute thread.
static void transfers(const RunRecord& r, double d2h, double h2d) {
  std::vector<double> copy_s(std::size_t(r.ranks) * r.steps, 0.0);
  for (const auto& [op, want] : {std::pair<std::string, double>{"d2h", d2h}, {"h2d", h2d}}) {
    auto it = r.comm.find(op);
    EXPECT(it != r.comm.end(), "no %s in /comm\n", op.c_str());
    if (it == r.comm.end()) return;
    const CommSeries& cs = it->second;
    EXPECT(cs.predicted_bytes_per_rank.size() == std::size_t(r.ranks), "%s predicted per rank\n",
           op.c_str());
    if (failures) return;
    for (int s = 0; s < r.steps; ++s) {
      double total = 0;
      for (int k = 0; k < r.ranks; ++k) {
        const std::size_t i = std::size_t(k) * r.steps + s;
        total += cs.bytes[i];
        copy_s[i] += cs.time_s[i];
        EXPECT(cs.calls[i] > 0 && cs.time_s[i] > 0, "%s rank %d step %d: %.0f calls, %g s\n",
               op.c_str(), k, s, cs.calls[i], cs.time_s[i]);
        EXPECT(cs.bytes[i] == cs.predicted_bytes_per_rank[k],
               "%s rank %d step %d: %.0f bytes, predicted %.0f\n", op.c_str(), k, s, cs.bytes[i],
               cs.predicted_bytes_per_rank[k]);
      }
      EXPECT(total == want, "%s step %d: %.0f bytes over the ranks, want %.0f\n", op.c_str(), s,
             total, want);
    }
    std::printf("%s: %.0f bytes per step over %d ranks = predicted per rank, every step\n",
                op.c_str(), want, r.ranks);
  }
  const std::vector<double>&comm = r.step_values.at("comm_s"),
        &exposed = r.step_values.at("exposed_comm_s");
  for (std::size_t i = 0; i < copy_s.size(); ++i) {
    EXPECT(comm[i] >= copy_s[i] * (1 - 1e-9), "comm_s %g < copies %g at %zu\n", comm[i], copy_s[i],
           i);
    EXPECT(exposed[i] <= comm[i] * (1 + 1e-9) + 1e-6, "exposed_comm_s %g > comm_s %g at %zu\n",
           exposed[i], comm[i], i);
  }
  // The copies run on a comm stream of their own (overlapping the host's AdamW steps), never on
  // the compute thread: visible in --trace, where each interval names its stream.
  int traced = 0;
  for (const TraceEvent& e : r.trace)
    if (e.kind == "d2h" || e.kind == "h2d") {
      ++traced;
      EXPECT(e.stream != "compute", "rank %d: a %s on the compute thread\n", e.rank,
             e.kind.c_str());
    }
  if (!r.trace.empty()) {
    EXPECT(traced > 0, "no d2h or h2d in /trace\n");
    std::printf("trace: %d copies, none on the compute thread\n", traced);
  }
}

// The most bytes one reduction (all_reduce, reduce_scatter, reduce) moved on rank k in one step: an
// upper bound of any single call, and so of the scratch the MPI library takes inside one to
// receive partial sums beside the caller's buffer (measured: Open MPI's ring all-reduce takes
// bytes / ranks, its reduce-scatter on two ranks (a reduce, then a scatter) the whole input on
// rank 0). all_gather, broadcast and point-to-point calls receive into the caller's buffer.
static double largest_reduction_step_bytes(const RunRecord& r, std::size_t k) {
  double largest = 0;
  for (const auto& [op, cs] : r.comm) {
    if (op != "all_reduce" && op != "reduce_scatter" && op != "reduce") continue;
    for (int s = 0; s < r.steps; ++s)
      largest = std::max(largest, cs.bytes.at(k * std::size_t(r.steps) + std::size_t(s)));
  }
  return largest;
}

// Memory the process used beyond its runtime baseline and the ledger's peak, per rank: what the
// ledger does not see. The bound is max_bytes plus the rank's largest reduction (the MPI
// library's scratch), twice that over gloo: its transport composes a reduce-scatter as PyTorch's
// ProcessGroupGloo does, an all-reduce of a copy of the input (kept for the next call), and gloo's
// ring all-reduce has buffers of its own (measured 2026-12-07, small model on 2 ranks: ddp 2.3-4.3
// MiB, zero2 18.4-20.2, zero3 7.3-7.6 beside a largest reduction of 16.2). Negative values must
// stay within max_bytes too: the baseline or the ledger would then count something twice.
static void untracked(const RunRecord& r, double max_bytes) {
  const std::size_t ranks = std::size_t(r.ranks), tags = r.memory_tags.size();
  EXPECT(r.baseline_bytes.size() == ranks && r.tracked_peak_bytes.size() == ranks &&
             r.process_peak_bytes.size() == ranks && r.peak_bytes.size() == ranks * tags,
         "/memory: %zu baseline, %zu tracked peak, %zu process peak values for %zu ranks\n",
         r.baseline_bytes.size(), r.tracked_peak_bytes.size(), r.process_peak_bytes.size(), ranks);
  if (failures) return;
  const double mib = 1 << 20;
  for (std::size_t k = 0; k < ranks; ++k) {
    const double peak = r.process_peak_bytes[k], base = r.baseline_bytes[k];
    const double tracked = r.tracked_peak_bytes[k];
    double tag_sum = 0;
    for (std::size_t t = 0; t < tags; ++t) tag_sum += r.peak_bytes[k * tags + t];
    const double copies = config(r, "transport") == "gloo" ? 2 : 1;
    const double extra = peak - base - tracked,
                 scratch = copies * largest_reduction_step_bytes(r, k);
    std::printf(
        "rank %zu: process peak %.2f MiB = baseline %.2f + tracked peak %.2f (tag peaks %.2f) + "
        "untracked %.2f MiB; bound %.2f + scratch %.2f MiB\n",
        k, peak / mib, base / mib, tracked / mib, tag_sum / mib, extra / mib, max_bytes / mib,
        scratch / mib);
    EXPECT(base > 0 && tracked > 0 && tracked <= tag_sum,
           "rank %zu: baseline %.0f, tracked peak %.0f, tag peaks %.0f bytes\n", k, base, tracked,
           tag_sum);
    EXPECT(extra <= max_bytes + scratch && extra >= -max_bytes,
           "rank %zu: untracked %.2f MiB outside [-%.2f, %.2f + %.2f] MiB\n", k, extra / mib,
           max_bytes / mib, max_bytes / mib, scratch / mib);
  }
}

// --calibrate-comm: one row per (group, op, size) for each listed group, in the core's order, with
// nccl-tests sizes divisible by the group, positive times and busbw = algbw x the bus factor.
static void calibration(const RunRecord& r, const std::string& groups_csv) {
  std::vector<std::string> groups;
  for (std::size_t a = 0, b; a <= groups_csv.size(); a = b + 1) {
    b = groups_csv.find(',', a);
    if (b == std::string::npos) b = groups_csv.size();
    groups.push_back(groups_csv.substr(a, b - a));
  }
  const char* ops[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"};
  const double sizes[] = {64 << 10, 1 << 20, 16 << 20};
  const std::size_t rows = groups.size() * std::size(ops) * std::size(sizes);
  EXPECT(r.calibration.size() == rows, "%zu calibration rows, want %zu\n", r.calibration.size(),
         rows);
  std::size_t i = 0;
  for (const std::string& g : groups)
    for (const char* op : ops)
      for (double size : sizes) {
        if (i >= r.calibration.size()) return;
        const CalibrationPoint& p = r.calibration[i++];
        EXPECT(p.group == g && p.op == op, "row %zu is %s/%s, want %s/%s\n", i - 1, p.group.c_str(),
               p.op.c_str(), g.c_str(), op);
        const double elems = p.bytes / 4;
        EXPECT(p.ranks >= 2 && p.bytes <= size && p.bytes > size - 4 * p.ranks &&
                   std::fmod(elems, p.ranks) == 0,
               "row %zu: %.0f bytes on %.0f ranks for size %.0f\n", i - 1, p.bytes, p.ranks, size);
        const double factor = std::string(op) == "all_reduce" ? 2.0 * (p.ranks - 1) / p.ranks
                                                              : (p.ranks - 1) / p.ranks;
        EXPECT(p.time_s > 0 && std::fabs(p.algbw - p.bytes / p.time_s) <= 1e-9 * p.algbw &&
                   std::fabs(p.busbw - p.algbw * factor) <= 1e-9 * p.busbw,
               "row %zu: time %g algbw %g busbw %g\n", i - 1, p.time_s, p.algbw, p.busbw);
      }
  std::printf("calibration: %zu rows over %s, busbw %.3f..%.3f GB/s\n", r.calibration.size(),
              groups_csv.c_str(), r.calibration.empty() ? 0.0 : r.calibration.front().busbw / 1e9,
              r.calibration.empty() ? 0.0 : r.calibration.back().busbw / 1e9);
}

// MFU against the node's peak: at most 1 on every rank, the peak's source recorded, and each of
// the node's `node_ranks` ranks holding an equal share of the node's peak.
static void mfu(const RunRecord& r, const std::string& source, int node_ranks) {
  const double mfu = summary(r, "mfu"), rank_max = summary(r, "mfu_rank_max");
  EXPECT(mfu > 0 && mfu <= 1, "/summary mfu %g, want (0, 1]\n", mfu);
  EXPECT(rank_max >= mfu && rank_max <= 1, "/summary mfu_rank_max %g, want [mfu, 1]\n", rank_max);
  const std::string* got = provenance(r, "peak_flops_source");
  EXPECT(got && *got == source, "/provenance peak_flops_source '%s', want '%s'\n",
         got ? got->c_str() : "(absent)", source.c_str());
  const std::string* detail = provenance(r, "peak_flops_detail");
  const std::string share = ", " + std::to_string(node_ranks) + " rank(s) on the node)";
  EXPECT(detail && detail->find(share) != std::string::npos,
         "/provenance peak_flops_detail '%s' "
         "lacks '%s'\n",
         detail ? detail->c_str() : "(absent)", share.c_str());
  if (got && detail)
    std::printf("mfu %.4f (max over ranks %.4f) of %.3g FLOP/s per rank, peak %s: %s\n", mfu,
                rank_max, summary(r, "peak_flops_per_rank"), got->c_str(), detail->c_str());
}

// None of the ops `ops` in the run's /comm.
static void absent(const RunRecord& r, const char* path, const std::vector<std::string>& ops) {
  for (const std::string& op : ops)
    EXPECT(!r.comm.count(op), "%s in /comm of %s\n", op.c_str(), path);
  std::printf("/comm has none of the %zu op(s)\n", ops.size());
}

// The run's status, and its error message containing `error`.
static void status(const RunRecord& r, const std::string& want, const std::string& error) {
  EXPECT(r.status == want, "status %s, want %s\n", r.status.c_str(), want.c_str());
  EXPECT(r.error.find(error) != std::string::npos, "error '%s' lacks '%s'\n", r.error.c_str(),
         error.c_str());
  std::printf("status %s: %s\n", r.status.c_str(), r.error.c_str());
}

// `op` called `want` times per rank in every step.
static void calls(const RunRecord& r, const std::string& op, double want) {
  auto it = r.comm.find(op);
  EXPECT(it != r.comm.end(), "no %s in /comm\n", op.c_str());
  if (it != r.comm.end())
    for (std::size_t i = 0; i < it->second.calls.size(); ++i)
      EXPECT(it->second.calls[i] == want, "%s calls %.0f at %zu, want %.0f\n", op.c_str(),
             it->second.calls[i], i, want);
  std::printf("%s: %.0f calls per rank per step\n", op.c_str(), want);
}

// Run a's peak of tag `tag` (its largest rank's) below run b's.
static void less_memory(const RunRecord& a, const RunRecord& b, const std::string& tag) {
  auto peak = [&](const RunRecord& r) {
    double m = 0;
    for (std::size_t t = 0; t < r.memory_tags.size(); ++t)
      if (r.memory_tags[t] == tag)
        for (int k = 0; k < r.ranks; ++k)
          m = std::max(m, r.peak_bytes[k * r.memory_tags.size() + t]);
    return m;
  };
  EXPECT(peak(a) > 0 && peak(a) < peak(b), "%s: %.0f is not less than %.0f\n", tag.c_str(), peak(a),
         peak(b));
  std::printf("%s: %.0f < %.0f bytes\n", tag.c_str(), peak(a), peak(b));
}

// /summary `key` equal to `want` within 1e-12.
static void summary_equals(const RunRecord& r, const std::string& key, double want) {
  const double got = summary(r, key);
  EXPECT(std::fabs(got - want) <= 1e-12 * std::fabs(want), "%s = %.17g, want %.17g\n", key.c_str(),
         got, want);
  std::printf("%s = %.6g\n", key.c_str(), got);
}

// A learnable uint16 token file of n tokens below `vocab`: token t+1 = (5 * token t + 3) mod V,
// with every 7th token random-ish.
// The same learnable sequence in any format: flat uint16, or llm.c's header (256 int32: magic
// 20240520, version, count) then version 1's uint16 or version 2's uint32 tokens.
static void make_tokens(const char* path, long n, long vocab, const std::string& format) {
  const int version = format == "llmc-v1" ? 1 : format == "llmc-v2" ? 2 : 0;
  if (version == 0 && format != "flat") throw Error("make-tokens: format flat|llmc-v1|llmc-v2");
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  FILE* f = std::fopen(path, "wb");
  if (!f) throw Error(std::string("cannot write ") + path);
  if (version > 0) {
    std::int32_t header[256] = {20240520, version, std::int32_t(n)};
    std::fwrite(header, sizeof header, 1, f);
  }
  std::uint32_t tok = 1;
  for (long i = 0; i < n; ++i) {
    const std::uint16_t narrow = std::uint16_t(tok);
    if (version == 2)
      std::fwrite(&tok, 4, 1, f);
    else
      std::fwrite(&narrow, 2, 1, f);
    tok = std::uint32_t(i % 7 == 6 ? (i * 2654435761u >> 7) % vocab : (5 * tok + 3) % vocab);
  }
  std::fclose(f);
}

// One command of the command line; false when none matches.
static bool run_command(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  auto run = [&](int i) { return read_run_file(argv[i]); };
  if (cmd == "layout" && argc == 5)
    layout(run(2), std::atoi(argv[3]), std::atoi(argv[4]));
  else if (cmd == "trajectory" && argc == 5)
    trajectory(run(2), run(3), std::atof(argv[4]));
  else if (cmd == "trace" && argc == 3)
    trace(run(2), argv[2]);
  else if (cmd == "calibration" && argc == 4)
    calibration(run(2), argv[3]);
  else if (cmd == "untracked" && argc == 4)
    untracked(run(2), std::atof(argv[3]));
  else if (cmd == "device" && (argc == 4 || argc == 5))
    device(run(2), argv[3], argc == 5 ? argv[4] : "");
  else if (cmd == "transfers" && argc == 5)
    transfers(run(2), std::atof(argv[3]), std::atof(argv[4]));
  else if (cmd == "absent" && argc >= 4)
    absent(run(2), argv[2], std::vector<std::string>(argv + 3, argv + argc));
  else if (cmd == "predicted" && argc == 3)
    predicted(run(2));
  else if (cmd == "status" && argc == 5)
    status(run(2), argv[3], argv[4]);
  else if (cmd == "calls" && argc == 5)
    calls(run(2), argv[3], std::atof(argv[4]));
  else if (cmd == "less-memory" && argc == 5)
    less_memory(run(2), run(3), argv[4]);
  else if (cmd == "comm-ratio" && (argc == 6 || argc == 7))
    comm_ratio(run(2), run(3), argv[4], std::atof(argv[5]), argc == 7 ? std::atof(argv[6]) : 0.0);
  else if (cmd == "memory-ratio" && argc == 7)
    memory_ratio(run(2), run(3), argv[4], std::atof(argv[5]), std::atof(argv[6]));
  else if (cmd == "mfu" && argc == 5)
    mfu(run(2), argv[3], std::atoi(argv[4]));
  else if (cmd == "memory-plus" && argc == 7)
    memory_plus(run(2), run(3), argv[4], argv[5], std::atof(argv[6]));
  else if (cmd == "summary" && argc == 5)
    summary_equals(run(2), argv[3], std::atof(argv[4]));
  else if (cmd == "make-tokens" && (argc == 5 || argc == 6))
    make_tokens(argv[2], std::atol(argv[3]), std::atol(argv[4]), argc == 6 ? argv[5] : "flat");
  else
    return false;
  return true;
}

int main(int argc, char** argv) {
  try {
    if (!run_command(argc, argv)) {
      std::fprintf(stderr, "usage: check_run layout|trajectory|predicted|status ...\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
}
