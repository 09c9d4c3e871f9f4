// runner --calibrate (calibrate_machine.hpp).
#include "predict/calibrate_machine.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <tuple>

#include "backends/backend.hpp"
#include "backends/kernels.hpp"
#include "comm/mpi_transport.hpp"
#include "predict/gemm_model.hpp"
#include "predict/predictor.hpp"
#include "predict/profile.hpp"
#include "predict/profile_from_runs.hpp"
#include "predict/published_profile.hpp"
#include "provenance/node_peak.hpp"
#include "provenance/provenance.hpp"
#include "run/calibrate.hpp"
#include "run/core_context.hpp"
#include "run/summary.hpp"
#include "strata/data_parallel.hpp"
#include "strata/stage_model.hpp"
#include "strata/tensor_parallel.hpp"

namespace strata {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The time once everything enqueued so far has finished: a GPU runs kernels after the host has
// enqueued them (the CPU backend computes in the call: a no-op there).
double settled_now(CoreContext& ctx) {
  ctx.synchronize_streams();
  return now();
}

// Median seconds of each unit's forward and backward through `model` (its recompute mode), after
// one warm-up pass; blocks pooled (they have one shape). Order: embedding, block, head (fwd, bwd).
// `after_backward` (when set) runs after each pass's backwards with the slot and whether the pass
// is timed (not the warm-up).
std::array<double, 6> time_passes(
    CoreContext& ctx, StageModel& model, Replica& r, const MicroBatch& mb, float scale,
    const std::function<void(int slot, bool timed)>& after_backward = {}) {
  const int units = ctx.model_spec().layers + 2, slot = model.acquire_slot();
  std::map<int, std::vector<double>> fwd, bwd;  // key: 0 embedding, 1 block, 2 head
  auto kind = [&](int u) { return u == 0 ? 0 : u == units - 1 ? 2 : 1; };
  for (int it = -1; it < kComputeIterations; ++it) {
    for (int u = 0; u < units; ++u) {
      const double t0 = settled_now(ctx);
      model.forward(slot, u, r.param_ptrs(), mb, nullptr);
      if (it >= 0) fwd[kind(u)].push_back(settled_now(ctx) - t0);
    }
    for (int u = units - 1; u >= 0; --u) {
      const double t0 = settled_now(ctx);
      model.backward(slot, u, r.param_ptrs(), r.grad_ptrs(), nullptr, scale);
      if (it >= 0) bwd[kind(u)].push_back(settled_now(ctx) - t0);
    }
    if (after_backward) after_backward(slot, it >= 0);
  }
  model.release_slot(slot);
  return {median(fwd[0]), median(bwd[0]), median(fwd[1]),
          median(bwd[1]), median(fwd[2]), median(bwd[2])};
}

// A block's two passes of a split backward (zero-bubble pipelines, StageModel's split_backward):
// time_passes' block backward (the input-gradient pass), and after each pass's backwards the
// slot's deferred weight gradients (backward_weights, every block's at once) over the blocks.
std::pair<double, double> time_split_backward(CoreContext& ctx, const RunConfig& config, Replica& r,
                                              const MicroBatch& mb, float scale) {
  const ModelSpec& m = config.model;
  StageModel split(m, config.train.micro_batch, whole_model(m), ctx.memory(), Recompute::none,
                   config.train.precision.param, DType::f32, true);
  std::vector<double> weight;
  const auto p = time_passes(ctx, split, r, mb, scale, [&](int slot, bool timed) {
    const double t0 = settled_now(ctx);
    split.backward_weights(slot);
    if (timed) weight.push_back((settled_now(ctx) - t0) / m.layers);
  });
  return {p[3], median(weight)};
}

// Seconds per byte of a new buffer in the sharded engine: each unit's gathered parameters are
// allocated (zeroed), written, used by the unit's pass and released (above the mmap threshold the
// pages go back to the system and fault in again next time). Timed in place, as the difference
// between the unit's forward with and without its buffer, paired per iteration: the page faults,
// the release and the caches the pass no longer finds warm.
double time_fresh_buffers(CoreContext& ctx, StageModel& model, Replica& r, const MicroBatch& mb) {
  MemoryLedger& memory = ctx.memory();
  const ParamLayout layout(ctx.model_spec());
  const int slot = model.acquire_slot();
  const auto params = r.param_ptrs();
  std::vector<double> per_byte;
  for (int it = -1; it < kComputeIterations; ++it) {
    double with = 0, without = 0, bytes = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      const UnitInfo& unit = layout.units()[std::size_t(u)];
      double t0 = settled_now(ctx);
      {
        DeviceBuffer fresh(memory, MemTag::workspace, r.params().dtype, unit.count);
        copy_across(fresh.view(), slice(r.params(), unit.offset, unit.count));
        model.forward(slot, u, params, mb, nullptr);
      }
      with += settled_now(ctx) - t0;
      t0 = settled_now(ctx);
      model.forward(slot, u, params, mb, nullptr);
      without += settled_now(ctx) - t0;
      bytes += double(unit.count * dtype_size(r.params().dtype));
    }
    if (it >= 0) per_byte.push_back(std::max(0.0, with - without) / bytes);
  }
  model.release_slot(slot);
  return median(per_byte);
}

