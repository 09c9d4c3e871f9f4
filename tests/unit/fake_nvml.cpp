// A stand-in for libnvidia-ml.so.1 (test_nvml_topology): three GPUs; 0 and 1 joined by 4 NVLinks
// and in one NUMA node, 2 behind the same PCIe switch as 0 and across NUMA nodes from 1; GPU i has
// UUID "GPU-fake-i" and (i + 1) GiB free of 80 GiB. Only the entry points cuda/nvml_topology.cpp
// looks up, with NVML's C signatures (enums as int).
#include <cstdint>
#include <cstring>
#include <string>

namespace {
struct PciInfo {  // nvmlPciInfo_t
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr unsigned kGpus = 3;
unsigned index_of(void* device) { return unsigned(reinterpret_cast<std::uintptr_t>(device)) - 1; }
void fill_pci(unsigned gpu, PciInfo* pci) {
  std::memset(pci, 0, sizeof *pci);
  pci->bus = 0x10 + gpu;
}
}  // namespace

extern "C" {
int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetCount_v2(unsigned* n) {
  *n = kGpus;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void** device) {
  if (i >= kGpus) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = reinterpret_cast<void*>(std::uintptr_t(i) + 1);
  return 0;
}
int nvmlDeviceGetPciInfo_v3(void* device, PciInfo* pci) {
  fill_pci(index_of(device), pci);
  return 0;
}
int nvmlDeviceGetTopologyCommonAncestor(void* a, void* b, int* level) {
  const unsigned i = index_of(a), j = index_of(b);
  const unsigned pair = i < j ? i * 10 + j : j * 10 + i;
  *level = pair == 1 ? 40 : pair == 2 ? 10 : 50;  // 0-1 NODE, 0-2 PIX, 1-2 SYS
  return 0;
}
int nvmlDeviceGetNvLinkState(void* device, unsigned link, int* active) {
  if (link >= 18) return 2;
  *active = index_of(device) < 2 && link < 4 ? 1 : 0;
  return 0;
}
int nvmlDeviceGetHandleByUUID(const char* uuid, void** device) {
  for (unsigned i = 0; i < kGpus; ++i)
    if (std::strcmp(uuid, ("GPU-fake-" + std::to_string(i)).c_str()) == 0) {
      *device = reinterpret_cast<void*>(std::uintptr_t(i) + 1);
      return 0;
    }
  return 13;  // NVML_ERROR_NOT_FOUND
}
struct Memory {  // nvmlMemory_t
  unsigned long long total, free, used;
};
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  m->total = 80ull << 30;
  m->free = (index_of(device) + 1ull) << 30;
  m->used = m->total - m->free;
  return 0;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void* device, unsigned, PciInfo* pci) {
  fill_pci(index_of(device) == 0 ? 1 : 0, pci);
  return 0;
}
}
