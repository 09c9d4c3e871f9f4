// CPU layer passes of the GPT-2 workload (see layers.hpp for shapes and the += convention).
//
// Threading: all parallelism comes from the BLAS library's own threads. Every matmul is one
// sgemm (cut into blocks of at most kGemmBlock rows, see gemm() below); attention
// issues one sgemm per (batch, head) that reads q/k/v straight out of qkv through leading
// dimensions (no copies). Elementwise kernels run on the calling thread.
// Measured on 2 cores (OpenBLAS pthreads, `small` preset, bench/bench_model.cpp): adding OpenMP
// threads, for attention (one (b, h) per thread, BLAS set to 1 thread) or for elementwise
// kernels, made the training step 10-40% slower, because OpenBLAS's workers keep spinning for a
// while after every call and then fight the OpenMP threads for the cores.
//
// Vectorisation: elementwise kernels are `#pragma omp simd` loops compiled for AVX-512 / AVX2 /
// baseline (STRATA_SIMD_CLONES, 5-10x faster than the baseline SSE2 build of the same loop);
// exp, sigmoid, sqrt and max use the vectorisable forms in vecmath.hpp.
#include "backends/cpu/layers.hpp"

#include <cblas.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "backends/cpu/vecmath.hpp"

namespace strata::cpu {

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr float kLayerNormEps = 1e-5f;

// max(x[0..n)), n >= 1, as a vectorisable integer max over order-preserving keys (a float max
// reduction does not vectorise without -ffinite-math-only).
inline float row_max(const float* x, int n) {
  std::int32_t k = vm::float_to_key(x[0]);
#pragma omp simd reduction(max : k)
  for (int i = 1; i < n; ++i) k = std::max(k, vm::float_to_key(x[i]));
  return vm::key_to_float(k);
}

// The most rows of C that one cblas_sgemm call computes.
//
// OpenBLAS packs operands into a buffer per BLAS thread (128 MiB reserved, resident as touched).
// Measured with /proc/self/status around single calls, the touched part grows with the rows of C
// (times min(K, its K block)): on 2 threads a 1024^3 GEMM touched 2.6 MiB, the small model's
// LM-head weight gradient (C of 4096 x 256, K = 1024) 7.4 MiB, 16384 rows 29 MiB, gpt2-124m's
// (50257 x 768) 87 MiB: memory no ledger sees, growing with the model. Cut into blocks of at
// most kGemmBlock rows, no call touches more than warm_up_gemm() does before the runtime baseline
// (measured over every transpose, K up to 8192, N up to 50000, on 1, 2, 4 and 8 threads). The
// blocks split M only, so every element is still one dot product over K in one call, and cost
// within +-2% (single-thread CPU time, gpt2-124m's shapes at 8192 tokens); splitting the columns
// too would have cost 7-10%, which is why the columns are covered by the warm-up instead.
constexpr int kGemmBlock = 1024;

// Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, kGemmBlock rows at a time.
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float* A,
          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  for (int m0 = 0; m0 < M; m0 += kGemmBlock) {
    const float* a = ta == CblasNoTrans ? A + std::int64_t(m0) * lda : A + m0;
    cblas_sgemm(CblasRowMajor, ta, tb, std::min(kGemmBlock, M - m0), N, K, alpha, a, lda, B, ldb,
                beta, C + std::int64_t(m0) * ldc, ldc);
  }
}

// Anonymous pages mapped at once (MAP_POPULATE: one call, not a page fault per page; why, at
// allocate_bytes in backends/backend.cpp). Read-only, every page reads as zero and takes no memory
// of its own (the kernel maps its shared zero page, though Linux 6.18 counts those in VmRSS until
// they are unmapped, before the runtime baseline is read), so a warm-up GEMM can read large
// operands without holding them; writable, they are zero-filled scratch, resident until released.
class Pages {
 public:
  enum Access { read_only, read_write };
  Pages(std::size_t count, Access access)
      : bytes_(count * sizeof(float)),
        p_(::mmap(nullptr, bytes_, access == read_only ? PROT_READ : PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0)) {
    if (p_ == MAP_FAILED) throw std::bad_alloc();
  }
  ~Pages() { ::munmap(p_, bytes_); }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  float* data() const { return static_cast<float*>(p_); }

 private:
  std::size_t bytes_;
  void* p_;
};

// --- Vectorised kernels over a range of rows or elements.

