// runner --calibrate (calibrate_machine.hpp).
#include "predict/calibrate_machine.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "calibrate.hpp"
#include "comm/mpi_transport.hpp"
#include "core_context.hpp"
#include "node_peak.hpp"
#include "predict/predictor.hpp"
#include "predict/profile.hpp"
#include "predict/published_profile.hpp"
#include "provenance.hpp"
#include "strata/data_parallel.hpp"

namespace strata {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Median seconds of each unit's forward and backward through `model` (its recompute mode), after
// one warm-up pass; blocks pooled (they have one shape). Order: embedding, block, head (fwd, bwd).
std::array<double, 6> time_passes(Model& model, Replica& r, const MicroBatch& mb, float scale) {
  const int units = model.layout().num_units();
  std::map<int, std::vector<double>> fwd, bwd;  // key: 0 embedding, 1 block, 2 head
  auto kind = [&](int u) { return u == 0 ? 0 : u == units - 1 ? 2 : 1; };
  for (int it = -1; it < kComputeIterations; ++it) {
    for (int u = 0; u < units; ++u) {
      const double t0 = now();
      model.forward(u, r.param_ptrs(), mb);
      if (it >= 0) fwd[kind(u)].push_back(now() - t0);
    }
    for (int u = units - 1; u >= 0; --u) {
      const double t0 = now();
      model.backward(u, r.param_ptrs(), r.grad_ptrs(), mb, scale);
      if (it >= 0) bwd[kind(u)].push_back(now() - t0);
    }
  }
  return {median(fwd[0]), median(bwd[0]), median(fwd[1]),
          median(bwd[1]), median(fwd[2]), median(bwd[2])};
}

// Seconds per byte of a new buffer in the sharded engine: each unit's gathered parameters are
// allocated (zeroed), written, used by the unit's pass and released (above the mmap threshold the
// pages go back to the system and fault in again next time). Timed in place, as the difference
// between the unit's forward with and without its buffer, paired per iteration: the page faults,
// the release and the caches the pass no longer finds warm.
double time_fresh_buffers(Model& model, Replica& r, MemoryLedger& memory, const MicroBatch& mb) {
  const ParamLayout& layout = model.layout();
  const auto params = r.param_ptrs();
  std::vector<double> per_byte;
  for (int it = -1; it < kComputeIterations; ++it) {
    double with = 0, without = 0, bytes = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      const UnitInfo& unit = layout.units()[std::size_t(u)];
      double t0 = now();
      {
        DeviceBuffer fresh(memory, MemTag::workspace, r.params().dtype, unit.count);
        copy_across(fresh.view(), slice(r.params(), unit.offset, unit.count));
        model.forward(u, params, mb);
      }
      with += now() - t0;
      t0 = now();
      model.forward(u, params, mb);
      without += now() - t0;
      bytes += double(unit.count * dtype_size(r.params().dtype));
    }
    if (it >= 0) per_byte.push_back(std::max(0.0, with - without) / bytes);
  }
  return median(per_byte);
}

// This rank's compute entry (before the max over ranks).
ComputeEntry measure_compute(const RunConfig& config, CoreContext& ctx, int threads) {
  Replica r(ctx);
  const MicroBatch mb = ctx.micro_batch(0, 0);
  const float scale = float(grad_scale(ctx));
  const DType dtype = config.train.precision.param;
  ComputeEntry e;
  e.model = config.model;
  e.micro_batch = config.train.micro_batch;
  e.device = device_name(config.device_kind());
  e.precision = profile_precision(config.train);
  e.threads = threads;
  e.ranks_per_node = config.mesh.ranks_per_node;
  Model plain(config.model, e.micro_batch, ctx.memory(), Recompute::none, dtype);
  const auto p = time_passes(plain, r, mb, scale);
  e.embedding_forward_s = p[0], e.embedding_backward_s = p[1];
  e.block_forward_s = p[2], e.block_backward_s = p[3];
  e.head_forward_s = p[4], e.head_backward_s = p[5];
  for (Recompute mode : {Recompute::full, Recompute::selective}) {
    Model m(config.model, e.micro_batch, ctx.memory(), mode, dtype);
    const double extra = std::max(0.0, time_passes(m, r, mb, scale)[3] - p[3]);
    (mode == Recompute::full ? e.block_recompute_full_s : e.block_recompute_selective_s) = extra;
  }
  AdamW adamw = make_adamw(ctx, 0, r.size());
  std::vector<double> times;
  for (int it = -1; it < kComputeIterations; ++it) {
    const double t0 = now();  // the norm and the update, as the strategies' optimizer phase does
    const double norm = std::sqrt(ctx.ops().sum_of_squares(r.grads()));
    adamw.step(r.params(), r.grads(), it + 2, clip_scale(norm, config.train.grad_clip));
    if (it >= 0) times.push_back(now() - t0);
  }
  e.optimizer_s_per_param = median(times) / double(r.size());
  times.clear();
  e.fresh_memory_s_per_byte = time_fresh_buffers(plain, r, ctx.memory(), mb);
  return e;
}

// The slowest rank's times: every field of the entry reduced with max over the world.
void max_over_ranks(ComputeEntry& e) {
  double* fields[] = {&e.embedding_forward_s,    &e.embedding_backward_s,
                      &e.block_forward_s,        &e.block_backward_s,
                      &e.head_forward_s,         &e.head_backward_s,
                      &e.block_recompute_full_s, &e.block_recompute_selective_s,
                      &e.optimizer_s_per_param,  &e.fresh_memory_s_per_byte};
  std::vector<double> v;
  for (double* f : fields) v.push_back(*f);
  mpi::control_allreduce_max(v.data(), int(v.size()));
  for (std::size_t i = 0; i < v.size(); ++i) *fields[i] = v[i];
}

