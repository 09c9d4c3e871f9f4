// CudaKernels (cuda/kernels.hpp), part 2: the elementwise steps of the model's passes. Each result
// is rounded as the CPU backend rounds it (cpu/cpu_kernels.cpp): __fmul_rn / __fadd_rn are never
// contracted into an FMA, so elementwise results are the CPU's bit for bit. The bias gradient sums
// chunks of rows in parallel and adds the chunk sums in order, as the CPU does (Kernels::
// bias_grad). The scatter-adds (embedding and position gradients) give each output element to one
// thread that adds in the CPU's row order: deterministic, bit for bit, with bf16 rounded per
// addition, and no atomics (a bf16 atomic add would round in a run-dependent order). The
// cross-entropy reductions run one block per row.
#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/gelu.cuh"
#include "backends/cuda/grid.cuh"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/launch.cuh"
#include "strata/device.hpp"

namespace strata::cuda {
namespace {

// A table given to this backend: device memory, fp32 or bf16. Returns whether it is bf16.
bool table_is_bf16(const char* op, BufferView t) {
  if (t.device != Device::cuda)
    throw Error(std::string(op) + ": a table in " + device_name(t.device) +
                    " memory given to the cuda backend",
                "the table must be a Device::cuda buffer");
  if (t.dtype != DType::f32 && t.dtype != DType::bf16)
    throw Error(std::string(op) + ": a " + dtype_name(t.dtype) + " table on the cuda backend",
                "fp32 or bf16 tables");
  return t.dtype == DType::bf16;
}

// --- per-element kernels over [0, rows * C)
__global__ void add_bias_kernel(float* out, const float* bias, std::size_t n, int C) {
  STRATA_GRID_STRIDE(i, n) { out[i] = __fadd_rn(out[i], bias[i % C]); }
}
__global__ void add_into_bf16_kernel(std::uint16_t* dst, const float* src, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) { dst[i] = float_to_bf16(__fadd_rn(bf16_to_float(dst[i]), src[i])); }
}
// v = token - v0 wraps (size_t) for tokens below v0, so one compare tests the shard.
__global__ void embedding_rows_kernel(float* rows, const std::int32_t* tokens, std::size_t n,
                                      const void* wte, bool bf16, std::size_t v0, std::size_t Vl,
                                      int C) {
  STRATA_GRID_STRIDE(i, n) {
    const std::size_t v = std::size_t(tokens[i / C]) - v0;
    rows[i] = v < Vl ? load(wte, bf16, v * C + i % C) : 0.0f;
  }
}
__global__ void add_positions_kernel(void* out, bool out_bf16, const float* x, const void* wpe,
                                     bool bf16, std::size_t n, std::size_t row0, int T, int C) {
  STRATA_GRID_STRIDE(i, n) {
    const std::size_t pos = (row0 + i / C) % std::size_t(T);
    store(out, out_bf16, i, __fadd_rn(x[i], load(wpe, bf16, pos * C + i % C)));
  }
}

// Column sums in Kernels::bias_grad's order, in two launches: every (chunk of kBiasGradRows rows,
// column) summed from 0 in row order into a [chunks, C] scratch, then each column's chunk sums
// added to dbias in chunk order. A block of the first is 32 columns (a warp reads 128 coalesced
// bytes of a row) x 8 chunks. On an H100, gpt2-124m bf16 micro-batch 8 (8192 rows, 48 calls a
// step): one thread per column adding all rows took 43.7 ms of a 131 ms step; one block of 32
// warps per 32 columns, chunk sums added by warp 0, 6.2 ms, since C / 32 blocks (24 for C = 768)
// leave most of the 132 SMs idle. Here the first launch has C x chunks threads.
constexpr int kBiasGradChunksPerBlock = 8;
// out[k * C + c] = sum of rows [64 k, 64 k + 64) of column c, with `bf16_out` (when not null)
// the bf16 rounding of every element summed (the GEMMs' operand). With `gelu_inp` the element
// summed is GELU'(gelu_inp) * dout, added to 0 as gelu_backward adds it into zeros: the GELU's
// backward fused with the next linear layer's operand and bias gradient.
__global__ void bias_chunk_sums_kernel(float* out, std::uint16_t* bf16_out, const float* dout,
                                       const void* gelu_inp, bool gelu_bf16, std::size_t rows,
                                       int C) {
  const int c = int(blockIdx.x) * 32 + int(threadIdx.x);
  const std::size_t k = std::size_t(blockIdx.y) * kBiasGradChunksPerBlock + threadIdx.y;
  const std::size_t begin = k * kBiasGradRows;
  if (c >= C || begin >= rows) return;
  const std::size_t end = begin + kBiasGradRows < rows ? begin + kBiasGradRows : rows;
  float sum = 0.0f;
  for (std::size_t n = begin; n < end; ++n) {
    float v = dout[n * C + c];
    if (gelu_inp) v = __fadd_rn(0.0f, gelu_local_grad(load(gelu_inp, gelu_bf16, n * C + c)) * v);
    if (bf16_out) bf16_out[n * C + c] = float_to_bf16(v);
    sum = __fadd_rn(sum, v);
  }
  out[k * C + c] = sum;
}
// dst[c] += chunk sums of column c, in chunk order (add_chunk_sums).
__global__ void add_chunk_sums_kernel(float* dst, const float* sums, std::size_t chunks,
                                      std::size_t stride, int C) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float s = dst[c];
  for (std::size_t k = 0; k < chunks; ++k) s = __fadd_rn(s, sums[k * stride + c]);
  dst[c] = s;
}

