// The GPU-to-GPU link matrix of this node from NVML (what `nvidia-smi topo -m` prints), added to
// the run file's node topology (topology.hpp) in CUDA builds. Plain C++ with no NVML header:
// libnvidia-ml.so.1 comes with the driver, not the toolkit, so it is opened at run time and a
// machine without the driver runs and records no matrix.
#pragma once
#include <string>
#include <vector>

#include "provenance/topology.hpp"

namespace strata::cuda {

// NVML's path between two GPUs (nvmlGpuTopologyLevel_t) in nvidia-smi's words: 0 same board
// (BOARD), 10 one PCIe switch (PIX), 20 several switches (PXB), 30 a host bridge (PHB), 40 within
// a NUMA node (NODE), 50 across NUMA nodes (SYS); anything else "?".
std::string path_name(int nvml_level);

// The matrix as text: rows joined by "; ", entries by " "; "X" on the diagonal, "NV<n>" where
// n > 0 NVLinks join the two GPUs, else path_name(levels[i][j]). Both matrices are n x n.
std::string link_matrix_text(const std::vector<std::vector<int>>& nvlinks,
                             const std::vector<std::vector<int>>& levels);

// The topology provider: adds nvml_gpus (int64) and gpu_links (text, over all of the node's GPUs
// in NVML's PCI order, as nvidia-smi) when NVML loads and sees a GPU; otherwise adds nothing.
// `library`: the NVML to open (the tests' stand-in; the provider uses the driver's).
void add_gpu_links(NodeTopology& node, const char* library = "libnvidia-ml.so.1");

// The least free memory, in bytes, among the GPUs with these UUIDs ("GPU-..." as
// cuda_device_uuid() prints them): NVML reads it without a CUDA context, so the launcher holds
// none while its ranks run. 0 when NVML, a GPU or its figure is missing.
double least_free_memory(const std::vector<std::string>& uuids,
                         const char* library = "libnvidia-ml.so.1");

// register_topology_provider(add_gpu_links): the runner calls it in CUDA builds.
void register_topology();

}  // namespace strata::cuda
