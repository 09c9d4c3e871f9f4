// cuDNN accepts strata's attention graphs (cuda/sdpa_graph.hpp) for an H100 and compiles their
// kernels, on a machine without a GPU: cuDNN plans for a GPU it is only described
// (tests/data/h100_sxm_cudnn_device.json, an H100 SXM5's cudaDeviceProp as cuDNN serialises it),
// and its heuristics return only the engine configurations that pass its support checks. Where no
// driver is installed, the test loads the CUDA toolkit's stub libcuda (same soname) first, so
// cuDNN finds it and a plan is finalised up to loading its compiled kernel, which the stub refuses.
//
// What the graphs compute is test_sdpa_graph's; cuDNN running them on a GPU is
// test_cudnn_attention's (label gpu).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "backends/cuda/cudnn_attention.hpp"
#include "backends/cuda/sdpa_graph.hpp"

namespace {

using namespace strata::cuda;

// cuDNN's runtime-compiled engines need a libcuda.so.1: the driver's, else the toolkit's stub.
const bool libcuda_loaded = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) != nullptr ||
                            dlopen(STRATA_CUDA_STUB_LIBCUDA, RTLD_NOW | RTLD_GLOBAL) != nullptr;

std::string h100() {
  EXPECT_TRUE(libcuda_loaded) << "neither libcuda.so.1 nor " STRATA_CUDA_STUB_LIBCUDA;
  std::ifstream in(STRATA_TEST_DATA_DIR "/h100_sxm_cudnn_device.json");
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_FALSE(s.str().empty());
  return s.str();
}

// At least one configuration offered, and a plan of one compiled: finalised, or stopped only at
// loading the kernel where there is no driver.
void expect_planned(const SdpaGraph& g, const char* what) {
  const SdpaPlanning p = plan_sdpa_for_device(g, h100());
  ASSERT_FALSE(p.engines.empty()) << what << ": cuDNN offers no engine";
  std::string seen;
  bool compiled = false;
  for (std::size_t i = 0; i < p.engines.size(); ++i) {
    seen += " engine " + std::to_string(p.engines[i]) + ": " + p.plan_status[i] + ";";
    compiled |= p.plan_status[i] == "CUDNN_STATUS_SUCCESS" ||
                p.plan_status[i] == "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER";
  }
  EXPECT_TRUE(compiled) << what << ":" << seen;
  std::printf("%s:%s\n", what, seen.c_str());
}

// gpt2-124m at micro-batch 8 and 16, and the ~1.3B shape of scripts/gpu-check.sh (head size 128).
TEST(CudnnSdpa, Gpt2ForwardAndBackwardPlanOnAnH100) {
  for (int B : {8, 16}) {
    expect_planned(sdpa_forward_graph({B, 1024, 12, 64}), "forward hs 64");
    expect_planned(sdpa_backward_graph({B, 1024, 12, 64}), "backward hs 64");
  }
}
TEST(CudnnSdpa, HeadSize128ForwardAndBackwardPlanOnAnH100) {
  expect_planned(sdpa_forward_graph({4, 1024, 16, 128}), "forward hs 128");
  expect_planned(sdpa_backward_graph({4, 1024, 16, 128}), "backward hs 128");
}

// The check can fail: the same forward with fp32 probabilities into the second product (its
// operands must share one type) is refused by every engine.
TEST(CudnnSdpa, AMalformedGraphIsRefused) {
  SdpaGraph g = sdpa_forward_graph({8, 1024, 12, 64});
  const SdpaOp& pv = g.ops.back();
  ASSERT_EQ(pv.kind, SdpaOpKind::matmul);
  g.tensors[pv.x].type = SdpaType::f32;
  EXPECT_TRUE(plan_sdpa_for_device(g, h100()).engines.empty());
}

}  // namespace