STRATA_SIMD_CLONES void layernorm_rows(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int n0, int n1,
                                       int C) {
  for (int n = n0; n < n1; ++n) {
    const float* x = inp + std::int64_t(n) * C;
    float* o = out + std::int64_t(n) * C;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int i = 0; i < C; ++i) m += x[i];
    m /= float(C);
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int i = 0; i < C; ++i) {
      const float d = x[i] - m;
      var += d * d;
    }
    var /= float(C);
    const float s = 1.0f / std::sqrt(var + kLayerNormEps);
#pragma omp simd
    for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

STRATA_SIMD_CLONES void layernorm_backward_rows(float* dinp, float* dweight, float* dbias,
                                                const float* dout, const float* inp,
                                                const float* weight, const float* mean,
                                                const float* rstd, int n0, int n1, int C) {
  for (int n = n0; n < n1; ++n) {
    const float* x = inp + std::int64_t(n) * C;
    const float* d = dout + std::int64_t(n) * C;
    float* dx = dinp + std::int64_t(n) * C;
    const float m = mean[n], s = rstd[n];
    // With xhat = (x - m) * s and g = dout * weight:  dx = s * (g - mean(g) - xhat * mean(g xhat))
    float gmean = 0.0f, gxmean = 0.0f;
#pragma omp simd reduction(+ : gmean, gxmean)
    for (int i = 0; i < C; ++i) {
      const float xhat = (x[i] - m) * s;
      const float g = d[i] * weight[i];
      gmean += g;
      gxmean += g * xhat;
    }
    gmean /= float(C);
    gxmean /= float(C);
#pragma omp simd
    for (int i = 0; i < C; ++i) {
      const float xhat = (x[i] - m) * s;
      dbias[i] += d[i];
      dweight[i] += d[i] * xhat;
      dx[i] += s * (d[i] * weight[i] - gmean - xhat * gxmean);
    }
  }
}

STRATA_SIMD_CLONES void add_rows(float* acc, const float* rows, int n0, int n1, int C) {
  for (int n = n0; n < n1; ++n) {
    const float* r = rows + std::int64_t(n) * C;
#pragma omp simd
    for (int i = 0; i < C; ++i) acc[i] += r[i];
  }
}

// GELU(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
STRATA_SIMD_CLONES void gelu_forward_range(float* out, const float* inp, std::int64_t i0,
                                           std::int64_t i1) {
#pragma omp simd
  for (std::int64_t i = i0; i < i1; ++i) {
    const float x = inp[i];
    const float s = vm::sigmoid_approx(2.0f * kGeluScale * (x + kGeluCubic * x * x * x));
    out[i] = x * s;
  }
}

// d/dx [x s(2u)] = s + x * 2 s (1 - s) * du/dx   (s(2u) = (1 + tanh u) / 2, 1 - tanh^2 = 4s(1-s))
STRATA_SIMD_CLONES void gelu_backward_range(float* dinp, const float* inp, const float* dout,
                                            std::int64_t i0, std::int64_t i1) {
#pragma omp simd
  for (std::int64_t i = i0; i < i1; ++i) {
    const float x = inp[i];
    const float s = vm::sigmoid_approx(2.0f * kGeluScale * (x + kGeluCubic * x * x * x));
    const float dudx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += (s + 2.0f * x * s * (1.0f - s) * dudx) * dout[i];
  }
}

STRATA_SIMD_CLONES void add_range(float* out, const float* a, const float* b, std::int64_t i0,
                                  std::int64_t i1) {
#pragma omp simd
  for (std::int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
}

STRATA_SIMD_CLONES void softmax_xent_rows(float* probs, float* losses, const float* logits,
                                          const std::int32_t* targets, int n0, int n1, int V) {
  for (int n = n0; n < n1; ++n) {
    const float* x = logits + std::int64_t(n) * V;
    float* p = probs + std::int64_t(n) * V;
    const float mx = row_max(x, V);
    const float xt = x[targets[n]];  // read before probs (which may alias logits) overwrites it
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; ++i) {
      const float e = vm::exp_approx(x[i] - mx);
      p[i] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int i = 0; i < V; ++i) p[i] *= inv;
    // -log softmax(x)_t = log(sum) - (x_t - max), without forming a tiny probability.
    losses[n] = float(std::log(double(sum)) - double(xt - mx));
  }
}

STRATA_SIMD_CLONES void xent_backward_rows(float* dlogits, const float* probs,
                                           const std::int32_t* targets, float grad_scale, int n0,
                                           int n1, int V) {
  for (int n = n0; n < n1; ++n) {
    const float* p = probs + std::int64_t(n) * V;
    float* d = dlogits + std::int64_t(n) * V;
#pragma omp simd
    for (int i = 0; i < V; ++i) d[i] += p[i] * grad_scale;
    d[targets[n]] -= grad_scale;
  }
}

// Causal softmax of a T x T score block in place: row t keeps columns 0..t, the rest become 0.
STRATA_SIMD_CLONES void causal_softmax(float* p, int T) {
  for (int t = 0; t < T; ++t) {
    float* row = p + std::int64_t(t) * T;
    const float mx = row_max(row, t + 1);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= t; ++j) {
      const float e = vm::exp_approx(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j <= t; ++j) row[j] *= inv;
#pragma omp simd
    for (int j = t + 1; j < T; ++j) row[j] = 0.0f;
  }
}

// Softmax backward in place: dS = P * (dP - rowsum(P * dP)), 0 above the diagonal.
STRATA_SIMD_CLONES void causal_softmax_backward(float* dp, const float* p, int T) {
  for (int t = 0; t < T; ++t) {
    const float* prow = p + std::int64_t(t) * T;
    float* row = dp + std::int64_t(t) * T;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j <= t; ++j) dot += prow[j] * row[j];
#pragma omp simd
    for (int j = 0; j <= t; ++j) row[j] = prow[j] * (row[j] - dot);
#pragma omp simd
    for (int j = t + 1; j < T; ++j) row[j] = 0.0f;
  }
}

STRATA_SIMD_CLONES void adamw_range(float* params, const float* grads, float* m, float* v,
                                    std::int64_t i0, std::int64_t i1, float lr, float beta1,
                                    float beta2, float eps, float decay, float grad_scale,
                                    float inv_bc1, float inv_bc2) {
#pragma omp simd
  for (std::int64_t i = i0; i < i1; ++i) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = vm::sqrt_nonneg(vi * inv_bc2) + eps;
    params[i] -= lr * (mi * inv_bc1 / denom + decay * params[i]);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Embedding

void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                     int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t row = std::int64_t(b) * T + t;
      add_range(out + row * C, wte + std::int64_t(tokens[row]) * C, wpe + std::int64_t(t) * C, 0,
                C);
    }
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                      int B, int T, int C) {
  // Sequential: repeated tokens scatter into the same dwte row.
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int64_t row = std::int64_t(b) * T + t;
      add_rows(dwte + std::int64_t(tokens[row]) * C, dout + row * C, 0, 1, C);
      add_rows(dwpe + std::int64_t(t) * C, dout + row * C, 0, 1, C);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm (biased variance, eps 1e-5, as torch.nn.LayerNorm)

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  layernorm_rows(out, mean, rstd, inp, weight, bias, 0, N, C);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  layernorm_backward_rows(dinp, dweight, dbias, dout, inp, weight, mean, rstd, 0, N, C);
}

// ---------------------------------------------------------------------------------------------
// Matmul: out = inp @ weight^T + bias, weight stored [OC, C] (the torch.nn.Linear layout)

void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
              const float* B, int ldb, float* C, int ldc, bool accumulate) {
  gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A,
       lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
  float beta = 0.0f;
  if (bias) {
    for (int n = 0; n < N; ++n) std::memcpy(out + std::int64_t(n) * OC, bias, sizeof(float) * OC);
    beta = 1.0f;
  }
  gemm(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
  if (dinp) {  // dinp[N,C] += dout[N,OC] @ weight[OC,C]
    gemm(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  }
  if (dweight) {  // dweight[OC,C] += dout^T @ inp[N,C]
    gemm(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  }
  if (dbias) add_rows(dbias, dout, 0, N, OC);
}

// ---------------------------------------------------------------------------------------------
// Causal self-attention. Per (b, h): S = q k^T / sqrt(hs) (T x T), P = causal softmax(S),
// out = P v. q, k, v are column blocks of qkv (leading dimension 3C), so nothing is copied.
// The full T x T product is computed and the upper triangle masked (P = 0 there), which is also
// what the FLOP formula counts; a future key therefore never reaches an earlier output.

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  // Heads are independent (each writes its own att block and output columns): in one-pool mode
  // they run in parallel, each GEMM on one BLAS thread; otherwise one head at a time on all of
  // them (the same arithmetic either way).
#pragma omp parallel for num_threads(blas_threads()) if (one_thread_pool()) schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + std::int64_t(b) * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = att + std::int64_t(bh) * T * T;
    gemm(CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, p, T);
    causal_softmax(p, T);
    gemm(CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, v, C3, 0.0f,
         out + std::int64_t(b) * T * C + h * hs, C);
  }
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  // As in forward: each head accumulates into its own columns of dqkv and its own datt block.
#pragma omp parallel for num_threads(blas_threads()) if (one_thread_pool()) schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const std::int64_t qoff = std::int64_t(b) * T * C3 + h * hs;
    const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
    const float* p = att + std::int64_t(bh) * T * T;
    float* ds = datt + std::int64_t(bh) * T * T;
    const float* dob = dout + std::int64_t(b) * T * C + h * hs;
    // dv += P^T dout; dP = dout v^T
    gemm(CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, dob, C, 1.0f, dv, C3);
    gemm(CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dob, C, v, C3, 0.0f, ds, T);
    causal_softmax_backward(ds, p, T);
    // S = scale q k^T: dq += scale dS k; dk += scale dS^T q
    gemm(CblasNoTrans, CblasNoTrans, T, hs, T, scale, ds, T, k, C3, 1.0f, dq, C3);
    gemm(CblasTrans, CblasNoTrans, T, hs, T, scale, ds, T, q, C3, 1.0f, dk, C3);
  }
}

// ---------------------------------------------------------------------------------------------
// Ring attention's blocks, per (sequence, query head) on BLAS as the attention above: the block's
// scores S = q k^T / sqrt(hs) (Tq x Tk), masked where a key's position is past the query's; each
// query row's log-sum-exp merged with the running one, lse' = log(e^lse + sum_j e^(s_j)), the
// running output scaled by e^(lse - lse') and P = e^(S - lse') v added. The backward is flash
// attention's with the merged lse: P = e^(S - lse), D = dout . out per row, dS = P (dout v^T - D)
// / sqrt(hs); dq += dS k, dk += dS^T q, dv += P^T dout. Heads of one K/V head run on one thread
// (their dk, dv are shared).

namespace {
float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// s [Tq, Tk] = scale q k^T with the keys a query may not see at -inf.
void block_scores(float* s, const float* q, int q_stride, const float* k, int kv_stride, int Tq,
                  int Tk, int hs, const int* qpos, const int* kpos) {
  gemm(CblasNoTrans, CblasTrans, Tq, Tk, hs, 1.0f / std::sqrt(float(hs)), q, q_stride, k, kv_stride,
       0.0f, s, Tk);
  for (int i = 0; i < Tq; ++i)
    for (int j = 0; j < Tk; ++j)
      if (kpos[j] > qpos[i]) s[std::int64_t(i) * Tk + j] = -INFINITY;
}
}  // namespace

void attention_block_forward(float* o, float* lse, const float* q, int q_stride, const float* kv,
                             int B, int Tq, int Tk, int NH, int KV, int hs, const int* qpos,
                             const int* kpos, bool first) {
  const int group = NH / KV, kv_stride = 2 * KV * hs, C = NH * hs;
#pragma omp parallel for num_threads(blas_threads()) if (one_thread_pool()) schedule(static)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const float* qb = q + std::int64_t(b) * Tq * q_stride + h * hs;
    const float* kb = kv + std::int64_t(b) * Tk * kv_stride + (h / group) * hs;
    float* ob = o + std::int64_t(b) * Tq * C + h * hs;
    std::vector<float> p(std::size_t(Tq) * Tk);
    block_scores(p.data(), qb, q_stride, kb, kv_stride, Tq, Tk, hs, qpos, kpos);
    for (int i = 0; i < Tq; ++i) {
      float* row = p.data() + std::int64_t(i) * Tk;
      float* l = lse + (std::int64_t(b) * NH + h) * Tq + i;
      float* oi = ob + std::int64_t(i) * C;
      const float mx = row_max(row, Tk);
      if (mx == -INFINITY) {  // no key of this block is visible: nothing to merge
        std::fill(row, row + Tk, 0.0f);
        if (first) std::fill(oi, oi + hs, 0.0f), *l = -INFINITY;
        continue;
      }
      float sum = 0.0f;
      for (int j = 0; j < Tk; ++j) sum += std::exp(row[j] - mx);  // exp(-inf) = 0
      const float block = mx + std::log(sum);
      const float merged =
          first ? block : std::max(*l, block) + std::log1p(std::exp(-std::fabs(*l - block)));
      const float keep = first ? 0.0f : std::exp(*l - merged);
      for (int c = 0; c < hs; ++c) oi[c] = first ? 0.0f : oi[c] * keep;
      for (int j = 0; j < Tk; ++j) row[j] = std::exp(row[j] - merged);
      *l = merged;
    }
    gemm(CblasNoTrans, CblasNoTrans, Tq, hs, Tk, 1.0f, p.data(), Tk, kb + KV * hs, kv_stride, 1.0f,
         ob, C);
  }
}

void attention_block_backward(float* dq, int dq_stride, float* dkv, const float* dout,
                              const float* out, const float* lse, const float* q, int q_stride,
                              const float* kv, int B, int Tq, int Tk, int NH, int KV, int hs,
                              const int* qpos, const int* kpos) {
  const float scale = 1.0f / std::sqrt(float(hs));
  const int group = NH / KV, kv_stride = 2 * KV * hs, C = NH * hs;
#pragma omp parallel for num_threads(blas_threads()) if (one_thread_pool()) schedule(static)
  for (int bg = 0; bg < B * KV; ++bg) {
    const int b = bg / KV, g = bg % KV;
    const float* kb = kv + std::int64_t(b) * Tk * kv_stride + g * hs;
    float* dkb = dkv + std::int64_t(b) * Tk * kv_stride + g * hs;
    std::vector<float> p(std::size_t(Tq) * Tk), ds(p.size());
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const std::int64_t at = std::int64_t(b) * Tq * C + h * hs;
      const float* qb = q + std::int64_t(b) * Tq * q_stride + h * hs;
      block_scores(p.data(), qb, q_stride, kb, kv_stride, Tq, Tk, hs, qpos, kpos);
      for (int i = 0; i < Tq; ++i) {
        const float l = lse[(std::int64_t(b) * NH + h) * Tq + i];
        for (int j = 0; j < Tk; ++j) {
          float& x = p[std::size_t(i) * Tk + j];
          x = x == -INFINITY ? 0.0f : std::exp(x - l);
        }
      }
      // dv += P^T dout; dP = dout v^T
      gemm(CblasTrans, CblasNoTrans, Tk, hs, Tq, 1.0f, p.data(), Tk, dout + at, C, 1.0f,
           dkb + KV * hs, kv_stride);
      gemm(CblasNoTrans, CblasTrans, Tq, Tk, hs, 1.0f, dout + at, C, kb + KV * hs, kv_stride, 0.0f,
           ds.data(), Tk);
      for (int i = 0; i < Tq; ++i) {
        const float D = dot(dout + at + std::int64_t(i) * C, out + at + std::int64_t(i) * C, hs);
        for (int j = 0; j < Tk; ++j) {
          const std::size_t e = std::size_t(i) * Tk + j;
          ds[e] = p[e] * (ds[e] - D) * scale;
        }
      }
      // dq += dS k; dk += dS^T q
      gemm(CblasNoTrans, CblasNoTrans, Tq, hs, Tk, 1.0f, ds.data(), Tk, kb, kv_stride, 1.0f,
           dq + std::int64_t(b) * Tq * dq_stride + h * hs, dq_stride);
      gemm(CblasTrans, CblasNoTrans, Tk, hs, Tq, 1.0f, ds.data(), Tk, qb, q_stride, 1.0f, dkb,
           kv_stride);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GELU (tanh approximation), residual

void gelu_forward(float* out, const float* inp, std::int64_t n) {
  gelu_forward_range(out, inp, 0, n);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  gelu_backward_range(dinp, inp, dout, 0, n);
}

void residual_forward(float* out, const float* a, const float* b, std::int64_t n) {
  add_range(out, a, b, 0, n);
}

// ---------------------------------------------------------------------------------------------
// The Llama block: RMSNorm, SwiGLU, rotary position embedding

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::int64_t(n) * C;
    float* o = out + std::int64_t(n) * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < C; ++i) ss += x[i] * x[i];
    const float s = 1.0f / std::sqrt(ss / float(C) + kLayerNormEps);
#pragma omp simd
    for (int i = 0; i < C; ++i) o[i] = x[i] * s * weight[i];
    rstd[n] = s;
  }
}

// With xhat = x * s and g = dout * weight:  dx = s * (g - xhat * mean(g xhat)).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* x = inp + std::int64_t(n) * C;
    const float* d = dout + std::int64_t(n) * C;
    float* dx = dinp + std::int64_t(n) * C;
    const float s = rstd[n];
    float gx = 0.0f;
#pragma omp simd reduction(+ : gx)
    for (int i = 0; i < C; ++i) gx += d[i] * weight[i] * x[i] * s;
    gx /= float(C);
#pragma omp simd
    for (int i = 0; i < C; ++i) {
      const float xhat = x[i] * s;
      dweight[i] += d[i] * xhat;
      dx[i] += s * (d[i] * weight[i] - xhat * gx);
    }
  }
}

namespace {
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void swiglu_forward(float* out, const float* gu, int N, int F) {
  for (int n = 0; n < N; ++n) {
    const float* gate = gu + std::int64_t(n) * 2 * F;
    const float* up = gate + F;
    float* o = out + std::int64_t(n) * F;
    for (int i = 0; i < F; ++i) o[i] = gate[i] * sigmoid(gate[i]) * up[i];
  }
}

// silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))).
void swiglu_backward(float* dgu, const float* gu, const float* dout, int N, int F) {
  for (int n = 0; n < N; ++n) {
    const float* gate = gu + std::int64_t(n) * 2 * F;
    const float* up = gate + F;
    const float* d = dout + std::int64_t(n) * F;
    float* dgate = dgu + std::int64_t(n) * 2 * F;
    float* dup = dgate + F;
    for (int i = 0; i < F; ++i) {
      const float sg = sigmoid(gate[i]);
      dgate[i] += d[i] * up[i] * (sg * (1.0f + gate[i] * (1.0f - sg)));
      dup[i] += d[i] * gate[i] * sg;
    }
  }
}

void router_topk_forward(float* probs, std::int32_t* experts, float* gates, const float* logits,
                         int N, int E, int k) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    std::int32_t* ex = experts + n * k;
    float* g = gates + n * k;
    float mx = l[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    for (int j = 0; j < k; ++j) {  // the j-th largest: the largest not yet taken, lower index first
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || ex[i] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = e;
      }
      ex[j] = best;
    }
    float gsum = 0.0f;  // the first choice holds the largest logit: every exp <= 1
    for (int j = 0; j < k; ++j) gsum += (g[j] = std::exp(l[ex[j]] - l[ex[0]]));
    for (int j = 0; j < k; ++j) g[j] /= gsum;
  }
}

void router_topk_backward(float* dlogits, const float* probs, const std::int32_t* experts,
                          const float* gates, const float* dgates, const float* dprobs, int N,
                          int E, int k) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float* p = probs + n * E;
    float* d = dlogits + n * E;
    float pdp = 0.0f;
    if (dprobs)
      for (int e = 0; e < E; ++e) pdp += p[e] * dprobs[n * E + e];
    for (int e = 0; e < E; ++e) d[e] = dprobs ? p[e] * (dprobs[n * E + e] - pdp) : 0.0f;
    const float* g = gates + n * k;
    const float* dg = dgates + n * k;
    float gdg = 0.0f;
    for (int j = 0; j < k; ++j) gdg += g[j] * dg[j];
    for (int j = 0; j < k; ++j) d[experts[n * k + j]] += g[j] * (dg[j] - gdg);
  }
}

namespace {
// E / (k seq) x the routing choices of expert e in sequence b.
float expert_fraction(const std::int32_t* choices, int b, int e, int seq, int E, int k) {
  return float(choices[std::int64_t(b) * E + e]) * (float(E) / float(std::int64_t(k) * seq));
}
}  // namespace

void moe_aux_loss_forward(float* loss, const float* probs, const std::int32_t* choices, int B,
                          int T, int seq, int E, int k, float coef) {
  for (int b = 0; b < B; ++b) {
    float l = 0.0f;
    for (int e = 0; e < E; ++e) {
      float P = 0.0f;
      for (std::int64_t t = 0; t < T; ++t) P += probs[(std::int64_t(b) * T + t) * E + e];
      l += expert_fraction(choices, b, e, seq, E, k) * (P / float(seq));
    }
    loss[b] = coef * l;
  }
}

void moe_aux_loss_backward(float* dprobs, const std::int32_t* choices, int B, int T, int seq, int E,
                           int k, float coef_scale) {
  for (int b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e)
        dprobs[(std::int64_t(b) * T + t) * E + e] =
            coef_scale * expert_fraction(choices, b, e, seq, E, k) / float(seq);
}

void moe_gather(float* out, const float* x, const std::int32_t* token_of, int rows, int C) {
  for (std::int64_t r = 0; r < rows; ++r)
    std::memcpy(out + r * C, x + std::int64_t(token_of[r]) * C, std::size_t(C) * sizeof(float));
}

