// NVML's GPU link matrix for the node topology (see cuda/nvml_topology.hpp).
#include "backends/cuda/nvml_topology.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

namespace strata::cuda {

namespace {

// The few NVML declarations used (nvml.h, a stable C ABI; the toolkit here ships no nvml.h).
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr int kNvmlSuccess = 0;
constexpr unsigned kMaxNvLinks = 18;  // NVML_NVLINK_MAX_LINKS (H100: 18)
constexpr int kFeatureEnabled = 1;    // NVML_FEATURE_ENABLED

// NVML opened with dlopen; every entry point null when the library or a symbol is missing.
struct Nvml {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned*) = nullptr;
  int (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  int (*ancestor)(nvmlDevice_t, nvmlDevice_t, int*) = nullptr;
  int (*link_state)(nvmlDevice_t, unsigned, int*) = nullptr;
  int (*remote_pci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  int (*pci)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  int (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  int (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;

  explicit Nvml(const char* library) {
    lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    load(init, "nvmlInit_v2");
    load(shutdown, "nvmlShutdown");
    load(count, "nvmlDeviceGetCount_v2");
    load(handle, "nvmlDeviceGetHandleByIndex_v2");
    load(ancestor, "nvmlDeviceGetTopologyCommonAncestor");
    load(link_state, "nvmlDeviceGetNvLinkState");
    load(remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    load(pci, "nvmlDeviceGetPciInfo_v3");
    load(by_uuid, "nvmlDeviceGetHandleByUUID");
    load(memory, "nvmlDeviceGetMemoryInfo");
    started = init && shutdown && count && handle && ancestor && pci && init() == kNvmlSuccess;
  }
  ~Nvml() {
    if (started) shutdown();
    if (lib) dlclose(lib);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  template <class F>
  void load(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
  }
  bool started = false;
};

bool same_device(const nvmlPciInfo_t& a, const nvmlPciInfo_t& b) {
  return a.domain == b.domain && a.bus == b.bus && a.device == b.device;
}

// NVLinks from each GPU to each other one: the active links' remote PCI addresses.
std::vector<std::vector<int>> nvlink_counts(const Nvml& nvml, const std::vector<nvmlDevice_t>& gpus,
                                            const std::vector<nvmlPciInfo_t>& pci) {
  const std::size_t n = gpus.size();
  std::vector<std::vector<int>> links(n, std::vector<int>(n, 0));
  if (!nvml.link_state || !nvml.remote_pci) return links;
  for (std::size_t i = 0; i < n; ++i)
    for (unsigned l = 0; l < kMaxNvLinks; ++l) {
      int active = 0;
      nvmlPciInfo_t remote{};
      if (nvml.link_state(gpus[i], l, &active) != kNvmlSuccess || active != kFeatureEnabled ||
          nvml.remote_pci(gpus[i], l, &remote) != kNvmlSuccess)
        continue;
      for (std::size_t j = 0; j < n; ++j)
        if (j != i && same_device(remote, pci[j])) ++links[i][j];
    }
  return links;
}

}  // namespace

std::string path_name(int level) {
  switch (level) {
    case 0:
      return "BOARD";
    case 10:
      return "PIX";
    case 20:
      return "PXB";
    case 30:
      return "PHB";
    case 40:
      return "NODE";
    case 50:
      return "SYS";
    default:
      return "?";
  }
}

std::string link_matrix_text(const std::vector<std::vector<int>>& nvlinks,
                             const std::vector<std::vector<int>>& levels) {
  std::string out;
  for (std::size_t i = 0; i < levels.size(); ++i) {
    if (i) out += "; ";
    for (std::size_t j = 0; j < levels.size(); ++j) {
      if (j) out += " ";
      if (i == j)
        out += "X";
      else if (nvlinks[i][j] > 0)
        out += "NV" + std::to_string(nvlinks[i][j]);
      else
        out += path_name(levels[i][j]);
    }
  }
  return out;
}

void add_gpu_links(NodeTopology& node, const char* library) {
  const Nvml nvml(library);
  unsigned n = 0;
  if (!nvml.started || nvml.count(&n) != kNvmlSuccess || n == 0) return;
  std::vector<nvmlDevice_t> gpus(n);
  std::vector<nvmlPciInfo_t> pci(n);
  for (unsigned i = 0; i < n; ++i)
    if (nvml.handle(i, &gpus[i]) != kNvmlSuccess || nvml.pci(gpus[i], &pci[i]) != kNvmlSuccess)
      return;  // a GPU NVML cannot describe: no matrix rather than a wrong one
  std::vector<std::vector<int>> levels(n, std::vector<int>(n, -1));
  for (unsigned i = 0; i < n; ++i)
    for (unsigned j = 0; j < n; ++j)
      if (i != j && nvml.ancestor(gpus[i], gpus[j], &levels[i][j]) != kNvmlSuccess)
        levels[i][j] = -1;
  node.numbers.emplace_back("nvml_gpus", std::int64_t(n));
  node.text.emplace_back("gpu_links", link_matrix_text(nvlink_counts(nvml, gpus, pci), levels));
}

double least_free_memory(const std::vector<std::string>& uuids, const char* library) {
  const Nvml nvml(library);
  if (!nvml.started || !nvml.by_uuid || !nvml.memory || uuids.empty()) return 0;
  double least = 0;
  for (const std::string& uuid : uuids) {
    nvmlDevice_t gpu = nullptr;
    nvmlMemory_t m{};
    if (nvml.by_uuid(uuid.c_str(), &gpu) != kNvmlSuccess || nvml.memory(gpu, &m) != kNvmlSuccess)
      return 0;  // a GPU NVML does not know: unknown rather than another GPU's figure
    if (least == 0 || double(m.free) < least) least = std::max(double(m.free), 1.0);
  }
  return least;
}

void register_topology() {
  register_topology_provider([](NodeTopology& node) { add_gpu_links(node); });
}

}  // namespace strata::cuda