// --- scatter-adds: one thread per output element, adding its rows in ascending order
// The embedding's rows by token, in two launches. First each position n of a token in the shard
// gets the next position of the same token (N where there is none) and whether it is the token's
// first; the tokens compared in tiles of kThreads through shared memory (N^2 comparisons: 67M for
// a micro-batch of 8 x 1024 tokens). Then the thread (first position n, column c) adds its
// token's rows along those links, in the order of n. One thread per column adding all N rows
// took N dependent global loads in a row; this keeps the CPU's order, with distinct tokens x C
// threads at once.
__global__ void token_links_kernel(std::int32_t* next, std::uint8_t* first,
                                   const std::int32_t* tokens, int N, std::size_t v0,
                                   std::size_t Vl) {
  __shared__ std::int32_t tile[kThreads];
  const int n = int(blockIdx.x) * kThreads + int(threadIdx.x);
  const std::int32_t token = n < N ? tokens[n] : 0;
  const bool mine = n < N && std::size_t(token) - v0 < Vl;
  int after = N;
  bool earlier = false;
  for (int t0 = 0; t0 < N; t0 += kThreads) {
    __syncthreads();
    if (t0 + int(threadIdx.x) < N) tile[threadIdx.x] = tokens[t0 + int(threadIdx.x)];
    __syncthreads();
    const int count = N - t0 < kThreads ? N - t0 : kThreads;
    for (int i = 0; i < count && mine; ++i) {
      const int m = t0 + i;
      if (tile[i] != token) continue;
      if (m < n) earlier = true;
      if (m > n && m < after) after = m;
    }
  }
  if (n >= N) return;
  next[n] = after;
  first[n] = mine && !earlier;
}
__global__ void embedding_backward_kernel(void* gwte, bool bf16, const float* d,
                                          const std::int32_t* tokens, const std::int32_t* next,
                                          const std::uint8_t* first, int N, std::size_t v0, int C) {
  const int c = int(blockIdx.y) * 32 + int(threadIdx.x);
  const int n0 = int(blockIdx.x) * int(blockDim.y) + int(threadIdx.y);
  if (c >= C || n0 >= N || !first[n0]) return;
  const std::size_t at = (std::size_t(tokens[n0]) - v0) * C + c;
  float g = load(gwte, bf16, at);
  for (int n = n0; n < N; n = next[n]) {
    g = __fadd_rn(g, d[std::size_t(n) * C + c]);
    if (bf16) g = bf16_to_float(float_to_bf16(g));  // rounded per addition, as stored
  }
  store(gwte, bf16, at, g);
}
// One thread per (position p, column c): rows i with (row0 + i) % T == p, ascending.
__global__ void positions_backward_kernel(void* gwpe, bool bf16, const float* d, std::size_t rows,
                                          std::size_t row0, int T, int C) {
  STRATA_GRID_STRIDE(j, std::size_t(T) * C) {
    const std::size_t p = j / C, c = j % C;
    const std::size_t first = (p + T - row0 % T) % T;
    for (std::size_t i = first; i < rows; i += T)
      store(gwpe, bf16, j, __fadd_rn(load(gwpe, bf16, j), d[i * C + c]));
  }
}

