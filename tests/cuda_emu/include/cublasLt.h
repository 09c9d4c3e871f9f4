// The CUDA emulator's cublasLt.h (tests/cuda_emu): a reference cuBLASLt for the matmuls strata
// makes, with cuBLASLt's names and enumerator values. Column-major layouts (CUBLASLT_ORDER_COL),
// one matrix per layout (no batches), host pointer mode, CUBLAS_COMPUTE_32F with fp32 scale:
// bf16 A and B with an fp32 C = D (or all fp32), products accumulated in fp32 in k order, then
// alpha, beta C, and the epilogue in fp32:
//   CUBLASLT_EPILOGUE_DEFAULT, _BIAS (fp32 bias of D's rows, BIAS_DATA_TYPE unset or CUDA_R_32F),
//   _GELU, _GELU_BIAS, _GELU_AUX, _GELU_AUX_BIAS (the GELU input kept in the aux matrix, fp32,
//   AUX_DATA_TYPE unset or CUDA_R_32F), with cuBLASLt's GELU, the tanh approximation
//   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Argument checks as cuBLASLt's (checked against an H100 with cuBLAS 13.1), at
// cublasLtMatmulAlgoGetHeuristic and again at cublasLtMatmul: CUBLAS_STATUS_INVALID_VALUE for a
// leading dimension below the rows of its layout, shapes of A, B, C, D that do not fit op(A) op(B)
// (m x k times k x n), an aux leading dimension below D's rows with a GELU_AUX epilogue, a
// workspace smaller than the algorithm's or an attribute buffer of the wrong size; at the matmul
// only (the heuristic sees no pointers), a null bias pointer with a BIAS epilogue or a null aux
// pointer with a GELU_AUX epilogue; CUBLAS_STATUS_NOT_SUPPORTED for other type combinations, compute types, orders,
// batches or epilogues. Each refusal is logged on stderr ("strata CUDA emulator: ...").
// The heuristic's algorithm records the preference's minimum alignments (default 256 bytes, as
// cuBLASLt assumes); cublasLtMatmul refuses (CUBLAS_STATUS_INVALID_VALUE) an A, B, C or D less
// aligned than that: on a GPU, an algorithm picked for aligned operands faults or refuses them.
// As in cublas_v2.h, every operand's extent, the bias and the aux matrix must lie inside one
// device allocation (CUBLAS_STATUS_EXECUTION_FAILED otherwise), and the matmul runs in order on
// the stream given to cublasLtMatmul. The workspace is checked and not used.
#pragma once
#include <cstddef>
#include <cstdint>

#include "cublas_v2.h"

typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct cublasLtEmuMatmulDesc* cublasLtMatmulDesc_t;
typedef struct cublasLtEmuMatrixLayout* cublasLtMatrixLayout_t;
typedef struct cublasLtEmuMatmulPreference* cublasLtMatmulPreference_t;

typedef struct {
  std::uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
  CUBLASLT_POINTER_MODE_HOST = CUBLAS_POINTER_MODE_HOST,
  CUBLASLT_POINTER_MODE_DEVICE = CUBLAS_POINTER_MODE_DEVICE,
} cublasLtPointerMode_t;

typedef enum {
  CUBLASLT_ORDER_COL = 0,
  CUBLASLT_ORDER_ROW = 1,
} cublasLtOrder_t;

typedef enum {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,         // uint32_t
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,        // int32_t
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,         // uint64_t
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,         // uint64_t
  CUBLASLT_MATRIX_LAYOUT_LD = 4,           // int64_t
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,  // int32_t
} cublasLtMatrixLayoutAttribute_t;

typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,             // int32_t
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,               // int32_t
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,             // int32_t
  CUBLASLT_MATMUL_DESC_TRANSA = 3,                   // int32_t
  CUBLASLT_MATMUL_DESC_TRANSB = 4,                   // int32_t
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,                 // uint32_t
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,             // const void*
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,    // void*
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,         // int64_t
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,  // int32_t
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,          // int32_t
} cublasLtMatmulDescAttributes_t;

typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_AUX = (CUBLASLT_EPILOGUE_GELU | 128),
  CUBLASLT_EPILOGUE_GELU_BIAS = (CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = (CUBLASLT_EPILOGUE_GELU_AUX | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_DGELU = 64 | 128,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

typedef enum {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,            // uint32_t
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    // uint64_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

extern "C" {
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          std::uint64_t rows, std::uint64_t cols, std::int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, std::size_t sizeInBytes);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t sizeInBytes);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t sizeInBytes);

// One algorithm (workspace 0) when the configuration passes the checks above.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount);

// D = epilogue(alpha op(A) op(B) + beta C); algo null: as the heuristic's with default alignment.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, std::size_t workspaceSizeInBytes,
                              cudaStream_t stream);
}

namespace strata_emu {
// How many cublasLtMatmulAlgoGetHeuristic calls this process made (the tests' window on plan
// caching: a shape's second matmul must not ask again).
long long lt_heuristic_calls();
}  // namespace strata_emu
