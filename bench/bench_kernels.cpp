// Kernel throughput of the standard workload's layer passes, on each backend.
//
// Shapes come from model_preset (T, C, NH, V) at a fixed micro-batch B per preset, chosen so a
// CPU benchmark stays short on a 2-core host: small (T=128, C=256, NH=4, V=4096) at B=8 and
// gpt2-124m (T=1024, C=768, NH=12, V=50304) at B=1, both N = B*T = 1024 rows.
//
// BM_Gemm/<backend>/<preset>/<gemm>/<forward|backward>/micro_batch:<B>: one matmul_forward
//   (out[N,OC] = inp[N,K] @ W[OC,K]^T + bias) or one matmul_backward (dinp and dweight, and dbias
//   where the model has a bias), for each GEMM of the model: qkv (K=C, OC=3C), attn_proj (C, C),
//   fc1 (C, 4C), fc2 (4C, C), lm_head (C, V; no bias).
// BM_Attention/<backend>/<preset>/<forward|backward>/micro_batch:<B>: causal multi-head
//   attention_forward / attention_backward at B, T, C, NH (att[B,NH,T,T] from one forward).
// BM_LayerNorm/<backend>/<preset>/<forward|backward>/micro_batch:<B>: layernorm_forward /
//   layernorm_backward over N rows of C.
// With a CUDA device, also the GPU-only cases of bench_gpu_kernels.cpp (each attention kernel, the
// bf16 GEMMs through cuBLASLt, elementwise passes) against the device's peaks.
// <backend>: cpu (cpu/layers.hpp; OpenBLAS on OPENBLAS_NUM_THREADS threads) and, in a build with
// the CUDA backend, cuda (cuda/layers.cuh on device 0: device buffers, cudaEvent timing on the
// context's stream). Without a CUDA device the cuda benchmarks are not registered and one line
// on stderr says so. Every benchmark uses manual time: one untimed warm-up pass, then each pass
// timed alone.
//
// Counters (rates over the timed passes):
//   GFLOPs        GEMM: 2*N*K*OC per GEMM; forward is one GEMM, backward two (dinp, dweight).
//                 The bias add / dbias reduction is timed but not counted.
//                 Attention: forward 4*B*T*T*C (S = QK^T and P V, 2*B*NH*T*T*hs each), backward
//                 8*B*T*T*C (four such products). NOT halved for causality: both backends compute
//                 the full T x T products and mask the upper triangle.
//   peak_GFLOPs   GEMM only. cpu: calibrate_sgemm_flops(0.5), once per process (cached); cuda:
//                 peak_dense_flops(device name, fp32), the device table's dense FP32 figure
//                 (omitted, with frac_of_peak, for a GPU the table does not know).
//   frac_of_peak  GFLOPs / peak_GFLOPs.
//   tokens_per_s  attention: B*T / time.
//   GBps          LayerNorm (memory-bound, reported only): bytes / time with each tensor moved
//                 once: forward 4*(2NC + 2C + 2N) (read inp, weight, bias; write out, mean,
//                 rstd), backward 4*(4NC + 5C + 2N) (read dout, inp, weight, mean, rstd;
//                 read and write dinp, dweight, dbias).
//   blas_threads  cpu only: OpenBLAS's thread count.
//
// Run: build/bin/bench_kernels --benchmark_filter=Gemm/cpu/small   (--benchmark_format=json)
// The gpt2-124m lm_head GEMMs are the long ones on a CPU: 79 GFLOP forward, twice that backward.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "backends/cpu/layers.hpp"
#include "bench_cuda.hpp"
#include "strata/model.hpp"

#if STRATA_BENCH_CUDA
#include <cuda_runtime_api.h>

#include "backends/cuda/device.hpp"
#include "backends/cuda/layers.cuh"
#endif

