// cuDNN's attention graphs (core/src/backends/cuda/sdpa_graph.hpp) evaluated on host memory,
// operation by operation as cuDNN's backend defines them: bound tensors read and written in their
// own type at the caller's pointers (bf16 rounded when written), virtual ones in fp32 buffers of
// the evaluator's own (a reshape's output views its input's), a matmul into an accumulating tensor
// (SdpaTensor::accumulates) adding to what is there. test_sdpa_graph checks it against the CPU's
// attention; the cuDNN stand-in executes plans with it.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "backends/cuda/sdpa_graph.hpp"

namespace strata::cudnn_standin {

class SdpaEvaluator {
 public:
  // bound: each non-virtual tensor's memory by uid; scalars: each by-value tensor's value.
  SdpaEvaluator(const cuda::SdpaGraph& graph, std::map<std::int64_t, void*> bound,
                std::map<std::int64_t, float> scalars);
  void run();

 private:
  using Index = std::array<std::int64_t, 4>;
  struct Place {
    void* data = nullptr;
    bool is_float_buffer = false;  // virtual (fp32 storage) or a by-value scalar
  };
  float read(int tensor, const Index& at) const;
  void write(int tensor, const Index& at, float value);
  std::int64_t offset(int tensor, const Index& at) const;
  void matmul(const cuda::SdpaOp& op);
  void pointwise(const cuda::SdpaOp& op);
  void reduce(const cuda::SdpaOp& op);

  cuda::SdpaGraph g_;
  std::vector<Place> place_;
  std::map<std::int64_t, float> scalars_;
  std::vector<std::vector<float>> owned_;
};

}  // namespace strata::cudnn_standin