// --- cross-entropy: one block of kThreads per row; E the logits' element, float or a bf16's 16
// bits (the bf16 head's logits, widened as read).
template <class E>
__global__ void row_max_kernel(float* mx, const E* logits, std::size_t Vl) {
  const E* x = logits + blockIdx.x * Vl;
  float m = -INFINITY;
  for (std::size_t i = threadIdx.x; i < Vl; i += kThreads) m = fmaxf(m, widen(x[i]));
  m = block_reduce(m, true);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}
// fp32 logits: the exps written over them, the target's logit read by the thread that overwrites
// it, before it does; bf16 logits: read only.
template <class E>
__global__ void xent_exp_kernel(E* probs, float* sum, float* target, const float* mx,
                                const std::int32_t* targets, std::size_t v0, std::size_t Vl) {
  const std::size_t row = blockIdx.x;
  E* x = probs + row * Vl;
  const float m = mx[row];
  const std::size_t v = std::size_t(targets[row]) - v0;
  if (threadIdx.x == 0 && v >= Vl) target[row] = 0.0f;
  float s = 0.0f;
  for (std::size_t i = threadIdx.x; i < Vl; i += kThreads) {
    const float shifted = widen(x[i]) - m;
    if (i == v) target[row] = shifted;
    const float e = expf(shifted);
    if constexpr (std::is_same_v<E, float>) x[i] = e;
    s += e;
  }
  s = block_reduce(s, false);
  if (threadIdx.x == 0) sum[row] = s;
}
// losses in fp32 (the CPU takes log(sum) - target in double: a few ulp apart).
__global__ void xent_normalise_kernel(float* probs, float* losses, const float* sum,
                                      const float* target, std::size_t N, std::size_t Vl) {
  const std::size_t n = N * Vl > N ? N * Vl : N;  // (std::max is host-only for nvcc)
  STRATA_GRID_STRIDE(i, n) {
    if (i < N * Vl) probs[i] = __fmul_rn(probs[i], 1.0f / sum[i / Vl]);
    if (i < N) losses[i] = logf(sum[i]) - target[i];
  }
}
__global__ void xent_backward_kernel(float* dlogits, const float* probs,
                                     const std::int32_t* targets, std::size_t v0, float scale,
                                     std::size_t N, std::size_t Vl) {
  STRATA_GRID_STRIDE(i, N * Vl) {
    const float g = __fmul_rn(probs[i], scale);
    const bool at_target = std::size_t(targets[i / Vl]) - v0 == i % Vl;
    dlogits[i] = at_target ? __fadd_rn(g, -scale) : g;
  }
}

