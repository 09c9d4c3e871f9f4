// The CUDA emulator's reference cuBLAS (see cublas_v2.h for what it checks).
#include <cublas_v2.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>

#include "internal.hpp"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

namespace strata_emu {

std::size_t type_size(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }
float load(const void* p, cudaDataType_t t, std::int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return std::bit_cast<float>(std::uint32_t(static_cast<const std::uint16_t*>(p)[i]) << 16);
}
void store(void* p, cudaDataType_t t, std::int64_t i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    static_cast<std::uint16_t*>(p)[i] = std::uint16_t((u >> 16) | 0x40u);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  static_cast<std::uint16_t*>(p)[i] = std::uint16_t(u >> 16);
}

bool operand_inside(const void* p, std::size_t elem, int rows, int cols, int ld, long long stride,
                    int batch, const char* what, const char* call) {
  if (rows == 0 || cols == 0 || batch == 0) return true;
  const long long lo = std::min(0LL, (batch - 1) * stride);
  const long long hi = std::max(0LL, (batch - 1) * stride) + (cols - 1LL) * ld + rows;
  if (in_device_memory(static_cast<const char*>(p) + lo * static_cast<long long>(elem),
                       std::size_t(hi - lo) * elem))
    return true;
  report(
      "%s: operand %s (%d x %d, ld %d, stride %lld, batch %d at %p) reaches outside its device "
      "allocation (a wrong leading dimension, stride or pointer)",
      call, what, rows, cols, ld, stride, batch, static_cast<const void*>(p));
  return false;
}

std::vector<float> gemm_sums(float alpha, const GemmOperand& a, const GemmOperand& b, int m, int n,
                             int k) {
  std::vector<float> sums(std::size_t(m) * n, 0.0f);
  if (alpha == 0.0f) return sums;
  // op(A)'s rows and op(B)'s columns widened once into contiguous fp32 (a dot product then reads
  // two arrays in order; loading each product's operands through load() took most of an emulated
  // run). The same products added in the same order as a loop over load(): the same bits.
  const auto at = [](const GemmOperand& x, std::int64_t r, std::int64_t c) {
    return load(x.x, x.type, x.transposed ? c + r * x.ld : r + c * x.ld);
  };
  std::vector<float> rows(std::size_t(m) * k), cols(std::size_t(n) * k);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t l = 0; l < k; ++l) rows[i * k + l] = at(a, i, l);
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t l = 0; l < k; ++l) cols[j * k + l] = at(b, l, j);
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < m; ++i) {
      const float* x = rows.data() + i * k;
      const float* y = cols.data() + j * k;
      float sum = 0.0f;
      for (int l = 0; l < k; ++l) sum += x[l] * y[l];
      sums[i + j * m] = sum;
    }
  return sums;
}

namespace {

struct Gemm {
  cublasOperation_t transa, transb;
  int m, n, k;
  float alpha;
  const void* a;
  int lda;
  long long stride_a;
  const void* b;
  int ldb;
  long long stride_b;
  float beta;
  void* c;
  int ldc;
  long long stride_c;
  int batch;
  // Element types (cublasGemmEx); the fp32 GEMMs leave them fp32.
  cudaDataType_t a_type = CUDA_R_32F, b_type = CUDA_R_32F, c_type = CUDA_R_32F;
};

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T; }

// cuBLAS's checks, in its order: the name of the first invalid parameter, or null. `why` gets the
// rule it breaks.
const char* invalid_parameter(const Gemm& g, char (&why)[128]) {
  const int rows_a = g.transa == CUBLAS_OP_N ? g.m : g.k;
  const int rows_b = g.transb == CUBLAS_OP_N ? g.k : g.n;
  why[0] = '\0';
  if (!valid_op(g.transa)) return "transa";
  if (!valid_op(g.transb)) return "transb";
  if (g.m < 0) return "m";
  if (g.n < 0) return "n";
  if (g.k < 0) return "k";
  if (g.lda < std::max(1, rows_a)) {
    std::snprintf(why, sizeof why, ": lda %d < max(1, rows of op(A) = %d)", g.lda, rows_a);
    return "lda";
  }
  if (g.ldb < std::max(1, rows_b)) {
    std::snprintf(why, sizeof why, ": ldb %d < max(1, rows of op(B) = %d)", g.ldb, rows_b);
    return "ldb";
  }
  if (g.ldc < std::max(1, g.m)) {
    std::snprintf(why, sizeof why, ": ldc %d < max(1, m = %d)", g.ldc, g.m);
    return "ldc";
  }
  if (g.batch < 0) return "batchCount";
  return nullptr;
}

