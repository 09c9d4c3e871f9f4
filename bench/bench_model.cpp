// Training-step throughput of the standard workload on the CPU backend.
//
// BM_TrainStep/small/recompute:<mode>/micro_batch:<B>: one full training step of the `small`
// preset (L=4, C=256, NH=4, T=128, V=4096) on this process's BLAS threads (OPENBLAS_NUM_THREADS)
// with activation recomputation <mode> (none, selective, full; the model's Recompute): zero the
// gradients, forward of every unit, backward of every unit (which recomputes, per the mode), one
// AdamW update of all parameters. Select modes with e.g. --benchmark_filter=recompute:none.
// Counters:
//   model_flops  flops_per_token * tokens / step time (DESIGN "Measures": 6N + 12 L h s per token;
//                model FLOPs: recomputation is not counted, so it shows as a lower rate and MFU)
//   activation_bytes  the ledger's activations peak (= predict_activations for the mode)
//   sgemm_peak   calibrate_sgemm_flops() in the same process, just before timing (the CPU peak)
//   mfu_pct      100 x model_flops / sgemm_peak (MFU in percent, as everywhere it is read)
//   tokens_per_s, blas_threads
// The machine is shared and noisy: prefer --benchmark_repetitions=5 and the median.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/layers.hpp"
#include "strata/memory.hpp"
#include "strata/model.hpp"
#include "strata/optimizer.hpp"
#include "strata/stage_model.hpp"

namespace {

using strata::ModelSpec;

ModelSpec small_spec() { return strata::model_preset("small"); }

void BM_TrainStep(benchmark::State& state, strata::Recompute recompute) {
  using clock = std::chrono::steady_clock;
  const ModelSpec spec = small_spec();
  const int B = int(state.range(0));
  const int tokens = B * spec.seq;

  strata::MemoryLedger memory;
  strata::StageModel model(spec, B, strata::whole_model(spec), memory, recompute);
  const int slot = model.acquire_slot();
  const strata::ParamLayout layout(spec);
  strata::Buffer<float> params(memory, strata::MemTag::params, layout.total());
  strata::Buffer<float> grads(memory, strata::MemTag::grads, layout.total());
  strata::init_params(layout, 1234, 0, params.span());
  strata::AdamW opt(layout, 0, layout.total(), strata::AdamWConfig{}, memory);
  strata::UnitPtrs pp, gg;
  for (const strata::UnitInfo& u : layout.units()) {
    pp.push_back(strata::view(params.data() + u.offset, u.count));
    gg.push_back(strata::view(grads.data() + u.offset, u.count));
  }
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> tok(0, spec.vocab - 1);
  std::vector<std::int32_t> inputs(tokens), targets(tokens);
  for (int i = 0; i < tokens; ++i) {
    inputs[i] = tok(rng);
    targets[i] = tok(rng);
  }
  const strata::MicroBatch mb{inputs.data(), targets.data(), B, spec.seq};
  const int units = layout.num_units();
  const float grad_scale = 1.0f / float(tokens);
  int t = 0;
  auto train_step = [&] {
    std::fill(grads.span().begin(), grads.span().end(), 0.0f);
    for (int u = 0; u < units; ++u) model.forward(slot, u, pp, mb, nullptr);
    for (int u = units - 1; u >= 0; --u) model.backward(slot, u, pp, gg, nullptr, grad_scale);
    opt.step(strata::view(params.data(), params.size()), strata::view(grads.data(), grads.size()),
             ++t);
  };

  const double peak = strata::cpu::calibrate_sgemm_flops(0.5);
  train_step();  // warm-up: first touch of every buffer
  train_step();
  double seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = clock::now();
    train_step();
    const auto t1 = clock::now();
    seconds += std::chrono::duration<double>(t1 - t0).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  benchmark::DoNotOptimize(model.loss_sum(slot));
  const double steps = double(state.iterations());
  const double model_flops = spec.flops_per_token() * tokens * steps / seconds;
  state.counters["model_flops"] = model_flops;
  state.counters["sgemm_peak"] = peak;
  state.counters["mfu_pct"] = 100 * model_flops / peak;
  state.counters["tokens_per_s"] = tokens * steps / seconds;
  state.counters["blas_threads"] = strata::cpu::blas_threads();
  state.counters["activation_bytes"] = double(memory.peak(strata::MemTag::activations));
  state.SetLabel(std::string("small recompute=") + strata::recompute_name(recompute));
}

const bool registered = [] {
  using strata::Recompute;
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    const std::string name =
        std::string("BM_TrainStep/small/recompute:") + strata::recompute_name(r);
    benchmark::RegisterBenchmark(name.c_str(), BM_TrainStep, r)
        ->Arg(8)
        ->ArgName("micro_batch")
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->MinTime(2.0);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