void print_profile(const MachineProfile& p, const ComputeEntry& e, const std::string& path) {
  std::printf("calibrate: %s, micro-batch %d, %s %s, %d thread(s) x %d rank(s) per node (ms):\n",
              e.model.preset.c_str(), e.micro_batch, e.device.c_str(), e.precision.c_str(),
              e.threads, e.ranks_per_node);
  std::printf(
      "  embedding fwd %.3f bwd %.3f | block fwd %.3f bwd %.3f (+%.3f full, +%.3f "
      "selective) | head fwd %.3f bwd %.3f | AdamW %.3f ns/param | new memory %.2f GB/s\n",
      e.embedding_forward_s * 1e3, e.embedding_backward_s * 1e3, e.block_forward_s * 1e3,
      e.block_backward_s * 1e3, e.block_recompute_full_s * 1e3, e.block_recompute_selective_s * 1e3,
      e.head_forward_s * 1e3, e.head_backward_s * 1e3, e.optimizer_s_per_param * 1e9,
      e.fresh_memory_s_per_byte > 0 ? 1e-9 / e.fresh_memory_s_per_byte : 0.0);
  for (const CommFit& f : p.comm)
    std::printf(
        "  %-14s %2d rank(s), %2d per node: alpha %8.1f us, beta %8.3f GB/s (%d points, "
        "max error %.0f%%)\n",
        f.op.c_str(), f.ranks, f.ranks_per_node, f.alpha_s * 1e6, f.beta_bytes_per_s / 1e9,
        f.points, 100 * f.max_rel_error);
  std::printf("calibrate: profile %s: %zu compute entries, %zu comm fits\n", path.c_str(),
              p.compute.size(), p.comm.size());
}

// Merges `more` into the profile file of --profile (created if missing) and writes it.
MachineProfile merge_into_file(const RunConfig& config, const MachineProfile& more) {
  MachineProfile profile;
  if (std::filesystem::exists(config.profile)) profile = read_profile(config.profile);
  if (profile.description.empty()) profile.description = more.description;
  merge_profile(profile, more);
  write_profile(profile, config.profile);
  return profile;
}

}  // namespace

void calibrate_from_runs(const RunConfig& config) {
  const auto& from = config.calibrate_from;
  const auto is_table = [](const std::string& path) { return path.ends_with(".txt"); };
  if (std::any_of(from.begin(), from.end(), is_table)) {  // published figures: a new profile
    if (from.size() != 1)
      throw ConfigError(
          "--calibrate-from: a published-figures table (.txt) makes a profile alone; "
          "give it once, without run files");
    MachineProfile profile = profile_from_table(from.front());
    profile.created_utc = utc_timestamp();
    write_profile(profile, config.profile);
    std::printf(
        "calibrate: profile %s from published figures %s: %zu compute entry, %zu comm "
        "fits (replaces the file)\n",
        config.profile.c_str(), from.front().c_str(), profile.compute.size(), profile.comm.size());
    return;
  }
  MachineProfile more;
  more.created_utc = utc_timestamp();
  more.description = "runner --calibrate-from run files";
  for (const std::string& path : config.calibrate_from) {
    const std::vector<CommSample> s = samples_from_run(read_run_file(path));
    if (s.empty())
      throw ConfigError("--calibrate-from " + path +
                        ": no /calibration in this run file (run it with --calibrate-comm)");
    more.samples.insert(more.samples.end(), s.begin(), s.end());
    std::printf("calibrate: %zu comm sample(s) from %s\n", s.size(), path.c_str());
  }
  const MachineProfile profile = merge_into_file(config, more);
  std::printf("calibrate: profile %s: %zu compute entries, %zu comm fits\n", config.profile.c_str(),
              profile.compute.size(), profile.comm.size());
}

void calibrate_machine(const RunConfig& config, int threads_per_rank) {
  if (config.device_kind() != Device::cpu)
    throw ConfigError("--calibrate: measures the CPU backend only in this version");
  const PeakFlops peak = resolve_peak_flops(config);  // collective: the node's, cached
  CommLedger ledger;
  CoreContext ctx(config, ledger);
  ComputeEntry entry = measure_compute(config, ctx, threads_per_rank);
  max_over_ranks(entry);
  const std::vector<std::size_t> sizes = {4u << 10, 64u << 10, 1u << 20, 16u << 20};
  RunRecord as_run;  // the points, with the mesh they were measured on (samples_from_run)
  as_run.ranks = mpi::world_size();
  as_run.config = config.resolved(&as_run.config_types);
  as_run.calibration = calibrate_comm(ctx, ledger, sizes, kCalibrationIterations);
  if (mpi::world_rank() != 0) return;

  MachineProfile more;
  more.created_utc = utc_timestamp();
  more.host = mpi::processor_name();
  more.node_peak_flops = peak.node;
  more.compute.push_back(entry);
  more.samples = samples_from_run(as_run);
  more.description = "runner --calibrate on " + more.host + " (" + config.transport + ")";
  const MachineProfile profile = merge_into_file(config, more);
  print_profile(profile, entry, config.profile);
}

}  // namespace strata
