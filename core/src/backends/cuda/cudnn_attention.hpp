// cuDNN's fused flash attention (--attention cudnn): the graphs of sdpa_graph.hpp emitted through
// cuDNN's backend API, planned once per shape by cuDNN's heuristics and run on the context's
// stream. Built where the configure step finds cuDNN 9 (STRATA_HAVE_CUDNN). Plain C++: no cuDNN
// type in this header.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/sdpa_graph.hpp"
#include "strata/types.hpp"

namespace strata::cuda {

struct CudaContext;

// What cuDNN's heuristics offer for a graph on a GPU it is only told about (a cudaDeviceProp as
// the JSON of CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION): the engine configurations that pass
// cuDNN's support checks, and for each the status of finalising its plan. Without a driver the
// plan ends at loading its compiled kernel (CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER); with one,
// CUDNN_STATUS_SUCCESS.
struct SdpaPlanning {
  std::vector<std::int64_t> engines;  // cuDNN's global engine index of each offered configuration
  std::vector<std::string> plan_status;
};
SdpaPlanning plan_sdpa_for_device(const SdpaGraph& graph, const std::string& device_json);

// The version ("9.19.0") of the libcudnn.so.9 this process opens for --attention cudnn, "none"
// where none is found: the run file's /provenance cudnn_version.
std::string cudnn_library_version();

class CudnnAttention {
 public:
  explicit CudnnAttention(const CudaContext& ctx);  // the context must outlive this object
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // out[B,T,C] and lse[B,NH,T] of qkv[B,T,3C], causal (sdpa_graph.hpp's shapes).
  void forward(bf16* out, float* lse, const bf16* qkv, const SdpaShape& s);
  // dqkv[B,T,3C] of dout[B,T,C] in bf16 (written, not added); row_delta[B,NH,T] is scratch.
  void backward(bf16* dqkv, float* row_delta, const bf16* dout, const bf16* qkv, const bf16* out,
                const float* lse, const SdpaShape& s);

  // A device buffer of at least `elements` bf16 for the caller's conversions around backward()
  // (the model's dout and dqkv are fp32).
  bf16* staging(std::size_t elements);

  // Device memory cuDNN works in beside the arena: its plans' workspace, the fp32 dQ accumulator
  // and the staging buffer, allocated at a shape's first call (never inside a CUDA graph capture:
  // the core runs a pass once before it captures it) and kept, a grown buffer's old block too.
  std::size_t working_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cuda