// --- the bf16 head's cross-entropy: bf16(softmax - onehot), unscaled (kernels.hpp)
__device__ __forceinline__ std::uint16_t grad_bf16(float e, float inv, bool at_target) {
  const float p = __fmul_rn(e, inv);
  return float_to_bf16(at_target ? __fadd_rn(p, -1.0f) : p);
}
// One block per row, two reads of the bf16 logits: the max and the sum of exp in one pass (each
// thread's running sum rescaled when its max rises, as an online softmax does), then
// bf16(exp(x - max) / sum - onehot) written over them. The exps are the three-pass kernel's, bit
// for bit (the same block max); only the sum's rounding differs, by a few ulp. On a gpt2 head (V
// 50304) that is 3 x 2 bytes of traffic an element (the GEMM's bf16 output read twice, the
// gradient written), where fp32 logits read twice took 2 x 4 + 2 and before that 4 x 4 + 2.
__global__ void xent_grad_bf16_kernel(std::uint16_t* logits, float* losses,
                                      const std::int32_t* targets, std::size_t V) {
  const std::size_t row = blockIdx.x;
  std::uint16_t* x = logits + row * V;
  const std::size_t t = std::size_t(targets[row]);
  const float at_target = bf16_to_float(x[t]);  // read before the row is overwritten
  float m = -INFINITY, s = 0.0f;
  for (std::size_t i = threadIdx.x; i < V; i += kThreads) {
    const float xi = bf16_to_float(x[i]);
    if (xi > m) {
      s = __fadd_rn(__fmul_rn(s, expf(m - xi)), 1.0f);
      m = xi;
    } else {
      s = __fadd_rn(s, expf(xi - m));
    }
  }
  const float mx = block_reduce(m, true);
  s = block_reduce(m == -INFINITY ? 0.0f : __fmul_rn(s, expf(m - mx)), false);
  const float inv = 1.0f / s;
  for (std::size_t i = threadIdx.x; i < V; i += kThreads)
    x[i] = grad_bf16(expf(bf16_to_float(x[i]) - mx), inv, i == t);
  if (threadIdx.x == 0) losses[row] = logf(s) - (at_target - mx);
}
// xent_exp's exps again from the bf16 logits, then the gradient over them.
__global__ void xent_normalise_grad_bf16_kernel(std::uint16_t* logits, float* losses,
                                                const float* mx, const float* sum,
                                                const float* target, const std::int32_t* targets,
                                                std::size_t v0, std::size_t N, std::size_t Vl) {
  const std::size_t n = N * Vl > N ? N * Vl : N;
  STRATA_GRID_STRIDE(i, n) {
    if (i < N * Vl) {
      const std::size_t row = i / Vl;
      const float e = expf(bf16_to_float(logits[i]) - mx[row]);
      logits[i] = grad_bf16(e, 1.0f / sum[row], std::size_t(targets[row]) - v0 == i % Vl);
    }
    if (i < N) losses[i] = logf(sum[i]) - target[i];
  }
}
__global__ void scale_bf16_kernel(std::uint16_t* x, float scale, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) { x[i] = float_to_bf16(__fmul_rn(bf16_to_float(x[i]), scale)); }
}

}  // namespace

