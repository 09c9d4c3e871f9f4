// Shared by the CUDA emulator's sources; not part of the emulated API.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "cuda_emu/launch.hpp"

namespace strata_emu {

// "strata CUDA emulator: <message>" on stderr, so a refused call says why beyond its error code.
void report(const char* format, ...) __attribute__((format(printf, 1, 2)));
// report(), then abort: misuse a GPU would answer with undefined behaviour (a partial-warp
// shuffle, a read from an exited lane).
[[noreturn]] void fatal(const char* format, ...) __attribute__((format(printf, 1, 2)));
// Sets this host thread's last error (cudaGetLastError) and returns `error`.
cudaError_t set_last_error(cudaError_t error);

// --- runtime.cpp
// Devices the emulator shows: STRATA_CUDA_EMU_DEVICES (1..16, default 1), so that several ranks
// of one node each select a GPU of their own, as on a GPU node. All share one host memory.
int device_count();
extern thread_local int current_device;  // cudaSetDevice's, per host thread as in CUDA

// --- memory.cpp
// Whether [p, p + bytes) lies inside one device allocation (cudaMalloc or cudaMallocHost).
bool in_device_memory(const void* p, std::size_t bytes);
// A device block outside the pool (graph memory), and its release once nothing can use it.
cudaError_t allocate_block(void** ptr, std::size_t bytes);
void free_block(void* ptr);

// --- streams.cpp
// Runs `op` in order on `stream`: a created stream's thread, or, for the legacy default stream,
// the calling thread once every blocking stream has drained. cudaErrorInvalidResourceHandle for
// an unknown stream.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> op);
// Waits until every stream has drained.
void synchronize_all_streams();

// --- graphs.cpp: stream capture (its rules are listed there)
// If `stream` is capturing: appends `op` to its graph (nothing once the capture is invalidated)
// and returns true; enqueue() then queues nothing.
bool capture_op(cudaStream_t stream, std::function<void()>& op);
// Whether `stream` is capturing.
bool in_capture(cudaStream_t stream);
// A potentially unsafe call (cudaMalloc, a synchronisation, ...) on this thread: if a capture
// forbids it here, reports `call`, invalidates that capture and returns true, and the call fails
// with cudaErrorStreamCaptureUnsupported without acting.
bool capture_forbids(const char* call);
// A synchronisation or query of `stream`: true (reported, capture invalidated) if it is capturing.
bool capturing(cudaStream_t stream, const char* call);
// cudaMallocAsync's block `p` on `stream`: if it is capturing, the block becomes the graph's
// memory (true). cudaFreeAsync of `p` on `stream`: true if `p` is the capture's graph memory (the
// free then queues nothing).
bool capture_allocates(cudaStream_t stream, void* p);
bool capture_frees(cudaStream_t stream, void* p);

// --- cublas.cpp: the element access and operand check that cuBLAS and cuBLASLt share
std::size_t type_size(cudaDataType_t t);  // bytes of one element (fp32 or bf16)
// Element i of a buffer of type t, as fp32 (bf16: its 16 bits are the top of a float's).
float load(const void* p, cudaDataType_t t, std::int64_t i);
// Stores v as type t (bf16: rounded to nearest even, NaN stays a quiet NaN, as strata::to_bf16).
void store(void* p, cudaDataType_t t, std::int64_t i, float v);
// Whether every element a GEMM touches in one operand (rows x cols, column-major with ld, over
// `batch` matrices `stride` apart) lies inside one device allocation; if not, reports which
// operand of which call.
bool operand_inside(const void* p, std::size_t elem, int rows, int cols, int ld, long long stride,
                    int batch, const char* what, const char* call);
// One column-major operand of a GEMM: element (r, c) of op(X) is x[r + c * ld], or x[c + r * ld]
// transposed.
struct GemmOperand {
  const void* x;
  cudaDataType_t type;
  bool transposed;
  std::int64_t ld;
};
// The m x n sums of op(A) op(B) (column-major, m x k by k x n): each a dot product in fp32 with its
// k products added in ascending order (what every GEMM of the emulator computes before its alpha,
// beta and epilogue); zeros when `alpha` is 0, without reading A or B, as cuBLAS.
std::vector<float> gemm_sums(float alpha, const GemmOperand& a, const GemmOperand& b, int m, int n,
                             int k);

// --- blocks.cpp
// Runs every block of a checked launch, each CUDA thread on its own host thread; returns when the
// grid has finished. One launch at a time (the caller holds the launch lock).
void run_grid(const LaunchConfig& config, const std::function<void()>& body);

}  // namespace strata_emu