// Seconds per byte of a copy between the device and host buffers that stay (offload's transfers
// to and from the host copies the engine keeps for the run; page-locked on a GPU): a block's
// parameters down and back, the median of the round trips over twice their bytes.
double time_copies(CoreContext& ctx, Replica& r, std::size_t block) {
  DeviceBuffer host(ctx.memory(), MemTag::offload, r.params().dtype, block);
  DeviceBuffer back(ctx.memory(), MemTag::workspace, r.params().dtype, block);
  const BufferView from = slice(r.params(), 0, block);
  std::vector<double> times;
  for (int it = -1; it < 3 * kComputeIterations; ++it) {
    const double t0 = settled_now(ctx);
    ctx.copy_to_host(host.view(), from);
    ctx.copy_to_device(back.view(), host.view());
    if (it >= 0) times.push_back(settled_now(ctx) - t0);
  }
  return median(times) / double(2 * host.view().bytes());
}

// A tp rank's own passes (issue 16: the 1/tp of the whole model's they were taken as is
// optimistic on narrow GEMMs): the whole model split over the mesh's tp group as the tp plugin
// splits it (StageModel), forward and backward of one micro-batch with its tp all-reduces, the
// median of kComputeIterations after a warm-up; split over the units by their forward FLOPs
// (only a stage's sum is used: tp alone, or a pipeline's stages). Each recompute mode's extra
// backward time, over the blocks, is its recompute entry.
ComputeEntry measure_tensor_parallel(const RunConfig& config, CoreContext& ctx,
                                     const ComputeEntry& plain) {
  const ModelSpec& m = config.model;
  const Partition part{0, m.layers + 1, config.mesh.tp, ctx.coord().tp, false};
  const DType dtype = config.train.precision.param;
  SyncTensorParallelComm tp(ctx.group(Axis::tp));
  const MicroBatch mb = ctx.micro_batch(0, 0);
  const float scale = float(grad_scale(ctx));
  auto time_stage = [&](Recompute mode) {  // median forward and backward seconds
    StageModel stage(m, config.train.micro_batch, part, ctx.memory(), mode, dtype,
                     config.train.precision.tp_comm);
    DeviceBuffer params(ctx.memory(), MemTag::params, dtype, stage.param_count());
    DeviceBuffer grads(ctx.memory(), MemTag::grads, dtype, stage.param_count());
    stage.init_params(config.train.seed, params.view());
    const int slot = stage.acquire_slot();
    std::vector<double> fwd, bwd;
    for (int it = -1; it < kComputeIterations; ++it) {
      const double t0 = settled_now(ctx);
      stage.forward(slot, params.view(), mb, &tp);
      const double t1 = settled_now(ctx);
      stage.backward(slot, params.view(), grads.view(), &tp, scale);
      if (it >= 0) fwd.push_back(t1 - t0), bwd.push_back(settled_now(ctx) - t1);
    }
    stage.release_slot(slot);
    return std::pair{median(fwd), median(bwd)};
  };
  ComputeEntry e = plain;
  e.tp = config.mesh.tp;
  const auto [fwd, bwd] = time_stage(Recompute::none);
  split_passes_by_flops(e, m, fwd, bwd);
  keep_split_shares(e, plain.block_backward_s);  // measured on the whole model
  for (Recompute mode : {Recompute::full, Recompute::selective})
    (mode == Recompute::full ? e.block_recompute_full_s : e.block_recompute_selective_s) =
        std::max(0.0, time_stage(mode).second - bwd) / m.layers;
  return e;
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
  // The ranks that share this host's cores: those of the node, or with virtual nodes (--nodes
  // on one machine) every rank here.
  e.ranks_per_node = mpi::local_rank().size;
  const Partition whole = whole_model(config.model);
  StageModel plain(config.model, e.micro_batch, whole, ctx.memory(), Recompute::none, dtype);
  const auto p = time_passes(ctx, plain, r, mb, scale);
  e.embedding_forward_s = p[0], e.embedding_backward_s = p[1];
  e.block_forward_s = p[2], e.block_backward_s = p[3];
  e.head_forward_s = p[4], e.head_backward_s = p[5];
  for (Recompute mode : {Recompute::full, Recompute::selective}) {
    StageModel m(config.model, e.micro_batch, whole, ctx.memory(), mode, dtype);
    const double extra = std::max(0.0, time_passes(ctx, m, r, mb, scale)[3] - p[3]);
    (mode == Recompute::full ? e.block_recompute_full_s : e.block_recompute_selective_s) = extra;
  }
  std::tie(e.block_input_backward_s, e.block_weight_backward_s) =
      time_split_backward(ctx, config, r, mb, scale);
  AdamW adamw = make_adamw(ctx, 0, r.size());
  std::vector<double> times;
  for (int it = -1; it < kComputeIterations; ++it) {
    const double t0 = settled_now(ctx);  // the norm and the update, as the optimizer phase does
    const double norm = std::sqrt(ctx.ops().sum_of_squares(r.grads()));
    adamw.step(r.params(), r.grads(), it + 2, clip_scale(norm, config.train.grad_clip));
    if (it >= 0) times.push_back(settled_now(ctx) - t0);
  }
  e.optimizer_s_per_param = median(times) / double(r.size());
  times.clear();
  e.fresh_memory_s_per_byte = time_fresh_buffers(ctx, plain, r, mb);
  e.copy_s_per_byte =
      time_copies(ctx, r, std::min(r.size(), ParamLayout(config.model).units()[1].count));
  return e;
}