void* stream_scratch(std::size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  STRATA_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  return p;
}
void add_chunk_sums(float* dst, const float* sums, std::size_t chunks, std::size_t stride, int C,
                    cudaStream_t stream) {
  if (C <= 0) return;
  STRATA_LAUNCH(add_chunk_sums_kernel, unsigned((C + 127) / 128), 128, 0, stream)
  (dst, sums, chunks, stride, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

void CudaKernels::add_bias(float* out, const float* bias, std::size_t rows, int C) {
  if (rows == 0 || C <= 0) return;
  STRATA_LAUNCH(add_bias_kernel, blocks_for(rows * C), kThreads, 0, ctx_.stream)
  (out, bias, rows * C, C);
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::bias_grad(float* dbias, const float* dout, std::size_t rows, int C) {
  bias_grad_rounding(dbias, nullptr, dout, rows, C);
}
void CudaKernels::round_to_bf16_bias_grad(bf16* out, float* dbias, const float* dout,
                                          std::size_t rows, int C) {
  bias_grad_rounding(dbias, out, dout, rows, C);
}
void CudaKernels::gelu_backward_bf16_bias_grad(bf16* out, float* dbias, float* /*scratch*/,
                                               ActView inp, const float* dout, std::size_t rows,
                                               int C) {
  bias_grad_rounding(dbias, out, dout, rows, C, inp);
}
// The chunk sums are scratch for the two launches (rows / 64 x C floats, 1/16 of dout).
void CudaKernels::bias_grad_rounding(float* dbias, bf16* dout_bf16, const float* dout,
                                     std::size_t rows, int C, ActView gelu_inp) {
  if (rows == 0 || C <= 0) return;
  const std::size_t chunks = (rows + kBiasGradRows - 1) / kBiasGradRows;
  auto* sums =
      static_cast<float*>(stream_scratch(chunks * std::size_t(C) * sizeof(float), ctx_.stream));
  const dim3 grid(unsigned((C + 31) / 32),
                  unsigned((chunks + kBiasGradChunksPerBlock - 1) / kBiasGradChunksPerBlock));
  STRATA_LAUNCH(bias_chunk_sums_kernel, grid, dim3(32, kBiasGradChunksPerBlock), 0, ctx_.stream)
  (sums, reinterpret_cast<std::uint16_t*>(dout_bf16), dout, gelu_inp.data, gelu_inp.is_bf16(), rows,
   C);
  STRATA_CUDA_CHECK_LAUNCH();
  add_chunk_sums(dbias, sums, chunks, std::size_t(C), C, ctx_.stream);
  STRATA_CUDA_CHECK(cudaFreeAsync(sums, ctx_.stream));
}
void CudaKernels::add_into_bf16(bf16* dst, const float* src, std::size_t n) {
  if (n == 0) return;
  STRATA_LAUNCH(add_into_bf16_kernel, blocks_for(n), kThreads, 0, ctx_.stream)
  (reinterpret_cast<std::uint16_t*>(dst), src, n);
  STRATA_CUDA_CHECK_LAUNCH();
}

void CudaKernels::embedding_rows(float* rows, const std::int32_t* tokens, std::size_t N,
                                 BufferView wte, std::size_t v0, std::size_t Vl, int C) {
  const bool bf16 = table_is_bf16("embedding_rows", wte);
  if (N == 0 || C <= 0) return;
  STRATA_LAUNCH(embedding_rows_kernel, blocks_for(N * C), kThreads, 0, ctx_.stream)
  (rows, tokens, N * C, wte.data, bf16, v0, Vl, C);
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::add_positions(ActView out, const float* x, BufferView wpe, std::size_t rows,
                                std::size_t row0, int T, int C) {
  const bool bf16 = table_is_bf16("add_positions", wpe);
  if (rows == 0 || C <= 0) return;
  STRATA_LAUNCH(add_positions_kernel, blocks_for(rows * C), kThreads, 0, ctx_.stream)
  (out.data, out.is_bf16(), x, wpe.data, bf16, rows * C, row0, T, C);
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::embedding_rows_backward(BufferView gwte, const float* d,
                                          const std::int32_t* tokens, std::size_t N, std::size_t v0,
                                          std::size_t Vl, int C) {
  const bool bf16 = table_is_bf16("embedding_rows_backward", gwte);
  if (N == 0 || C <= 0) return;
  if (N > std::size_t(std::numeric_limits<std::int32_t>::max()))
    throw Error("embedding_rows_backward: " + std::to_string(N) + " tokens",
                "at most 2^31 - 1 tokens a micro-batch");
  // The links are scratch for the two launches (5 bytes a token).
  auto* next = static_cast<std::int32_t*>(stream_scratch(N * 5, ctx_.stream));
  auto* first = reinterpret_cast<std::uint8_t*>(next + N);
  const int n = int(N);
  STRATA_LAUNCH(token_links_kernel, unsigned((n + kThreads - 1) / kThreads), kThreads, 0,
                ctx_.stream)
  (next, first, tokens, n, v0, Vl);
  STRATA_CUDA_CHECK_LAUNCH();
  constexpr int kRows = kThreads / 32;  // a block: 32 columns x kRows positions
  const dim3 grid(unsigned((n + kRows - 1) / kRows), unsigned((C + 31) / 32));
  STRATA_LAUNCH(embedding_backward_kernel, grid, dim3(32, kRows), 0, ctx_.stream)
  (gwte.data, bf16, d, tokens, next, first, n, v0, C);
  STRATA_CUDA_CHECK_LAUNCH();
  STRATA_CUDA_CHECK(cudaFreeAsync(next, ctx_.stream));
}
void CudaKernels::positions_backward(BufferView gwpe, const float* d, std::size_t rows,
                                     std::size_t row0, int T, int C) {
  const bool bf16 = table_is_bf16("positions_backward", gwpe);
  if (rows == 0 || C <= 0 || T <= 0) return;
  STRATA_LAUNCH(positions_backward_kernel, blocks_for(std::size_t(T) * C), kThreads, 0, ctx_.stream)
  (gwpe.data, bf16, d, rows, row0, T, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

void CudaKernels::xent_row_max(float* mx, ActView logits, std::size_t N, std::size_t Vl) {
  if (N == 0) return;
  with_element_type(logits.is_bf16(), [&](auto type) {
    using E = typename decltype(type)::type;
    STRATA_LAUNCH(row_max_kernel<E>, unsigned(N), kThreads, 0, ctx_.stream)
    (mx, static_cast<const E*>(logits.data), Vl);
  });
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::xent_exp(ActView probs, float* sum, float* target, const float* mx,
                           const std::int32_t* targets, std::size_t v0, std::size_t N,
                           std::size_t Vl) {
  if (N == 0) return;
  with_element_type(probs.is_bf16(), [&](auto type) {
    using E = typename decltype(type)::type;
    STRATA_LAUNCH(xent_exp_kernel<E>, unsigned(N), kThreads, 0, ctx_.stream)
    (static_cast<E*>(probs.data), sum, target, mx, targets, v0, Vl);
  });
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::xent_normalise(float* probs, float* losses, const float* sum, const float* target,
                                 std::size_t N, std::size_t Vl) {
  if (N == 0) return;
  // Vl may be 0 (an empty shard) and the losses still need writing: cover max(N, N * Vl).
  STRATA_LAUNCH(xent_normalise_kernel, blocks_for(N * std::max<std::size_t>(Vl, 1)), kThreads, 0,
                ctx_.stream)
  (probs, losses, sum, target, N, Vl);
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::xent_backward_shard(float* dlogits, const float* probs,
                                      const std::int32_t* targets, std::size_t v0, float scale,
                                      std::size_t N, std::size_t Vl) {
  if (N == 0 || Vl == 0) return;
  STRATA_LAUNCH(xent_backward_kernel, blocks_for(N * Vl), kThreads, 0, ctx_.stream)
  (dlogits, probs, targets, v0, scale, N, Vl);
  STRATA_CUDA_CHECK_LAUNCH();
}

void CudaKernels::softmax_crossentropy_grad_bf16(bf16* logits, float* losses,
                                                 const std::int32_t* targets, std::size_t N,
                                                 std::size_t V) {
  if (N == 0 || V == 0) return;
  STRATA_LAUNCH(xent_grad_bf16_kernel, unsigned(N), kThreads, 0, ctx_.stream)
  (reinterpret_cast<std::uint16_t*>(logits), losses, targets, V);
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::xent_normalise_grad_bf16(bf16* logits, float* losses, const float* mx,
                                           const float* sum, const float* target,
                                           const std::int32_t* targets, std::size_t v0,
                                           std::size_t N, std::size_t Vl) {
  if (N == 0) return;
  STRATA_LAUNCH(xent_normalise_grad_bf16_kernel, blocks_for(N * std::max<std::size_t>(Vl, 1)),
                kThreads, 0, ctx_.stream)
  (reinterpret_cast<std::uint16_t*>(logits), losses, mx, sum, target, targets, v0, N, Vl);
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::scale_bf16(bf16* x, float scale, std::size_t n) {
  if (n == 0) return;
  STRATA_LAUNCH(scale_bf16_kernel, blocks_for(n), kThreads, 0, ctx_.stream)
  (reinterpret_cast<std::uint16_t*>(x), scale, n);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda
