// The CUDA emulator's cublas_v2.h (tests/cuda_emu): a reference cuBLAS for the calls strata makes.
// Column-major fp32 GEMMs with cuBLAS's argument checks (a leading dimension below the rows of its
// operand is CUBLAS_STATUS_INVALID_VALUE, logged on stderr as cuBLAS does), queued on the handle's
// stream, alpha and beta read from host memory at the call (CUBLAS_POINTER_MODE_HOST; device
// pointer mode is refused). C is not read when beta is 0, A and B not when alpha is 0, as cuBLAS
// documents. Beyond cuBLAS: every operand's extent (ld, k, stride, batch) must lie inside one
// device allocation, or the call fails with CUBLAS_STATUS_EXECUTION_FAILED and says which operand
// (on a GPU: an illegal address or silently wrong values). The math mode is recorded and ignored.
// cublasGemmEx: bf16 A and B with an fp32 or bf16 C (or all fp32), CUBLAS_COMPUTE_32F only:
// products accumulated in fp32, alpha and beta applied in fp32, a bf16 C rounded once (to nearest
// even, as strata::to_bf16); other type combinations are CUBLAS_STATUS_NOT_SUPPORTED.
#pragma once
#include <cstddef>

#include "cuda_runtime_api.h"
#include "library_types.h"

#define CUBLAS_VERSION 130000

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
} cublasMath_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;

// cublas_api.h: the few compute and algorithm enums GemmEx needs (the data types: library_types.h).
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

typedef struct cublasContext* cublasHandle_t;

extern "C" {
cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasGetVersion(cublasHandle_t handle, int* version);
// The library's version without a handle (CUBLAS_VERSION's parts).
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, std::size_t bytes);
const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long stride_a, const float* B, int ldb,
                                         long long stride_b, const float* beta, float* C, int ldc,
                                         long long stride_c, int batch_count);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
}
