// NVML's GPU link matrix (cuda/nvml_topology.hpp), in every build: the matrix text from link
// counts and PCIe paths, and the provider on a machine without the NVIDIA driver.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "backends/cuda/nvml_topology.hpp"

namespace {

TEST(NvmlTopology, MatrixInNvidiaSmiWords) {
  // GPUs 0 and 1 share 18 NVLinks (H100 SXM pair); 2 reaches them through PCIe: one switch to 0,
  // across NUMA nodes to 1.
  const std::vector<std::vector<int>> nvlinks{{0, 18, 0}, {18, 0, 0}, {0, 0, 0}};
  const std::vector<std::vector<int>> levels{{-1, 40, 10}, {40, -1, 50}, {10, 50, -1}};
  EXPECT_EQ(strata::cuda::link_matrix_text(nvlinks, levels), "X NV18 PIX; NV18 X SYS; PIX SYS X");
  EXPECT_EQ(strata::cuda::link_matrix_text({{0}}, {{-1}}), "X");
  EXPECT_EQ(strata::cuda::path_name(0), "BOARD");
  EXPECT_EQ(strata::cuda::path_name(20), "PXB");
  EXPECT_EQ(strata::cuda::path_name(30), "PHB");
  EXPECT_EQ(strata::cuda::path_name(7), "?");
}

// NVML's answers turned into the matrix, on a stand-in library (fake_nvml.cpp) with three GPUs.
TEST(NvmlTopology, MatrixFromNvml) {
  strata::NodeTopology node{"here", {{"cores", 2}}, {}};
  strata::cuda::add_gpu_links(node, STRATA_FAKE_NVML);
  EXPECT_EQ(node.number("nvml_gpus"), 3);
  EXPECT_EQ(node.str("gpu_links"), "X NV4 PIX; NV4 X SYS; PIX SYS X");
  strata::NodeTopology none{"here", {}, {}};
  strata::cuda::add_gpu_links(none, "libstrata-no-such-nvml.so");  // no library: nothing added
  EXPECT_TRUE(none.numbers.empty());
  EXPECT_TRUE(none.text.empty());
}

// Memory admission's figure for a GPU run: the least free memory among the ranks' GPUs, found
// by UUID; unknown (0) when a GPU or the library is missing.
TEST(NvmlTopology, LeastFreeMemoryOfTheRanksGpus) {
  constexpr double GiB = 1024.0 * 1024 * 1024;
  using strata::cuda::least_free_memory;
  EXPECT_DOUBLE_EQ(least_free_memory({"GPU-fake-2", "GPU-fake-1"}, STRATA_FAKE_NVML), 2 * GiB);
  EXPECT_DOUBLE_EQ(least_free_memory({"GPU-fake-2"}, STRATA_FAKE_NVML), 3 * GiB);
  EXPECT_EQ(least_free_memory({"GPU-fake-0", "GPU-other"}, STRATA_FAKE_NVML), 0);
  EXPECT_EQ(least_free_memory({}, STRATA_FAKE_NVML), 0);
  EXPECT_EQ(least_free_memory({"GPU-fake-0"}, "libstrata-no-such-nvml.so"), 0);
}

// Without libnvidia-ml (no driver) nothing is added; with it, an n x n matrix for nvml_gpus = n.
TEST(NvmlTopology, ProviderOnThisMachine) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) dlclose(lib);
  strata::NodeTopology node{"here", {{"cores", 2}}, {}};
  strata::cuda::add_gpu_links(node);
  if (!lib) {
    EXPECT_EQ(node.numbers.size(), 1u);
    EXPECT_TRUE(node.text.empty());
    return;
  }
  const std::int64_t n = node.number("nvml_gpus");
  const std::string links = node.str("gpu_links");
  if (n < 0) return;  // NVML without a GPU: nothing to describe
  EXPECT_EQ(std::count(links.begin(), links.end(), ';'), n - 1) << links;
  EXPECT_EQ(std::count(links.begin(), links.end(), 'X'), n) << links;
}

}  // namespace