// Seconds of one GEMM of the sweep on this rank, through the kernels the model passes call for
// the precision (fp32: matmul_forward, matmul_backward; bf16: its forward and the two GEMMs of its
// backward), on buffers of a small constant (written, so their pages are in). One call: the
// median over the calibration's rounds is what is kept.
double time_gemm(CoreContext& ctx, const GemmSample& s) {
  Kernels& k = device_kernels(ctx.memory().device());
  MemoryLedger& mem = ctx.memory();
  const bool in_bf16 = s.precision == "bf16";
  const DType op = in_bf16 ? DType::bf16 : DType::f32;
  const std::size_t m = std::size_t(s.m), n = std::size_t(s.n), kk = std::size_t(s.k);
  DeviceBuffer in{mem, MemTag::workspace, op, m * kk}, w{mem, MemTag::workspace, op, n * kk};
  DeviceBuffer dout{mem, MemTag::workspace, op, m * n};
  DeviceBuffer out{mem, MemTag::workspace, DType::f32, m * n};
  DeviceBuffer din{mem, MemTag::workspace, DType::f32, m * kk};
  DeviceBuffer dw{mem, MemTag::workspace, DType::f32, n * kk};
  for (BufferView v : {in.view(), w.view(), dout.view(), out.view(), din.view(), dw.view()})
    ctx.ops().fill(v, 0.01);
  const std::size_t pad_bytes =
      in_bf16
          ? std::max({k.gemm_bf16_scratchpad_bytes(false, true, s.m, s.n, s.k, DType::f32, false),
                      k.gemm_bf16_scratchpad_bytes(false, false, s.m, s.k, s.n, DType::f32, false),
                      k.gemm_bf16_scratchpad_bytes(true, false, s.n, s.k, s.m, DType::f32, true)})
          : 0;
  DeviceBuffer pad{mem, MemTag::workspace, DType::u8, std::max<std::size_t>(pad_bytes, 1)};
  auto f32 = [](DeviceBuffer& b) { return static_cast<float*>(b.view().data); };
  auto half = [](DeviceBuffer& b) { return static_cast<const bf16*>(b.view().data); };
  void* p = pad.view().data;
  auto run = [&] {
    const bool forward = s.pass == "forward";
    if (!in_bf16 && forward)
      k.matmul_forward(f32(out), f32(in), f32(w), nullptr, s.m, s.k, s.n);
    else if (!in_bf16)
      k.matmul_backward(f32(din), f32(dw), nullptr, f32(dout), f32(in), f32(w), s.m, s.k, s.n);
    else if (forward)
      k.matmul_bf16_forward(f32(out), ActView{}, half(in), half(w), nullptr, s.m, s.k, s.n, p,
                            pad_bytes, nullptr);
    else {
      k.gemm_bf16(false, false, s.m, s.k, s.n, half(dout), half(w), f32(din), DType::f32, false, p,
                  pad_bytes);
      k.gemm_bf16(true, false, s.n, s.k, s.m, half(dout), half(in), f32(dw), DType::f32, true, p,
                  pad_bytes);
    }
  };
  const double t0 = settled_now(ctx);
  run();
  return settled_now(ctx) - t0;
}