namespace strata::bench {

void fill_pattern(float* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    p[i] = float((std::uint32_t(i) * 2654435761u) >> 16) / 32768.0f - 1.0f;
}

#if STRATA_BENCH_CUDA
void register_gpu_benchmarks();  // bench_gpu_kernels.cpp: attention kernels, bf16 GEMMs,
                                 // elementwise

const cuda::CudaContext& cuda_ctx() {
  static const cuda::CudaContext ctx(0);
  return ctx;
}

namespace {
cudaEvent_t cuda_event(int i) {
  static cudaEvent_t ev[2] = {nullptr, nullptr};
  if (!ev[i]) STRATA_CUDA_CHECK(cudaEventCreate(&ev[i]));
  return ev[i];
}
}  // namespace

void cuda_clock_start() { STRATA_CUDA_CHECK(cudaEventRecord(cuda_event(0), cuda_ctx().stream)); }

double cuda_clock_stop() {
  STRATA_CUDA_CHECK(cudaEventRecord(cuda_event(1), cuda_ctx().stream));
  STRATA_CUDA_CHECK(cudaEventSynchronize(cuda_event(1)));
  float ms = 0.0f;
  STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, cuda_event(0), cuda_event(1)));
  return double(ms) * 1e-3;
}
#endif

}  // namespace strata::bench

namespace {
using strata::bench::fill_pattern;

using strata::ModelSpec;

// One backend: its memory, its clock and its layer passes, as plain function pointers with the
// signatures of cpu/layers.hpp.
struct Backend {
  std::string name;
  benchmark::TimeUnit unit;
  bool has_blas_threads;
  float* (*alloc)(std::size_t n);  // n floats filled with a fixed pattern in [-1, 1)
  void (*release)(float* p);
  void (*sync)();    // waits for all queued work
  void (*start)();   // starts the clock of one timed pass
  double (*stop)();  // seconds since start(), the pass's work included
  double (*peak)();  // dense fp32 FLOP/s, 0 when unknown
  void (*matmul_forward)(float*, const float*, const float*, const float*, int, int, int);
  void (*matmul_backward)(float*, float*, float*, const float*, const float*, const float*, int,
                          int, int);
  void (*attention_forward)(float*, float*, const float*, int, int, int, int);
  void (*attention_backward)(float*, float*, const float*, const float*, const float*, int, int,
                             int, int);
  void (*layernorm_forward)(float*, float*, float*, const float*, const float*, const float*, int,
                            int);
  void (*layernorm_backward)(float*, float*, float*, const float*, const float*, const float*,
                             const float*, const float*, int, int);
};

// A backend buffer of n floats (null when n == 0), released on scope exit.
class Buf {
 public:
  Buf(const Backend& be, std::size_t n) : be_(be), p_(n ? be.alloc(n) : nullptr) {}
  ~Buf() {
    if (p_) be_.release(p_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  operator float*() const { return p_; }

 private:
  const Backend& be_;
  float* p_;
};

// One untimed warm-up pass, then one timed pass per iteration; returns the total timed seconds.
template <class Pass>
double time_passes(benchmark::State& state, const Backend& be, Pass&& pass) {
  pass();
  be.sync();
  double total = 0.0;
  for (auto _ : state) {
    be.start();
    pass();
    const double s = be.stop();
    state.SetIterationTime(s);
    total += s;
  }
  return total;
}

void set_common_counters(benchmark::State& state, const Backend& be) {
  if (be.has_blas_threads) state.counters["blas_threads"] = strata::cpu::blas_threads();
}

// ---- CPU ----------------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
Clock::time_point cpu_t0;

const Backend& cpu_backend() {
  namespace cpu = strata::cpu;
  static const Backend be{
      "cpu",
      benchmark::kMillisecond,
      true,
      [](std::size_t n) {
        float* p = new float[n];
        fill_pattern(p, n);
        return p;
      },
      [](float* p) { delete[] p; },
      [] {},
      [] { cpu_t0 = Clock::now(); },
      [] { return std::chrono::duration<double>(Clock::now() - cpu_t0).count(); },
      [] {
        static const double peak = cpu::calibrate_sgemm_flops(0.5);
        return peak;
      },
      &cpu::matmul_forward,
      &cpu::matmul_backward,
      &cpu::attention_forward,
      &cpu::attention_backward,
      &cpu::layernorm_forward,
      &cpu::layernorm_backward,
  };
  return be;
}

// ---- CUDA ---------------------------------------------------------------------------------------
#if STRATA_BENCH_CUDA
namespace gpu = strata::cuda;

using strata::bench::cuda_ctx;

// A cuda:: layer pass as a cpu::-signature function: the first argument is always cuda_ctx().
template <auto F>
struct OnCtx;
template <class... A, void (*F)(const gpu::CudaContext&, A...)>
struct OnCtx<F> {
  static void call(A... a) { F(cuda_ctx(), a...); }
};

const Backend& cuda_backend() {
  static const Backend be{
      "cuda",
      benchmark::kMicrosecond,
      false,
      [](std::size_t n) {
        std::vector<float> host(n);
        fill_pattern(host.data(), n);
        float* p = nullptr;
        STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)));
        STRATA_CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        STRATA_CUDA_CHECK(cudaDeviceSynchronize());  // the context's stream is non-blocking
        return p;
      },
      [](float* p) { cudaFree(p); },
      [] { cuda_ctx().synchronize(); },
      &strata::bench::cuda_clock_start,
      &strata::bench::cuda_clock_stop,
      [] {
        static const double peak = gpu::peak_dense_flops(gpu::cuda_device_name(0), false);
        return peak;
      },
      &OnCtx<&gpu::matmul_forward>::call,
      &OnCtx<&gpu::matmul_backward>::call,
      &OnCtx<&gpu::attention_forward>::call,
      &OnCtx<&gpu::attention_backward>::call,
      [](float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
         int N, int C) {  // fp32, as the CPU's
        gpu::layernorm_forward(cuda_ctx(), out, mean, rstd, const_cast<float*>(inp), w, b, N, C);
      },
      [](float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
         const float* mean, const float* rstd, int N, int C) {
        gpu::layernorm_backward(cuda_ctx(), dinp, dw, db, dout, const_cast<float*>(inp), w, mean,
                                rstd, N, C);
      },
  };
  return be;
}
#endif

// ---- Benchmarks ---------------------------------------------------------------------------------

struct Gemm {
  const char* name;
  int K, OC;  // inp[N,K] @ W[OC,K]^T
  bool bias;
};

std::vector<Gemm> model_gemms(const ModelSpec& s) {
  const int C = s.hidden;
  return {{"qkv", C, 3 * C, true},
          {"attn_proj", C, C, true},
          {"fc1", C, 4 * C, true},
          {"fc2", 4 * C, C, true},
          {"lm_head", C, s.vocab, false}};
}

void BM_Gemm(benchmark::State& state, const Backend& be, const ModelSpec& spec, const Gemm& g,
             bool backward) {
  const double peak = be.peak();  // before any buffer: the CPU calibration runs on first use
  const int N = int(state.range(0)) * spec.seq, K = g.K, OC = g.OC;
  const std::size_t nk = std::size_t(N) * K, no = std::size_t(N) * OC, ok = std::size_t(OC) * K;
  Buf inp(be, nk), w(be, ok), bias(be, g.bias ? OC : 0);
  double seconds = 0.0;
  if (!backward) {
    Buf out(be, no);
    seconds = time_passes(state, be, [&] { be.matmul_forward(out, inp, w, bias, N, K, OC); });
  } else {
    Buf dout(be, no), dinp(be, nk), dw(be, ok), db(be, g.bias ? OC : 0);
    seconds =
        time_passes(state, be, [&] { be.matmul_backward(dinp, dw, db, dout, inp, w, N, K, OC); });
  }
  const double flops = 2.0 * N * K * OC * (backward ? 2 : 1) * double(state.iterations());
  state.counters["GFLOPs"] = flops / seconds * 1e-9;
  if (peak > 0) {
    state.counters["peak_GFLOPs"] = peak * 1e-9;
    state.counters["frac_of_peak"] = flops / seconds / peak;
  }
  set_common_counters(state, be);
  state.SetLabel("M=" + std::to_string(N) + " K=" + std::to_string(K) + " N=" + std::to_string(OC));
}