void moe_gather_backward(float* dx, const float* din, const std::int32_t* row_of, int N, int k,
                         int C) {
  for (std::int64_t n = 0; n < N; ++n)
    for (int j = 0; j < k; ++j) {
      const std::int32_t r = row_of[n * k + j];
      if (r < 0) continue;
      for (int c = 0; c < C; ++c) dx[n * C + c] += din[std::int64_t(r) * C + c];
    }
}

void moe_combine(float* y, const float* eout, const std::int32_t* row_of, const float* gates, int N,
                 int k, int C) {
  for (std::int64_t n = 0; n < N; ++n) {
    float* out = y + n * C;
    std::fill(out, out + C, 0.0f);
    for (int j = 0; j < k; ++j) {
      const std::int32_t r = row_of[n * k + j];
      if (r < 0) continue;
      const float g = gates[n * k + j];
      for (int c = 0; c < C; ++c) out[c] += g * eout[std::int64_t(r) * C + c];
    }
  }
}

void moe_combine_backward(float* deout, float* dgates, const float* dy, const float* eout,
                          const std::int32_t* row_of, const float* gates, int N, int k, int C) {
  for (std::int64_t n = 0; n < N; ++n)
    for (int j = 0; j < k; ++j) {
      const std::int32_t r = row_of[n * k + j];
      float dot = 0.0f;
      if (r >= 0) {
        const float g = gates[n * k + j];
        for (int c = 0; c < C; ++c) {
          deout[std::int64_t(r) * C + c] = g * dy[n * C + c];
          dot += dy[n * C + c] * eout[std::int64_t(r) * C + c];
        }
      }
      dgates[n * k + j] = dot;
    }
}

void rope_table(float* table, int T, int hs, double theta) {
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < hs / 2; ++i) {
      const double angle = double(t) * std::pow(theta, -2.0 * i / hs);
      table[(std::int64_t(t) * (hs / 2) + i) * 2] = float(std::cos(angle));
      table[(std::int64_t(t) * (hs / 2) + i) * 2 + 1] = float(std::sin(angle));
    }
}

namespace {
// sign +1 turns by the angle, -1 back.
void rope_turn(float* x, const float* table, int N, int T, int row0, int heads, int hs,
               int row_stride, float sign) {
  for (int n = 0; n < N; ++n) {
    const float* cs = table + std::int64_t((row0 + n) % T) * hs;  // [hs/2, 2]
    for (int h = 0; h < heads; ++h) {
      float* p = x + std::int64_t(n) * row_stride + std::int64_t(h) * hs;
      for (int i = 0; i < hs / 2; ++i) {
        const float c = cs[2 * i], sn = sign * cs[2 * i + 1];
        const float a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * c - b * sn;
        p[2 * i + 1] = a * sn + b * c;
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, const float* table, int N, int T, int row0, int heads, int hs,
                  int row_stride) {
  rope_turn(x, table, N, T, row0, heads, hs, row_stride, 1.0f);
}
void rope_backward(float* dx, const float* table, int N, int T, int row0, int heads, int hs,
                   int row_stride) {
  rope_turn(dx, table, N, T, row0, heads, hs, row_stride, -1.0f);
}

void repeat_kv_forward(float* out, const float* in, int N, int NH, int KV, int hs) {
  const std::size_t C = std::size_t(NH) * hs, kv = std::size_t(KV) * hs;
  const int rep = NH / KV;
  for (std::size_t n = 0; n < std::size_t(N); ++n) {
    const float* i = in + n * (C + 2 * kv);
    float* o = out + n * 3 * C;
    std::memcpy(o, i, C * sizeof(float));
    for (int part = 1; part <= 2; ++part)  // k, v
      for (int h = 0; h < NH; ++h)
        std::memcpy(o + part * C + std::size_t(h) * hs,
                    i + C + (part - 1) * kv + std::size_t(h / rep) * hs, hs * sizeof(float));
  }
}

void repeat_kv_backward(float* din, const float* dout, int N, int NH, int KV, int hs) {
  const std::size_t C = std::size_t(NH) * hs, kv = std::size_t(KV) * hs;
  const int rep = NH / KV;
  for (std::size_t n = 0; n < std::size_t(N); ++n) {
    const float* d = dout + n * 3 * C;
    float* o = din + n * (C + 2 * kv);
    std::memcpy(o, d, C * sizeof(float));
    for (int part = 1; part <= 2; ++part)
      for (int g = 0; g < KV; ++g)
        for (int e = 0; e < hs; ++e) {
          float sum = 0.0f;
          for (int r = 0; r < rep; ++r) sum += d[part * C + std::size_t(g * rep + r) * hs + e];
          o[C + (part - 1) * kv + std::size_t(g) * hs + e] = sum;
        }
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax + cross-entropy over the vocabulary

void softmax_crossentropy_forward(float* probs, float* losses, const float* logits,
                                  const std::int32_t* targets, int N, int V) {
  softmax_xent_rows(probs, losses, logits, targets, 0, N, V);
}

void crossentropy_softmax_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                                   float grad_scale, int N, int V) {
  xent_backward_rows(dlogits, probs, targets, grad_scale, 0, N, V);
}

// ---------------------------------------------------------------------------------------------
// AdamW (decoupled weight decay, as torch.optim.AdamW):
//   g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + decay * p)

void adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t n, float lr,
                  float beta1, float beta2, float eps, float decay, int t, float grad_scale) {
  const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(beta1), t)));
  const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(beta2), t)));
  adamw_range(params, grads, m, v, 0, n, lr, beta1, beta2, eps, decay, grad_scale, inv_bc1,
              inv_bc2);
}

