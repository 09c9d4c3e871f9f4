// The GPU-only kernel benchmarks of bench_kernels (registered by its main() where a CUDA device
// exists): what a bf16 step of the model runs, against the device's data-sheet peaks.
//
// BM_GpuAttention/<reference|own|cudnn>/<shape>/<forward|backward|forward_backward>: the fp32
//   flash kernel on CUDA cores (cuda/attention.cu), the own bf16 tensor-core kernel
//   (cuda/attention_tc.cu) and, in a build with cuDNN, cuDNN's fused attention as a run calls it
//   (CudaKernels; its backward with the rounding of dout and the widening of dqkv), causal. Shapes:
//   hs64 = gpt2-124m at micro-batch 8 (B 8, T 1024, C 768, NH 12), hs128 = the 1.3B shape of
//   scripts/gpu-check.sh (B 4, T 1024, C 2048, NH 16). FLOPs as FlashAttention counts them, causal
//   (half the T x T products): forward 2 B T^2 C (S = QK^T and PV), backward 2.5x forward (dV, dP,
//   dQ, dK; the recomputed S not counted).
// BM_GpuGemmBf16/<gemm>/<forward|backward>: a gpt2-124m block's linear layers at N = 8 x 1024
//   rows: forward as the model runs it (cublasLtMatmul with the bias in the epilogue, then for
//   fc1 the bf16 GELU kernel: Kernels::matmul_bf16_forward), backward the two bf16 GEMMs (dinp,
//   dweight) of cublasGemmEx. FLOPs 2 N K OC per GEMM.
// BM_GpuElementwise/<kernel>: the passes between the GEMMs (the GELU forward and backward, the
//   residual add of a bf16 run, rounding to bf16), at N x 4C (GELU) or N x C, and
//   the bf16 head's cross-entropy over one chunk of bf16 logits as a run holds it (1,334 rows of
//   gpt2's 50,304, model_passes.hpp; read twice, the gradient written over them): GB/s, each
//   tensor read or written once (the cross-entropy: as many bytes as it moves).
// Counters: TFLOPs and frac_of_peak (against the bf16 dense tensor-core peak for bf16 work, the
// fp32 peak for the reference attention; omitted for a GPU the table does not know), or GBps.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/device.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/layers.cuh"
#include "bench_cuda.hpp"
#include "strata/types.hpp"

namespace strata::bench {
namespace {

namespace gpu = strata::cuda;

gpu::CudaKernels& kernels() {
  static gpu::CudaKernels k(cuda_ctx());
  return k;
}
gpu::CudaKernels& cudnn_kernels() {
  static gpu::CudaKernels k(cuda_ctx(), AttentionKernel::cudnn);
  return k;
}

// n elements of T on the device, a fixed pattern in [-1, 1) (never zeros: they run faster), or
// a copy of the given host elements.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : DeviceArray(pattern(n)) {}
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
    STRATA_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  operator T*() const { return p_; }

 private:
  static std::vector<T> pattern(std::size_t n) {
    std::vector<float> values(n);
    fill_pattern(values.data(), n);
    std::vector<T> host(n);
    for (std::size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, float>)
        host[i] = values[i];
      else
        host[i] = to_bf16(values[i]);
    }
    return host;
  }

  std::size_t n_;
  T* p_ = nullptr;
};