void BM_Attention(benchmark::State& state, const Backend& be, const ModelSpec& spec,
                  bool backward) {
  const int B = int(state.range(0)), T = spec.seq, C = spec.hidden, NH = spec.heads;
  const std::size_t btc = std::size_t(B) * T * C, att_n = std::size_t(B) * NH * T * T;
  Buf qkv(be, 3 * btc), out(be, btc), att(be, att_n);
  double seconds = 0.0;
  if (!backward) {
    seconds = time_passes(state, be, [&] { be.attention_forward(out, att, qkv, B, T, C, NH); });
  } else {
    Buf dout(be, btc), dqkv(be, 3 * btc), datt(be, att_n);
    be.attention_forward(out, att, qkv, B, T, C, NH);  // the probabilities backward reads
    seconds = time_passes(state, be,
                          [&] { be.attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH); });
  }
  const double iters = double(state.iterations());
  const double flops = (backward ? 8.0 : 4.0) * B * double(T) * T * C * iters;
  state.counters["GFLOPs"] = flops / seconds * 1e-9;
  state.counters["tokens_per_s"] = double(B) * T * iters / seconds;
  set_common_counters(state, be);
}

void BM_LayerNorm(benchmark::State& state, const Backend& be, const ModelSpec& spec,
                  bool backward) {
  const int N = int(state.range(0)) * spec.seq, C = spec.hidden;
  const std::size_t nc = std::size_t(N) * C;
  Buf inp(be, nc), w(be, C), b(be, C), out(be, nc), mean(be, N), rstd(be, N);
  double seconds = 0.0;
  if (!backward) {
    seconds =
        time_passes(state, be, [&] { be.layernorm_forward(out, mean, rstd, inp, w, b, N, C); });
  } else {
    Buf dout(be, nc), dinp(be, nc), dw(be, C), db(be, C);
    be.layernorm_forward(out, mean, rstd, inp, w, b, N, C);  // the mean, rstd backward reads
    seconds = time_passes(
        state, be, [&] { be.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
  }
  const double bytes = backward ? 4.0 * (4.0 * double(nc) + 5.0 * C + 2.0 * N)
                                : 4.0 * (2.0 * double(nc) + 2.0 * C + 2.0 * N);
  state.counters["GBps"] = bytes * double(state.iterations()) / seconds * 1e-9;
  set_common_counters(state, be);
}

struct Preset {
  const char* name;
  int micro_batch;
};
constexpr Preset kPresets[] = {{"small", 8}, {"gpt2-124m", 1}};

// Registers `fn(state)` as <name>/micro_batch:<B>; a thrown error skips that benchmark only.
template <class Fn>
void add(const Backend& be, const std::string& name, int B, Fn fn) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [fn](benchmark::State& state) {
                                 try {
                                   fn(state);
                                 } catch (const std::exception& e) {
                                   state.SkipWithError(e.what());
                                 }
                               })
      ->Arg(B)
      ->ArgName("micro_batch")
      ->UseManualTime()
      ->Unit(be.unit);
}

void register_backend(const Backend& be) {
  for (const Preset& p : kPresets) {
    const ModelSpec spec = strata::model_preset(p.name);
    const std::string tail = "/" + be.name + "/" + p.name + "/";
    const int B = p.micro_batch;
    for (const Gemm& g : model_gemms(spec))
      for (const bool bwd : {false, true})
        add(be, "BM_Gemm" + tail + g.name + (bwd ? "/backward" : "/forward"), B,
            [&be, spec, g, bwd](benchmark::State& s) { BM_Gemm(s, be, spec, g, bwd); });
    for (const bool bwd : {false, true})
      add(be, "BM_Attention" + tail + (bwd ? "backward" : "forward"), B,
          [&be, spec, bwd](benchmark::State& s) { BM_Attention(s, be, spec, bwd); });
    for (const bool bwd : {false, true})
      add(be, "BM_LayerNorm" + tail + (bwd ? "backward" : "forward"), B,
          [&be, spec, bwd](benchmark::State& s) { BM_LayerNorm(s, be, spec, bwd); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_backend(cpu_backend());
#if STRATA_BENCH_CUDA
  int devices = 0;
  try {
    devices = strata::cuda::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
  }
  if (devices > 0) {
    register_backend(cuda_backend());
    strata::bench::register_gpu_benchmarks();
  } else
    std::fprintf(stderr, "bench_kernels: no CUDA device: cuda benchmarks skipped\n");
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
