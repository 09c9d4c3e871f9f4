// bf16 GEMM (oneDNN, cpu/gemm_bf16.hpp) against fp32 SGEMM (the BLAS) at the `small` preset's
// forward GEMMs: out[N,OC] = inp[N,C] @ W[OC,C]^T with N = B*T = 8*128 = 1024 rows, C = 256 and
// OC in {3C (qkv), C (attn_proj), 4C (fc1), V = 4096 (lm_head)}, W stored [OC,C] as the model does.
//
// BM_gemm_bf16/small/<gemm>/threads:<n>  bf16 A and W, f32 C (fp32 accumulation), on n threads.
// BM_sgemm/small/<gemm>/threads:<n>      cblas_sgemm of the same shape, on n BLAS threads.
// Counters: GFLOPs (2*N*C*OC per GEMM, wall time), blas_threads. The label names oneDNN's kernel.
// Without oneDNN only BM_sgemm is registered (one line on stderr says so).
// Run: build/bin/bench_gemm_bf16 --benchmark_filter=threads:2
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"

namespace {

namespace cpu = strata::cpu;

constexpr int kRows = 8 * 128, kC = 256;  // small: B=8, T=128, C=256

struct GemmShape {
  const char* name;
  int out_channels;
};
const GemmShape kShapes[] = {
    {"qkv", 3 * kC}, {"attn_proj", kC}, {"fc1", 4 * kC}, {"lm_head", 4096}};

std::vector<float> pattern(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = float((std::uint32_t(i) * 2654435761u) >> 16) / 32768.0f - 1.0f;
  return v;
}

void report(benchmark::State& state, int oc) {
  const double flop = 2.0 * kRows * kC * oc;
  state.counters["GFLOPs"] =
      benchmark::Counter(flop * 1e-9 * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["blas_threads"] = cpu::blas_threads();
}

void BM_gemm_bf16(benchmark::State& state, int oc) {
  cpu::set_blas_threads(int(state.range(0)));
  const auto inp32 = pattern(std::size_t(kRows) * kC), w32 = pattern(std::size_t(oc) * kC);
  std::vector<strata::bf16> inp(inp32.size()), w(w32.size());
  cpu::round_to_bf16(inp.data(), inp32.data(), inp.size());
  cpu::round_to_bf16(w.data(), w32.data(), w.size());
  std::vector<float> out(std::size_t(kRows) * oc);
  const auto run = [&] {
    cpu::gemm_bf16(false, true, kRows, oc, kC, inp.data(), w.data(), out.data(), strata::DType::f32,
                   false);
  };
  run();  // creates the primitive, outside the timing
  for (auto _ : state) run();
  report(state, oc);
  state.SetLabel(cpu::bf16_gemm_impl());
}

void BM_sgemm(benchmark::State& state, int oc) {
  cpu::set_blas_threads(int(state.range(0)));
  const auto inp = pattern(std::size_t(kRows) * kC), w = pattern(std::size_t(oc) * kC);
  std::vector<float> out(std::size_t(kRows) * oc);
  const auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, oc, kC, 1.0f, inp.data(), kC,
                w.data(), kC, 0.0f, out.data(), oc);
  };
  run();
  for (auto _ : state) run();
  report(state, oc);
}

const bool registered = [] {
  if (!cpu::have_bf16_gemm())
    std::fprintf(stderr, "bench_gemm_bf16: no bf16 GEMM in this build (oneDNN), BM_sgemm only\n");
  for (const GemmShape& s : kShapes) {
    const std::string suffix = std::string("/small/") + s.name;
    if (cpu::have_bf16_gemm())
      benchmark::RegisterBenchmark(("BM_gemm_bf16" + suffix).c_str(), BM_gemm_bf16, s.out_channels)
          ->ArgName("threads")
          ->Arg(1)
          ->Arg(2)
          ->UseRealTime()
          ->MinTime(0.2);
    benchmark::RegisterBenchmark(("BM_sgemm" + suffix).c_str(), BM_sgemm, s.out_channels)
        ->ArgName("threads")
        ->Arg(1)
        ->Arg(2)
        ->UseRealTime()
        ->MinTime(0.2);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
