// CUDA's library_types.h for the emulator: the data types and library properties its cuBLAS
// (cublas_v2.h) and cuDNN's headers (the cuDNN stand-in, tests/cudnn_standin) name, with CUDA's
// values.
#pragma once

typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum libraryPropertyType_t {
  MAJOR_VERSION,
  MINOR_VERSION,
  PATCH_LEVEL
} libraryPropertyType;
