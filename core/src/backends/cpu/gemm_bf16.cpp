// bf16 GEMMs on oneDNN's matmul primitive (see gemm_bf16.hpp).
//
// oneDNN 2.6 has no bf16 BLAS-like call, so each GEMM is a matmul primitive: transposes are
// memory formats (ab = row-major, ba = its transpose), accumulation is a `sum` post-op (oneDNN
// reads C, adds it to the fp32 accumulator and converts once). Creating a primitive costs
// milliseconds (JIT), executing one microseconds, hence the cache.
//
// Thread safety (oneDNN's rules): an engine and primitives may be shared by threads; a stream is
// kept per thread; the library-managed scratchpad of Debian's build (DNNL_ENABLE_CONCURRENT_EXEC
// off) is shared by all primitives and forbids executing a primitive on another thread than the
// one that created it, so the scratchpad is ours (scratchpad_mode::user), one buffer per thread.
//
// oneDNN 2.6 has bf16 matmuls only on AVX-512 CPUs (AVX512-BF16 / AMX natively, avx512_core by
// conversion); on an AVX2 CPU it answers "unimplemented". There a GEMM runs in tiles of at most
// kWidenedTile in M, N and K: each tile of the bf16 operands is widened to fp32 in the scratchpad
// and multiplied by OpenBLAS's SGEMM into C (a bf16 C through an fp32 tile, rounded once). The
// products of bf16 values are exact in fp32 and they accumulate in fp32, as oneDNN's do, so results
// differ from oneDNN's only by summation order. The scratchpad (three tiles, 3 MiB at most) is the
// memory ledger's, as oneDNN's is.
#include "backends/cpu/gemm_bf16.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/layers.hpp"
#include "backends/cpu/vecmath.hpp"

#if STRATA_HAVE_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#endif

namespace strata::cpu {

namespace {

// What a call was, for error messages: "gemm_bf16(M=7, N=13, K=5, trans_a=0, ...)".
std::string describe_call(bool trans_a, bool trans_b, int M, int N, int K, DType c_dtype,
                          bool accumulate) {
  const char* c = c_dtype == DType::f32 ? "f32" : c_dtype == DType::bf16 ? "bf16" : "other";
  return "gemm_bf16(M=" + std::to_string(M) + ", N=" + std::to_string(N) +
         ", K=" + std::to_string(K) + ", trans_a=" + std::to_string(int(trans_a)) +
         ", trans_b=" + std::to_string(int(trans_b)) + ", C=" + c +
         ", accumulate=" + std::to_string(int(accumulate)) + ")";
}

STRATA_SIMD_CLONES void round_range(bf16* out, const float* in, std::size_t n) {
  // strata::to_bf16 as branch-free integer arithmetic, so it vectorises. Not vcvtneps2bf16: that
  // instruction flushes denormal inputs to zero, to_bf16 rounds them.
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(in[i]);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
    out[i].bits = std::uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

STRATA_SIMD_CLONES void widen_range(float* out, const bf16* in, std::size_t n) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i)
    out[i] = std::bit_cast<float>(std::uint32_t(in[i].bits) << 16);
}

void check_shape(bool trans_a, bool trans_b, int M, int N, int K, DType c_dtype, bool accumulate) {
  const auto fail = [&](const std::string& why) {
    throw Error(describe_call(trans_a, trans_b, M, N, K, c_dtype, accumulate) + ": " + why);
  };
  if (M < 0 || N < 0 || K < 0) fail("M, N and K must be >= 0");
  if (c_dtype != DType::f32 && c_dtype != DType::bf16) fail("C must be f32 or bf16");
}

void check_call(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, const bf16* B,
                const void* C, DType c_dtype, bool accumulate) {
  check_shape(trans_a, trans_b, M, N, K, c_dtype, accumulate);
  const bool has_c = M > 0 && N > 0;
  if ((has_c && C == nullptr) || (has_c && K > 0 && (A == nullptr || B == nullptr)))
    throw Error(describe_call(trans_a, trans_b, M, N, K, c_dtype, accumulate) + ": null operand");
}

#if STRATA_HAVE_ONEDNN

// The empty products (M, N or K of 0) BLAS defines, which oneDNN does not take.
void empty_product(int M, int N, void* C, DType c_dtype, bool accumulate) {
  if (accumulate || M == 0 || N == 0) return;
  std::memset(C, 0, std::size_t(M) * std::size_t(N) * dtype_size(c_dtype));
}

using dnnl::memory;
using Tag = memory::format_tag;

// (M, N, K, trans_a, trans_b, c dtype, accumulate, OpenMP threads): oneDNN's brgemm matmul fixes
// its split of the work among threads when the primitive is created, so the count is part of it.
using GemmKey = std::tuple<int, int, int, bool, bool, DType, bool, int>;

struct CachedGemm {
  GemmKey key;
  dnnl::matmul::primitive_desc desc;  // empty when widened
  dnnl::matmul primitive;
  std::size_t scratchpad_bytes;
  bool widened;  // oneDNN has no bf16 matmul here: fp32 operands and SGEMM (see the top)
};

// The widened GEMM's tiles: op(A) [mt, kt], op(B) [kt, nt] and, for a bf16 C, C [mt, nt] in fp32,
// each starting on 64 bytes of the scratchpad.
constexpr int kWidenedTile = 512;
struct WidenedLayout {
  int mt = 0, nt = 0, kt = 0;
  std::size_t a = 0, b = 0, c = 0, bytes = 0;  // offsets in floats, total in bytes
};
WidenedLayout widened_layout(const GemmKey& key) {
  const auto [M, N, K, trans_a, trans_b, c_dtype, accumulate, threads] = key;
  const auto padded = [](std::size_t floats) { return (floats + 15) / 16 * 16; };
  WidenedLayout l;
  l.mt = std::min(M, kWidenedTile), l.nt = std::min(N, kWidenedTile);
  l.kt = std::min(K, kWidenedTile);
  l.b = padded(std::size_t(l.mt) * l.kt);
  l.c = l.b + padded(std::size_t(l.kt) * l.nt);
  const std::size_t end = l.c + (c_dtype == DType::bf16 ? padded(std::size_t(l.mt) * l.nt) : 0);
  l.bytes = end * sizeof(float);
  return l;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::matmul::primitive_desc make_desc(const GemmKey& key) {
  const auto [M, N, K, trans_a, trans_b, c_dtype, accumulate, threads] = key;
  const memory::desc a({M, K}, memory::data_type::bf16, trans_a ? Tag::ba : Tag::ab);
  const memory::desc b({K, N}, memory::data_type::bf16, trans_b ? Tag::ba : Tag::ab);
  const auto c_type = c_dtype == DType::f32 ? memory::data_type::f32 : memory::data_type::bf16;
  const memory::desc c({M, N}, c_type, Tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
}

CachedGemm create_gemm(const GemmKey& key) {
  try {
    auto desc = make_desc(key);
    const std::size_t scratch = desc.scratchpad_desc().get_size();
    return CachedGemm{key, desc, dnnl::matmul(desc), scratch, false};
  } catch (const dnnl::error& e) {
    if (e.status != dnnl_unimplemented) throw;
    return CachedGemm{key, {}, {}, widened_layout(key).bytes, true};
  }
}

// Every primitive of this process, created under the lock (creation is rare: a model issues a
// handful of shapes) so that two threads never JIT the same one.
class GemmCache {
 public:
  std::shared_ptr<const CachedGemm> get(const GemmKey& key) {
    std::lock_guard lock(mutex_);
    auto& slot = gemms_[key];
    if (!slot) slot = std::make_shared<const CachedGemm>(create_gemm(key));
    return slot;
  }
  std::size_t size() {
    std::lock_guard lock(mutex_);
    return gemms_.size();
  }

 private:
  std::mutex mutex_;
  std::map<GemmKey, std::shared_ptr<const CachedGemm>> gemms_;
};

GemmCache& gemm_cache() {
  static GemmCache cache;
  return cache;
}

// This thread's scratchpad: grown to the largest a primitive asked for, 64-byte aligned as oneDNN
// wants its buffers.
class Scratchpad {
 public:
  ~Scratchpad() { std::free(data_); }
  void* get(std::size_t bytes) {
    if (bytes > bytes_) {
      std::free(data_);
      bytes_ = (bytes + 63) / 64 * 64;
      data_ = std::aligned_alloc(64, bytes_);
      if (data_ == nullptr) {
        bytes_ = 0;
        throw std::bad_alloc();
      }
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// oneDNN sizes its OpenMP regions by the calling thread's omp_get_max_threads(), an OpenMP ICV of
// each thread: set_blas_threads() sets it on its own thread only, so every calling thread is
// brought to the BLAS count here.
int match_blas_threads() {
  const int n = std::max(1, blas_threads());
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
  return n;
}

// rows x cols of a row-major matrix of leading dimension ld, from (r0, c0), to or from a dense
// [rows, cols] tile.
void widen_tile(float* tile, const bf16* src, int ld, int r0, int c0, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    widen_range(tile + std::size_t(r) * cols, src + (std::size_t(r0) + r) * ld + c0, cols);
}
void round_tile(bf16* dst, int ld, int r0, int c0, int rows, int cols, const float* tile) {
  for (int r = 0; r < rows; ++r)
    round_range(dst + (std::size_t(r0) + r) * ld + c0, tile + std::size_t(r) * cols, cols);
}

// The widened GEMM (see the top): for each tile of C, the K tiles of op(A) and op(B) widened and
// multiplied into it; a bf16 C's tile is read (accumulate), summed in fp32 and rounded once.
void run_widened(const CachedGemm& gemm, const bf16* A, const bf16* B, void* C, float* pad) {
  const auto [M, N, K, trans_a, trans_b, c_dtype, accumulate, threads] = gemm.key;
  const WidenedLayout l = widened_layout(gemm.key);
  float* const a = pad + l.a;
  float* const b = pad + l.b;
  const bool f32 = c_dtype == DType::f32;
  for (int m0 = 0; m0 < M; m0 += l.mt)
    for (int n0 = 0; n0 < N; n0 += l.nt) {
      const int rows = std::min(l.mt, M - m0), cols = std::min(l.nt, N - n0);
      float* const c = f32 ? static_cast<float*>(C) + std::size_t(m0) * N + n0 : pad + l.c;
      if (!f32 && accumulate) widen_tile(c, static_cast<const bf16*>(C), N, m0, n0, rows, cols);
      for (int k0 = 0; k0 < K; k0 += l.kt) {
        const int depth = std::min(l.kt, K - k0);
        if (trans_a)
          widen_tile(a, A, M, k0, m0, depth, rows);  // A [K,M]: the tile [depth, rows]
        else
          widen_tile(a, A, K, m0, k0, rows, depth);
        if (trans_b)
          widen_tile(b, B, K, n0, k0, cols, depth);  // B [N,K]: the tile [cols, depth]
        else
          widen_tile(b, B, N, k0, n0, depth, cols);
        gemm_f32(trans_a, trans_b, rows, cols, depth, a, trans_a ? rows : depth, b,
                 trans_b ? depth : cols, c, f32 ? N : cols, accumulate || k0 > 0);
      }
      if (!f32) round_tile(static_cast<bf16*>(C), N, m0, n0, rows, cols, c);
    }
}

void run_gemm(const CachedGemm& gemm, const bf16* A, const bf16* B, void* C, GemmScratchpad given) {
  thread_local Scratchpad scratchpad;
  if (gemm.widened) {
    void* pad =
        given.bytes >= gemm.scratchpad_bytes ? given.data : scratchpad.get(gemm.scratchpad_bytes);
    return run_widened(gemm, A, B, C, static_cast<float*>(pad));
  }
  thread_local dnnl::stream stream(cpu_engine());
  dnnl::engine& engine = cpu_engine();
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(gemm.desc.src_desc(), engine, const_cast<bf16*>(A))},
      {DNNL_ARG_WEIGHTS, memory(gemm.desc.weights_desc(), engine, const_cast<bf16*>(B))},
      {DNNL_ARG_DST, memory(gemm.desc.dst_desc(), engine, C)}};
  if (gemm.scratchpad_bytes > 0) {
    void* pad =
        given.bytes >= gemm.scratchpad_bytes ? given.data : scratchpad.get(gemm.scratchpad_bytes);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(gemm.desc.scratchpad_desc(), engine, pad));
  }
  gemm.primitive.execute(stream, args);
  stream.wait();
}

#endif  // STRATA_HAVE_ONEDNN

}  // namespace

#if STRATA_HAVE_ONEDNN

namespace {
// A GEMM of the model's size, created once: what this CPU runs (a tiny or odd shape may get another
// implementation).
const CachedGemm& reference_gemm() {
  static const CachedGemm gemm = create_gemm({1024, 768, 256, false, false, DType::f32, false, 1});
  return gemm;
}
}  // namespace

std::string bf16_gemm_impl() {
  return reference_gemm().widened ? "widened:fp32 sgemm (oneDNN has no bf16 matmul on this CPU)"
                                  : reference_gemm().desc.impl_info_str();
}

bool have_bf16_gemm() { return !bf16_gemm_impl().empty(); }
bool bf16_gemm_widened() { return reference_gemm().widened; }

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (commit " + v->hash + ")";
}

std::size_t gemm_bf16_cached_primitives() { return gemm_cache().size(); }

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, const bf16* B,
               void* C, DType c_dtype, bool accumulate, GemmScratchpad scratchpad) {
  check_call(trans_a, trans_b, M, N, K, A, B, C, c_dtype, accumulate);
  if (M == 0 || N == 0 || K == 0) return empty_product(M, N, C, c_dtype, accumulate);
  try {
    const int threads = match_blas_threads();
    const auto gemm = gemm_cache().get({M, N, K, trans_a, trans_b, c_dtype, accumulate, threads});
    run_gemm(*gemm, A, B, C, scratchpad);
  } catch (const dnnl::error& e) {
    throw Error(describe_call(trans_a, trans_b, M, N, K, c_dtype, accumulate) + ": oneDNN " +
                dnnl_status2str(e.status) + ": " + e.what());
  }
}

std::size_t gemm_bf16_scratchpad_bytes(bool trans_a, bool trans_b, int M, int N, int K,
                                       DType c_dtype, bool accumulate) {
  check_shape(trans_a, trans_b, M, N, K, c_dtype, accumulate);
  if (M == 0 || N == 0 || K == 0) return 0;
  try {
    const int threads = match_blas_threads();
    return gemm_cache()
        .get({M, N, K, trans_a, trans_b, c_dtype, accumulate, threads})
        ->scratchpad_bytes;
  } catch (const dnnl::error& e) {
    throw Error(describe_call(trans_a, trans_b, M, N, K, c_dtype, accumulate) + ": oneDNN " +
                dnnl_status2str(e.status) + ": " + e.what());
  }
}

#else  // no oneDNN: the same interface, refusing GEMMs

std::string bf16_gemm_impl() { return {}; }
std::string onednn_version() { return "not built"; }
bool have_bf16_gemm() { return false; }
bool bf16_gemm_widened() { return false; }
std::size_t gemm_bf16_cached_primitives() { return 0; }

std::size_t gemm_bf16_scratchpad_bytes(bool, bool, int, int, int, DType, bool) { return 0; }

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, const bf16* B,
               void* C, DType c_dtype, bool accumulate, GemmScratchpad) {
  check_call(trans_a, trans_b, M, N, K, A, B, C, c_dtype, accumulate);
  throw Error(describe_call(trans_a, trans_b, M, N, K, c_dtype, accumulate) +
                  ": bf16 GEMM: this build has no oneDNN",
              "install libdnnl-dev (scripts/install-deps.sh) and rebuild");
}