// The sweep of an entry's conditions (gemm_sweep_shapes), each GEMM the slowest rank's.
std::vector<GemmSample> measure_gemms(CoreContext& ctx, const ComputeEntry& e) {
  std::vector<GemmSample> sweep = gemm_sweep_shapes(e);
  time_gemm(ctx, sweep.front());  // the BLAS's (cuBLASLt's) set-up outside the times
  std::vector<double> times;
  for (const GemmSample& s : sweep) times.push_back(time_gemm(ctx, s));
  mpi::control_allreduce_max(times.data(), int(times.size()));
  for (std::size_t i = 0; i < sweep.size(); ++i) sweep[i].time_s = times[i];
  return sweep;
}

// The slowest rank's times: every field of the entry reduced with max over the world.
void max_over_ranks(ComputeEntry& e) {
  const auto fields = timed_fields(e);
  std::vector<double> v;
  for (double* f : fields) v.push_back(*f);
  mpi::control_allreduce_max(v.data(), int(v.size()));
  for (std::size_t i = 0; i < v.size(); ++i) *fields[i] = v[i];
}

// One comm sample per op, group shape, ranks on the host and size: within a run the faster of
// its groups of one shape (as the fit takes them), then over runs (repeats) the median time, so
// that one slow run does not move it (merge_profile would keep only the last).
std::vector<CommSample> median_samples(const std::vector<std::vector<CommSample>>& per_run) {
  std::vector<CommSample> out;
  std::vector<std::vector<double>> times;
  for (const std::vector<CommSample>& run : per_run) {
    std::vector<CommSample> fastest;
    for (const CommSample& s : run) {
      auto same = std::find_if(fastest.begin(), fastest.end(),
                               [&](const CommSample& o) { return same_point(o, s); });
      if (same == fastest.end())
        fastest.push_back(s);
      else
        same->time_s = std::min(same->time_s, s.time_s);
    }
    for (const CommSample& s : fastest) {
      auto same = std::find_if(out.begin(), out.end(),
                               [&](const CommSample& o) { return same_point(o, s); });
      if (same == out.end())
        out.push_back(s), times.push_back({s.time_s});
      else
        times[std::size_t(same - out.begin())].push_back(s.time_s);
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) out[i].time_s = percentile(times[i], 0.5);
  return out;
}

// What runner --calibrate measures on this allocation: the compute entry and the comm samples.
struct Measured {
  ComputeEntry entry;
  std::vector<CommSample> samples;
  std::vector<GemmSample> gemms;
};

// kCalibrationRounds rounds of every measure (the compute passes, then the collectives), one
// round after the other, so that a slow spell of a shared machine lands on one round of each
// measure rather than on all of one. Each compute field is the median over the rounds (each round
// the slowest rank's) and pass_spread says how far apart the rounds' micro-batch passes lay; each
// comm point is the median of its rounds.
Measured measure_rounds(const RunConfig& config, CoreContext& ctx, CommLedger& ledger,
                        int threads) {
  // 256 and 512 KiB beside the powers of 16: Open MPI's shared-memory all-reduce on 2 ranks here
  // took 83 us at 512 KiB and 2.6 ms at 1 MiB (a protocol switch), so a line from 64 KiB to 1 MiB
  // put a 471 KiB all-reduce at 1.1 ms instead of 0.08.
  const std::vector<std::size_t> sizes = {4u << 10,   64u << 10, 256u << 10,
                                          512u << 10, 1u << 20,  16u << 20};
  RunRecord as_run;  // the points, with the mesh they were measured on (samples_from_run)
  as_run.ranks = mpi::world_size();
  as_run.config = config.resolved(&as_run.config_types);
  std::vector<ComputeEntry> rounds;
  std::vector<double> passes;
  std::vector<std::vector<CommSample>> comm_rounds;
  std::vector<std::vector<GemmSample>> gemm_rounds;
  for (int i = 0; i < kCalibrationRounds; ++i) {
    rounds.push_back(measure_compute(config, ctx, threads));
    max_over_ranks(rounds.back());
    passes.push_back(pass_seconds(rounds.back()));
    gemm_rounds.push_back(measure_gemms(ctx, rounds.back()));
    as_run.calibration = calibrate_comm(ctx, ledger, sizes, kCalibrationIterations);
    comm_rounds.push_back(samples_from_run(as_run));
  }
  Measured m{median_entry(rounds), median_samples(comm_rounds), gemm_rounds.front()};
  for (std::size_t g = 0; g < m.gemms.size(); ++g) {  // the median over the rounds
    std::vector<double> t;
    for (const auto& round : gemm_rounds) t.push_back(round[g].time_s);
    m.gemms[g].time_s = percentile(t, 0.5);
  }
  const auto [low, high] = std::minmax_element(passes.begin(), passes.end());
  m.entry.pass_spread = (*high - *low) / percentile(passes, 0.5);
  for (CommSample& s : m.samples) s.host_ranks = m.entry.ranks_per_node;  // ranks on this host
  return m;
}

void print_entry(const ComputeEntry& e) {
  std::printf(
      "calibrate: %s, micro-batch %d, tp %d, %s %s, %d thread(s) x %d rank(s) on the host (ms):\n",
      e.model.preset.c_str(), e.micro_batch, e.tp, e.device.c_str(), e.precision.c_str(), e.threads,
      e.ranks_per_node);
  std::printf(
      "  embedding fwd %.3f bwd %.3f | block fwd %.3f bwd %.3f (+%.3f full, +%.3f "
      "selective; split: input %.3f + weight %.3f) | head fwd %.3f bwd %.3f | AdamW %.3f "
      "ns/param | new memory %.2f GB/s | copies %.2f GB/s | rounds' spread %.1f%%\n",
      e.embedding_forward_s * 1e3, e.embedding_backward_s * 1e3, e.block_forward_s * 1e3,
      e.block_backward_s * 1e3, e.block_recompute_full_s * 1e3, e.block_recompute_selective_s * 1e3,
      e.block_input_backward_s * 1e3, e.block_weight_backward_s * 1e3, e.head_forward_s * 1e3,
      e.head_backward_s * 1e3, e.optimizer_s_per_param * 1e9,
      e.fresh_memory_s_per_byte > 0 ? 1e-9 / e.fresh_memory_s_per_byte : 0.0,
      e.copy_s_per_byte > 0 ? 1e-9 / e.copy_s_per_byte : 0.0, 100 * e.pass_spread);
}

// The sweep's rates, forward and backward, from its smallest to its largest GEMM.
void print_sweep(const std::vector<GemmSample>& sweep) {
  for (const char* pass : {"forward", "backward"}) {
    std::vector<const GemmSample*> of;
    for (const GemmSample& s : sweep)
      if (s.pass == pass) of.push_back(&s);
    if (of.empty()) continue;
    const auto [lo, hi] = std::minmax_element(
        of.begin(), of.end(), [](auto* a, auto* b) { return a->flops() < b->flops(); });
    auto rate = [](const GemmSample* s) { return s->flops() / s->time_s / 1e9; };
    std::printf(
        "  GEMM sweep %-8s %zu shapes: %.1f GFLOP/s (%dx%dx%d) to %.1f GFLOP/s (%dx%dx%d)\n", pass,
        of.size(), rate(*lo), (*lo)->m, (*lo)->n, (*lo)->k, rate(*hi), (*hi)->m, (*hi)->n,
        (*hi)->k);
  }
}

void print_fits(const MachineProfile& p, const std::string& path) {
  for (const CommFit& f : p.comm)
    std::printf(
        "  %-14s %2d rank(s), %2d per node, %2d on the host: alpha %8.1f us, beta %8.3f GB/s "
        "(%d points, max error %.0f%%)\n",
        f.op.c_str(), f.ranks, f.ranks_per_node, f.host_ranks, f.alpha_s * 1e6,
        f.beta_bytes_per_s / 1e9, f.points, 100 * f.max_rel_error);
  std::printf("calibrate: profile %s: %zu compute entries, %zu comm fits\n", path.c_str(),
              p.compute.size(), p.comm.size());
}

void print_profile(const MachineProfile& p, const std::vector<ComputeEntry>& entries,
                   const std::string& path) {
  for (const ComputeEntry& e : entries) print_entry(e);
  print_fits(p, path);
}

// Each sharded run's new-buffer rate (the one for which the predictor gives its step); the median
// of them goes into the entries of its configuration, and a configuration without one takes the
// median of all.
void fit_fresh_rates(MachineProfile& more, const std::vector<RunQuestion>& runs) {
  std::vector<std::pair<const ComputeEntry*, double>> fits;
  for (const RunQuestion& q : runs)  // those whose plans allocate per step (sharded ones)
    if (const auto rate = fit_fresh_rate(more, q.query, q.step_p50_s))
      for (const ComputeEntry& e : more.compute)
        if (same_configuration(e, q.entry)) fits.emplace_back(&e, *rate);
  if (fits.empty()) return;
  std::vector<double> all;
  for (const auto& f : fits) all.push_back(f.second);
  for (ComputeEntry& e : more.compute) {
    std::vector<double> mine;
    for (const auto& [entry, rate] : fits)
      if (entry == &e) mine.push_back(rate);
    e.fresh_memory_s_per_byte = percentile(mine.empty() ? all : mine, 0.5);
    std::printf(
        "calibrate: micro-batch %d, %d thread(s) x %d rank(s): new memory %.2f GB/s (%s)\n",
        e.micro_batch, e.threads, e.ranks_per_node,
        e.fresh_memory_s_per_byte > 0 ? 1e-9 / e.fresh_memory_s_per_byte : 0.0,
        mine.empty() ? "the median of the other fits" : "fitted to its sharded runs' steps");
  }
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

void calibrate_from_runs(const RunConfig& config, const StrategyOf& strategy_of) {
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
  std::vector<RunQuestion> with_entry;  // the runs whose steps may fit the new-buffer rate
  std::vector<std::vector<ComputeEntry>> entries;  // per configuration: one per run
  std::vector<std::vector<CommSample>> samples_per_run;
  for (const std::string& path : config.calibrate_from) {
    if (path.ends_with(".json")) {  // bench_comm's points: comm only
      std::string transport;
      const std::vector<CommSample> s = samples_from_bench(path, &transport);
      samples_per_run.push_back(s);
      std::printf("calibrate: %s: %zu comm sample(s) of bench_comm over %s\n", path.c_str(),
                  s.size(), transport.c_str());
      continue;
    }
    const RunRecord run = read_run_file(path);
    const std::vector<CommSample> s = samples_from_run(run);
    samples_per_run.push_back(s);
    RunQuestion q = question_of_run(run);
    const StepQuery& as_run = q.query;  // with the plans of the run's strategy and options
    q.query = step_query(as_run.strategy, *strategy_of(as_run.strategy, q.plugin_opts), as_run.mesh,
                         as_run.model, as_run.train, as_run.threads, as_run.ranks_on_host);
    std::string why;
    const auto e = compute_from_run(run, q, &why);
    if (s.empty() && !e)
      throw ConfigError("--calibrate-from " + path +
                        ": no /calibration (--calibrate-comm) and no " + "compute entry (" + why +
                        ")");
    std::printf("calibrate: %s: %zu comm sample(s), %s\n", path.c_str(), s.size(),
                e ? "a compute entry from its phase timers" : ("no compute entry: " + why).c_str());
    more.node_peak_flops = std::max(more.node_peak_flops, q.node_peak_flops);
    if (!e) continue;
    auto same = std::find_if(entries.begin(), entries.end(),
                             [&](const auto& v) { return same_configuration(v.front(), *e); });
    if (same == entries.end())
      entries.push_back({*e});
    else
      same->push_back(*e);
    q.entry = *e;
    with_entry.push_back(std::move(q));
  }
  for (const auto& v : entries) more.compute.push_back(median_entry(v));
  more.samples = median_samples(samples_per_run);
  refit_comm(more);  // the predictor needs the fits of the samples
  fit_fresh_rates(more, with_entry);
  const MachineProfile profile = merge_into_file(config, more);
  std::printf("calibrate: profile %s: %zu compute entries, %zu comm fits\n", config.profile.c_str(),
              profile.compute.size(), profile.comm.size());
}

void calibrate_machine(const RunConfig& config, int threads_per_rank) {
  if (config.device_kind() != Device::cpu) {  // this rank's GPU, as a run opens it
    const mpi::LocalRank local = mpi::local_rank();
    open_backend(config.device_kind(), {local.rank, local.size, config.attention_kernel()});
  }
  const PeakFlops peak = resolve_peak_flops(config);  // collective: the node's, cached
  CommLedger ledger;
  CoreContext ctx(config, ledger);
  const Measured measured = measure_rounds(config, ctx, ledger, threads_per_rank);
  std::vector<ComputeEntry> entries{measured.entry};
  if (config.mesh.tp > 1) {  // with a tp group: its ranks' own passes too
    entries.push_back(measure_tensor_parallel(config, ctx, measured.entry));
    max_over_ranks(entries.back());
  }
  if (mpi::world_rank() != 0) return;

  MachineProfile more;
  more.created_utc = utc_timestamp();
  more.host = mpi::processor_name();
  more.node_peak_flops = peak.node;
  more.compute = entries;
  more.samples = measured.samples;
  more.gemms = measured.gemms;
  print_sweep(measured.gemms);
  more.description = "runner --calibrate on " + more.host + " (" + config.transport + ")";
  const MachineProfile profile = merge_into_file(config, more);
  print_profile(profile, entries, config.profile);
}

}  // namespace strata