void run_gemm(const Gemm& g) {
  for (int batch = 0; batch < g.batch; ++batch) {
    const std::int64_t a0 = batch * g.stride_a, b0 = batch * g.stride_b, c0 = batch * g.stride_c;
    const std::vector<float> sums =
        gemm_sums(g.alpha,
                  {static_cast<const char*>(g.a) + a0 * type_size(g.a_type), g.a_type,
                   g.transa == CUBLAS_OP_T, g.lda},
                  {static_cast<const char*>(g.b) + b0 * type_size(g.b_type), g.b_type,
                   g.transb == CUBLAS_OP_T, g.ldb},
                  g.m, g.n, g.k);
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i) {
        const std::int64_t at = c0 + i + std::int64_t(j) * g.ldc;
        // beta == 0: C is output only (it may hold NaN), as cuBLAS documents.
        const float old = g.beta == 0.0f ? 0.0f : g.beta * load(g.c, g.c_type, at);
        store(g.c, g.c_type, at, g.alpha * sums[i + std::size_t(j) * g.m] + old);
      }
  }
}

cublasStatus_t gemm(cublasHandle_t handle, const Gemm& g, const char* call) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  char why[128];
  if (const char* parameter = invalid_parameter(g, why)) {
    // cuBLAS logs such a line to stderr before it returns.
    std::fprintf(stderr, " ** On entry to %s parameter %s had an illegal value%s\n", call,
                 parameter, why);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (g.m == 0 || g.n == 0 || g.batch == 0) return CUBLAS_STATUS_SUCCESS;
  const bool reads_ab = g.alpha != 0.0f && g.k > 0;
  const int rows_a = g.transa == CUBLAS_OP_N ? g.m : g.k,
            cols_a = g.transa == CUBLAS_OP_N ? g.k : g.m;
  const int rows_b = g.transb == CUBLAS_OP_N ? g.k : g.n,
            cols_b = g.transb == CUBLAS_OP_N ? g.n : g.k;
  if ((reads_ab && (!operand_inside(g.a, type_size(g.a_type), rows_a, cols_a, g.lda, g.stride_a,
                                    g.batch, "A", call) ||
                    !operand_inside(g.b, type_size(g.b_type), rows_b, cols_b, g.ldb, g.stride_b,
                                    g.batch, "B", call))) ||
      !operand_inside(g.c, type_size(g.c_type), g.m, g.n, g.ldc, g.stride_c, g.batch, "C", call))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  if (enqueue(handle->stream, [g] { run_gemm(g); }) != cudaSuccess)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace strata_emu

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

// As cuBLAS: waits for the device first.
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  strata_emu::synchronize_all_streams();
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION:
      *value = CUBLAS_VERSION / 10000;
      return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION:
      *value = CUBLAS_VERSION / 100 % 100;
      return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL:
      *value = CUBLAS_VERSION % 100;
      return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasGetVersion(cublasHandle_t handle, int* version) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST) {
    strata_emu::report("cublasSetPointerMode: only CUBLAS_POINTER_MODE_HOST is emulated");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS wants the workspace in device memory, 256-byte aligned.
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, std::size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 &&
      (workspace == nullptr || reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0 ||
       !strata_emu::in_device_memory(workspace, bytes)))
    return CUBLAS_STATUS_INVALID_VALUE;
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    default:
      return "an internal operation failed";
  }
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const strata_emu::Gemm g{transa, transb, m, n,     k, *alpha, A, lda, 0,
                           B,      ldb,    0, *beta, C, ldc,    0, 1};
  return strata_emu::gemm(handle, g, "cublasSgemm");
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long stride_a, const float* B, int ldb,
                                         long long stride_b, const float* beta, float* C, int ldc,
                                         long long stride_c, int batch_count) {
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const strata_emu::Gemm g{transa, transb,   m,     n, k,   *alpha,   A,          lda, stride_a, B,
                           ldb,    stride_b, *beta, C, ldc, stride_c, batch_count};
  return strata_emu::gemm(handle, g, "cublasSgemmStridedBatched");
}

// bf16 A and B, fp32 or bf16 C, fp32 compute (or all fp32): what strata's bf16 GEMMs call.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const bool bf16_ab =
      Atype == CUDA_R_16BF && Btype == CUDA_R_16BF && (Ctype == CUDA_R_16BF || Ctype == CUDA_R_32F);
  const bool all_f32 = Atype == CUDA_R_32F && Btype == CUDA_R_32F && Ctype == CUDA_R_32F;
  if (computeType != CUBLAS_COMPUTE_32F || algo != CUBLAS_GEMM_DEFAULT || !(bf16_ab || all_f32)) {
    strata_emu::report(
        "cublasGemmEx: only bf16 (or fp32) A/B with an fp32 or bf16 C, CUBLAS_COMPUTE_32F and "
        "CUBLAS_GEMM_DEFAULT are emulated");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  strata_emu::Gemm g{transa, transb, m, n, k, a, A, lda, 0, B, ldb, 0, b, C, ldc, 0, 1};
  g.a_type = Atype;
  g.b_type = Btype;
  g.c_type = Ctype;
  return strata_emu::gemm(handle, g, "cublasGemmEx");
}

}  // extern "C"