// One untimed pass, then each iteration's pass timed with events on the context's stream.
double time_passes(benchmark::State& state, const std::function<void()>& pass) {
  pass();
  cuda_ctx().synchronize();
  double total = 0;
  for (auto _ : state) {
    cuda_clock_start();
    pass();
    const double seconds = cuda_clock_stop();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  return total;
}

void set_rate(benchmark::State& state, double flops_per_pass, double seconds, bool bf16) {
  const double rate = flops_per_pass * double(state.iterations()) / seconds;
  state.counters["TFLOPs"] = rate * 1e-12;
  const double peak = gpu::peak_dense_flops(gpu::cuda_device_name(0), bf16);
  if (peak > 0) state.counters["frac_of_peak"] = rate / peak;
}

struct AttentionShape {
  const char* name;
  int B, T, C, NH;
};
constexpr AttentionShape kAttentionShapes[] = {{"hs64", 8, 1024, 768, 12},
                                               {"hs128", 4, 1024, 2048, 16}};

// pass: 0 forward, 1 backward, 2 both. Q, K, V and the output in the dtype of the run each kernel
// serves: bf16 for the tensor-core ones (a bf16 run's), fp32 for the reference.
void BM_GpuAttention(benchmark::State& state, AttentionKernel kind, const AttentionShape& s,
                     int pass) {
  const bool bf16_run = kind != AttentionKernel::reference;
  const std::size_t btc = std::size_t(s.B) * s.T * s.C, rows = std::size_t(s.B) * s.NH * s.T;
  const std::size_t n32 = bf16_run ? 1 : btc, n16 = bf16_run ? btc : 1;
  DeviceArray<float> qkv32(3 * n32), out32(n32), lse(rows), dout(btc), dqkv(3 * btc), delta(rows);
  DeviceArray<bf16> qkv16(3 * n16), out16(n16);
  auto typed = [bf16_run](DeviceArray<bf16>& h, DeviceArray<float>& f) {
    return bf16_run ? ActView(static_cast<bf16*>(h)) : ActView(static_cast<float*>(f));
  };
  const ActView qkv = typed(qkv16, qkv32), out = typed(out16, out32);
  const auto& ctx = cuda_ctx();
  auto forward = [&] {
    if (kind == AttentionKernel::cudnn)
      cudnn_kernels().attention_forward(out, lse, qkv, s.B, s.T, s.C, s.NH);
    else if (kind == AttentionKernel::own)
      gpu::tc_flash_attention_forward(ctx, out, lse, qkv, s.B, s.T, s.C, s.NH);
    else
      gpu::flash_attention_forward(ctx, out, lse, qkv, s.B, s.T, s.C, s.NH);
  };
  auto backward = [&] {
    if (kind == AttentionKernel::cudnn)
      cudnn_kernels().attention_backward(dqkv, delta, dout, qkv, lse, out, s.B, s.T, s.C, s.NH);
    else if (kind == AttentionKernel::own)
      gpu::tc_flash_attention_backward(ctx, dqkv, delta, dout, qkv, out, lse, s.B, s.T, s.C, s.NH);
    else
      gpu::flash_attention_backward(ctx, dqkv, delta, dout, qkv, out, lse, s.B, s.T, s.C, s.NH);
  };
  forward();  // the out and lse that backward reads
  const double seconds = time_passes(state, [&] {
    if (pass != 1) forward();
    if (pass != 0) backward();
  });
  const double fwd_flops = 2.0 * s.B * double(s.T) * s.T * s.C;
  set_rate(state, fwd_flops * (pass == 0 ? 1.0 : pass == 1 ? 2.5 : 3.5), seconds, bf16_run);
}

struct Linear {
  const char* name;
  int K, OC;
  bool gelu;
};

// The forward writes what a bf16 run's layer writes: the FC layer (with GELU) its pre-GELU and
// GELU outputs in bf16, the others fp32.
void BM_GpuGemmBf16(benchmark::State& state, const Linear& g, bool backward) {
  const int N = 8 * 1024, K = g.K, OC = g.OC;
  const std::size_t nk = std::size_t(N) * K, no = std::size_t(N) * OC, ok = std::size_t(OC) * K;
  DeviceArray<bf16> inp(nk), w(ok), dout(no), out16(g.gelu ? no : 1), gelu16(g.gelu ? no : 1);
  DeviceArray<float> bias(OC), out32(g.gelu ? 1 : no), f32(g.gelu ? no : 1), dinp(nk), dw(ok);
  const ActView out =
      g.gelu ? ActView(static_cast<bf16*>(out16)) : ActView(static_cast<float*>(out32));
  const ActView gelu_out = g.gelu ? ActView(static_cast<bf16*>(gelu16)) : ActView{};
  Kernels& k = kernels();
  const double seconds = time_passes(state, [&] {
    if (!backward) {
      k.matmul_bf16_forward(out, gelu_out, inp, w, bias, N, K, OC, nullptr, 0, f32);
    } else {  // dinp[N,K] = dout[N,OC] W[OC,K]; dweight[OC,K] += dout^T inp
      k.gemm_bf16(false, false, N, K, OC, dout, w, dinp, DType::f32, false, nullptr, 0);
      k.gemm_bf16(true, false, OC, K, N, dout, inp, dw, DType::f32, true, nullptr, 0);
    }
  });
  set_rate(state, 2.0 * N * double(K) * OC * (backward ? 2 : 1), seconds, true);
}

void BM_GpuElementwise(benchmark::State& state, const std::string& kernel) {
  constexpr int kFc1 = 4 * 768;  // fc1's output columns; its rows: 8 x 1024 tokens
  const bool mlp = kernel.rfind("gelu_", 0) == 0;  // on fc1's output [8192, kFc1]
  const std::int64_t n = std::int64_t(8) * 1024 * (mlp ? kFc1 : 768);
  DeviceArray<float> a{std::size_t(n)}, b{std::size_t(n)}, c{std::size_t(n)};
  DeviceArray<bf16> h{std::size_t(n)}, h_in{std::size_t(kernel == "round_to_bf16" ? 1 : n)};
  DeviceArray<float> dbias{std::size_t(kFc1)};
  Kernels& k = kernels();
  double bytes = 0;  // per pass, each tensor once
  std::function<void()> pass;
  if (kernel == "gelu_backward") {  // read inp, dout, dinp; write dinp
    pass = [&] { k.gelu_backward(c, a, b, n); };
    bytes = 16.0 * double(n);
  } else if (kernel == "gelu_backward_bf16_bias_grad") {  // read bf16 inp, dout; write bf16
    pass = [&] {
      k.gelu_backward_bf16_bias_grad(h, dbias, c, static_cast<bf16*>(h_in), b,
                                     std::size_t(n / kFc1), kFc1);
    };
    bytes = 8.0 * double(n);
  } else if (kernel == "gelu_forward_bf16") {  // read bf16 fc1 output, write bf16 GELU
    pass = [&] { k.gelu_forward(static_cast<bf16*>(h), static_cast<bf16*>(h_in), n); };
    bytes = 4.0 * double(n);
  } else if (kernel == "residual") {  // a bf16 run's: read fp32 a, bf16 b; write bf16
    pass = [&] { k.residual_forward(static_cast<bf16*>(h), a, static_cast<bf16*>(h_in), n); };
    bytes = 8.0 * double(n);
  } else if (kernel == "xent_grad_bf16") {  // read bf16 logits twice, write bf16 dlogits over them
    constexpr std::size_t rows = 1334, V = 50304;
    DeviceArray<float> losses{rows};
    DeviceArray<bf16> logits{rows * V};  // each pass leaves gradients: logits as good as any
    std::vector<std::int32_t> picks(rows);
    for (std::size_t r = 0; r < rows; ++r) picks[r] = std::int32_t(r * 7919 % V);
    const DeviceArray<std::int32_t> targets{picks};
    const double seconds = time_passes(
        state, [&] { k.softmax_crossentropy_grad_bf16(logits, losses, targets, rows, V); });
    state.counters["GBps"] = 6.0 * double(rows * V) * double(state.iterations()) / seconds * 1e-9;
    return;
  } else {  // round_to_bf16: read fp32, write bf16
    pass = [&] { k.round_to_bf16(h, a, std::size_t(n)); };
    bytes = 6.0 * double(n);
  }
  const double seconds = time_passes(state, pass);
  state.counters["GBps"] = bytes * double(state.iterations()) / seconds * 1e-9;
}

template <class Fn>
void add(const std::string& name, Fn fn) {
  benchmark::RegisterBenchmark(name.c_str(), fn)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

void register_gpu_benchmarks() {
  const char* passes[] = {"forward", "backward", "forward_backward"};
  std::vector<AttentionKernel> kinds = {AttentionKernel::reference, AttentionKernel::own};
#if STRATA_HAVE_CUDNN
  kinds.push_back(AttentionKernel::cudnn);
#endif
  for (const AttentionKernel kind : kinds)
    for (const AttentionShape& s : kAttentionShapes)
      for (int p = 0; p < 3; ++p)
        add(std::string("BM_GpuAttention/") + attention_kernel_name(kind) + "/" + s.name + "/" +
                passes[p],
            [kind, s, p](benchmark::State& st) { BM_GpuAttention(st, kind, s, p); });
  const Linear linears[] = {{"qkv", 768, 2304, false},
                            {"attn_proj", 768, 768, false},
                            {"fc1", 768, 3072, true},
                            {"fc2", 3072, 768, false}};
  for (const Linear& g : linears)
    for (const bool bwd : {false, true})
      add(std::string("BM_GpuGemmBf16/") + g.name + (bwd ? "/backward" : "/forward"),
          [g, bwd](benchmark::State& st) { BM_GpuGemmBf16(st, g, bwd); });
  for (const char* k : {"gelu_forward_bf16", "gelu_backward", "gelu_backward_bf16_bias_grad",
                        "residual", "round_to_bf16", "xent_grad_bf16"})
    add(std::string("BM_GpuElementwise/") + k,
        [k](benchmark::State& st) { BM_GpuElementwise(st, k); });
}

}  // namespace strata::bench