// ---------------------------------------------------------------------------------------------
// BLAS threads and the SGEMM peak

void warm_up_gemm() {
  // A kGemmBlock^3 GEMM touches what a block's rows need; a short one as wide as kGemmBlock
  // columns per BLAS thread touches what any number of columns needs (OpenBLAS splits the columns
  // among its threads; measured to saturate there on 2, 4 and 8 threads).
  const int n = kGemmBlock, wide = kGemmBlock * std::max(1, blas_threads()), rows = 64;
  const Pages a(std::size_t(n) * n, Pages::read_only), b(std::size_t(n) * wide, Pages::read_only);
  const Pages c(std::size_t(n) * n, Pages::read_write);
  const Pages c_wide(std::size_t(rows) * wide, Pages::read_write);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), wide,
              0.0f, c.data(), n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, wide, n, 1.0f, a.data(), n, b.data(),
              wide, 0.0f, c_wide.data(), wide);
}

double calibrate_sgemm_flops(double seconds_budget) {
  using clock = std::chrono::steady_clock;
  const int n = kGemmBlock;
  std::vector<float> a(std::size_t(n) * n), b(std::size_t(n) * n), c(std::size_t(n) * n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 13) * 0.01f;
    b[i] = float(i % 7) * 0.01f;
  }
  // Best rate sustained over blocks of several calls: one lucky ~20 ms call (a clock burst while
  // the other cores idle) would overstate the peak every MFU is divided by.
  const int calls_per_block = 4;
  const double flop = 2.0 * n * n * n * calls_per_block;
  double best = 0.0;
  const auto start = clock::now();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
              0.0f, c.data(), n);  // warms caches and wakes the BLAS threads: not counted
  for (int block = 0;; ++block) {
    const auto t0 = clock::now();
    for (int k = 0; k < calls_per_block; ++k)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                  n, 0.0f, c.data(), n);
    const auto t1 = clock::now();
    best = std::max(best, flop / std::chrono::duration<double>(t1 - t0).count());
    if (block >= 2 && std::chrono::duration<double>(t1 - start).count() >= seconds_budget) break;
  }
  return best;
}

// OpenMP gets the same count: oneDNN's bf16 GEMMs (gemm_bf16.cpp) run on OpenMP threads, and
// OpenBLAS here is its pthreads build, which leaves OpenMP alone. (omp_set_num_threads sets the
// calling thread's count; gemm_bf16 brings the count of any other calling thread to
// blas_threads().)
#if defined(STRATA_HAVE_OPENBLAS)
namespace {
int g_threads = 0;  // set_blas_threads(); 0: OpenBLAS's own default
bool g_one_pool = false;
}  // namespace
int blas_threads() { return g_threads > 0 ? g_threads : openblas_get_num_threads(); }
void set_blas_threads(int n) {
  g_threads = std::max(1, n);
  openblas_set_num_threads(g_one_pool ? 1 : g_threads);
  omp_set_num_threads(g_threads);
}
void set_one_thread_pool(bool on) {
  const int n = blas_threads();
  g_one_pool = on;
  set_blas_threads(n);
}
bool one_thread_pool() { return g_one_pool; }
#else
int blas_threads() { return 1; }
void set_blas_threads(int) { omp_set_num_threads(1); }
void set_one_thread_pool(bool) {}
bool one_thread_pool() { return false; }
#endif

}  // namespace strata::cpu