#endif

double calibrate_bf16_gemm_flops(double seconds_budget) {
  using clock = std::chrono::steady_clock;
  const int n = 1024;
  std::vector<bf16> a(std::size_t(n) * n), b(std::size_t(n) * n);
  std::vector<float> c(std::size_t(n) * n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = to_bf16(float(i % 13) * 0.01f);
    b[i] = to_bf16(float(i % 7) * 0.01f);
  }
  // As calibrate_sgemm_flops: the best rate sustained over blocks of calls, after one call that
  // creates the primitive and wakes the threads.
  const int calls_per_block = 4;
  const double flop = 2.0 * n * n * n * calls_per_block;
  double best = 0.0;
  gemm_bf16(false, false, n, n, n, a.data(), b.data(), c.data(), DType::f32, false);
  const auto start = clock::now();
  for (int block = 0;; ++block) {
    const auto t0 = clock::now();
    for (int k = 0; k < calls_per_block; ++k)
      gemm_bf16(false, false, n, n, n, a.data(), b.data(), c.data(), DType::f32, false);
    const auto t1 = clock::now();
    best = std::max(best, flop / std::chrono::duration<double>(t1 - t0).count());
    if (block >= 2 && std::chrono::duration<double>(t1 - start).count() >= seconds_budget) break;
  }
  return best;
}

namespace {
// f(begin, end) over [0, n) in one contiguous piece per thread: the matmul operands (N x C and
// more) are converted on all the GEMM's threads, not while those spin waiting for the next GEMM.
template <class F>
void split_over_threads(std::size_t n, F&& f) {
  constexpr std::size_t kSerial = std::size_t(1) << 15;
  const int threads = n < kSerial ? 1 : blas_threads();
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = n * std::size_t(t) / threads, end = n * std::size_t(t + 1) / threads;
    f(begin, end);
  }
}
}  // namespace

void round_to_bf16(bf16* out, const float* in, std::size_t n) {
  split_over_threads(n, [&](std::size_t b, std::size_t e) { round_range(out + b, in + b, e - b); });
}

void widen_bf16(float* out, const bf16* in, std::size_t n) {
  split_over_threads(n, [&](std::size_t b, std::size_t e) { widen_range(out + b, in + b, e - b); });
}

}  // namespace strata::cpu
