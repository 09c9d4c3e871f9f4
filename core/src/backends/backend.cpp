// The device backend registry (backend.hpp) and what the SDK routes through it: device_ops(), and
// the allocation of every Buffer (strata/memory.hpp) on its ledger's device.
#include "backends/backend.hpp"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/memory.hpp"

namespace strata {
namespace {

constexpr int kDevices = 2;  // Device::cpu, Device::cuda

struct Registry {
  std::array<BackendFactory, kDevices> factories{};
  std::array<std::unique_ptr<DeviceBackend>, kDevices> opened{};
};

Registry& registry() {
  static Registry r;
  return r;
}

int index_of(Device d) { return static_cast<int>(d); }

// A declared backend library (declare_backend_library): loaded at most once per process.
struct BackendLibrary {
  Device device;
  std::string path;
  std::vector<std::string> transports;
  bool tried = false;
  std::string error;  // why it did not load; "" once loaded
};

std::mutex g_libraries_mutex;
std::vector<BackendLibrary> g_libraries;

// "" once `lib` is loaded and attached; else why not (the same answer on every later call).
std::string load_locked(BackendLibrary& lib) {
  if (lib.tried) return lib.error;
  lib.tried = true;
  // RTLD_LOCAL: its symbols serve only itself; libstrata_core (already loaded) stays the one
  // registry both sides see.
  void* handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) return lib.error = std::string("cannot load ") + dlerror();
  void* attach = dlsym(handle, "strata_attach_backend");
  if (!attach) return lib.error = lib.path + " has no strata_attach_backend (not a strata backend)";
  reinterpret_cast<void (*)()>(attach)();  // never closed: its code runs until the process exits
  return "";
}

// The library declared for `device`, or null. Under g_libraries_mutex.
BackendLibrary* library_of(Device device) {
  for (BackendLibrary& lib : g_libraries)
    if (lib.device == device) return &lib;
  return nullptr;
}

// Loads the library declared for `device`, if any: "" when loaded or none declared.
std::string load_library_of(Device device) {
  std::lock_guard lock(g_libraries_mutex);
  BackendLibrary* lib = library_of(device);
  return lib ? load_locked(*lib) : "";
}

bool library_declared(Device device) {
  std::lock_guard lock(g_libraries_mutex);
  return library_of(device) != nullptr;
}

DeviceBackend& backend_of(Device d, const char* what) {
  if (DeviceBackend* b = opened_backend(d)) return *b;
  throw Error(std::string(what) + ": no " + device_name(d) + " backend is open in this process",
              "memory of a device is usable only in a run on it (--device " +
                  std::string(device_name(d)) + ")");
}

}  // namespace

void register_backend(Device device, const BackendFactory& factory) {
  registry().factories[index_of(device)] = factory;
}

void declare_backend_library(Device device, const std::string& library,
                             const std::vector<std::string>& transports) {
  std::lock_guard lock(g_libraries_mutex);
  g_libraries.push_back(BackendLibrary{device, library, transports, false, ""});
}

std::vector<std::string> declared_transports() {
  std::lock_guard lock(g_libraries_mutex);
  std::vector<std::string> out;
  for (const BackendLibrary& lib : g_libraries)
    if (!lib.tried || !lib.error.empty())  // once loaded, its own registration names them
      out.insert(out.end(), lib.transports.begin(), lib.transports.end());
  return out;
}

std::string load_backend_library_of(const std::string& transport) {
  std::lock_guard lock(g_libraries_mutex);
  for (BackendLibrary& lib : g_libraries)
    for (const std::string& t : lib.transports)
      if (t == transport) return load_locked(lib);
  return "";
}

bool backend_built(Device device) {
  return device == Device::cpu || registry().factories[index_of(device)].open != nullptr ||
         library_declared(device);
}

std::string backend_unavailable(Device device, const BackendRequest& request) {
  if (device == Device::cpu) return "";
  if (std::string why = load_library_of(device); !why.empty()) return why;
  const BackendFactory& f = registry().factories[index_of(device)];
  if (!f.open)
    return std::string("this build has no ") + device_name(device) +
           " backend (configure with the CUDA toolkit found: -DSTRATA_WITH_CUDA=ON)";
  return f.unavailable ? f.unavailable(request) : "";
}

double device_free_memory(Device device, const BackendRequest& request) {
  if (device == Device::cpu || !load_library_of(device).empty()) return 0;
  const BackendFactory& f = registry().factories[index_of(device)];
  return f.free_memory ? f.free_memory(request) : 0;
}

DeviceBackend& open_backend(Device device, const BackendRequest& request) {
  if (DeviceBackend* b = opened_backend(device)) return *b;
  // Whether there is a device at all: how the node's ranks share the devices they see is the
  // factory's to decide (each rank may see all of them, or only its own).
  const std::string why = backend_unavailable(device, BackendRequest{request.local_rank, 1});
  if (!why.empty()) throw ConfigError(std::string("--device ") + device_name(device) + ": " + why);
  auto& slot = registry().opened[index_of(device)];
  slot = registry().factories[index_of(device)].open(request);
  return *slot;
}

DeviceBackend* opened_backend(Device device) {
  return device == Device::cpu ? nullptr : registry().opened[index_of(device)].get();
}

void close_backends() noexcept {
  for (auto& b : registry().opened) b.reset();
}

Kernels& device_kernels(Device device) {
  return device == Device::cpu ? cpu_kernels() : backend_of(device, "model kernels").kernels();
}

DeviceOps& device_ops(Device device) {
  return device == Device::cpu ? cpu_ops() : backend_of(device, "device ops").ops();
}

void copy_bytes(Device device, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (device == Device::cpu)
    std::memmove(dst, src, bytes);
  else
    backend_of(device, "copy").copy(dst, src, bytes);
}

void copy_across(BufferView dst, BufferView src) {
  if (dst.count != src.count || dst.dtype != src.dtype)
    throw Error(std::string("copy_across: ") + std::to_string(src.count) + " " +
                dtype_name(src.dtype) + " elements into " + std::to_string(dst.count) + " " +
                dtype_name(dst.dtype));
  const Device device = dst.device != Device::cpu ? dst.device : src.device;
  copy_bytes(device, dst.data, src.data, dst.bytes());
}

namespace {
// Makes the whole pages of [p, p + bytes) resident in one call (Linux >= 5.14; elsewhere the
// zero-fill below faults them in). Otherwise the zero-fill takes a trap per fresh page, 10-12 us
// each on this project's virtual machines (2026-12-06): a 2-rank tiny run took 20,182 page faults
// before and 11,327 after (with the warm-up GEMM's pages, cpu/layers.cpp). The pages resident
// afterwards are the same either way.
void populate(void* p, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  // Smaller blocks come from the heap, whose pages are mostly resident already.
  constexpr std::size_t kWorthIt = 64 << 10;
  if (bytes < kWorthIt) return;
  const auto page = std::uintptr_t(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t first = (std::uintptr_t(p) + page - 1) / page * page;
  const std::uintptr_t end = (std::uintptr_t(p) + bytes) / page * page;
  if (end > first) ::madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE);
#else
  (void)p, (void)bytes;
#endif
}

// Host blocks of kOwnMappingBytes or more are anonymous mappings of their own, unmapped when
// released, so that the process's resident memory follows the ledger (a freed 16 MiB gradient
// buffer leaves RSS at once) while the C library's heap keeps what the other libraries free for
// their next call (the runner's allocator policy, run/process_memory.hpp). A block ends where its
// mapping's last accessible page ends, and the page after it is inaccessible: an overrun faults at
// once (ASan's redzones surround only the C library's blocks).
constexpr std::size_t kOwnMappingBytes = std::size_t(1) << 20;

struct Mapping {
  void* base;
  std::size_t length;  // with the inaccessible page
};
std::mutex g_mapped_mu;
std::unordered_map<void*, Mapping> g_mapped;  // block -> its mapping

void* map_block(std::size_t rounded) {
  const auto page = std::size_t(::sysconf(_SC_PAGESIZE));
  const std::size_t pages = (rounded + page - 1) / page * page;
  const std::size_t length = pages + page;
  // MAP_POPULATE: resident in one call; fresh anonymous pages read as zero.
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  char* guard = static_cast<char*>(base) + pages;
  ::mprotect(guard, page, PROT_NONE);
  void* p = guard - rounded;  // 64-byte aligned: pages and rounded are multiples of 64
  std::lock_guard<std::mutex> lock(g_mapped_mu);
  g_mapped.emplace(p, Mapping{base, length});
  return p;
}

// Unmaps `p` if it is a block of its own mapping; false for the C library's.
bool unmap_block(void* p) noexcept {
  Mapping m{};
  {
    std::lock_guard<std::mutex> lock(g_mapped_mu);
    const auto it = g_mapped.find(p);
    if (it == g_mapped.end()) return false;
    m = it->second;
    g_mapped.erase(it);
  }
  ::munmap(m.base, m.length);
  return true;
}
}  // namespace

void* allocate_bytes(Device device, std::size_t bytes) {
  if (device != Device::cpu) return backend_of(device, "allocation").allocate(bytes);
  if (bytes > SIZE_MAX - 63) throw std::bad_alloc();
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded >= kOwnMappingBytes) return map_block(rounded);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  populate(p, rounded);
  std::memset(p, 0, rounded);
  return p;
}

void release_bytes(Device device, void* p) noexcept {
  if (!p) return;
  if (device == Device::cpu) {
    if (!unmap_block(p)) std::free(p);
  } else if (DeviceBackend* b = opened_backend(device)) {
    b->release(p);
  }
}

namespace {
// The host blocks a backend gave (page-locked): released through it, or, once it is closed (its
// destructor freed them), not at all; every other host block is the C library's.
std::mutex g_pinned_mu;
std::set<void*> g_pinned;
}  // namespace

void* allocate_host_bytes(Device device, std::size_t bytes) {
  DeviceBackend* b = device != Device::cpu ? opened_backend(device) : nullptr;
  if (!b) return allocate_bytes(Device::cpu, bytes);
  void* p = b->allocate_host(bytes);
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  g_pinned.insert(p);
  return p;
}

void release_host_bytes(Device device, void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    if (g_pinned.erase(p) == 0) {
      release_bytes(Device::cpu, p);
      return;
    }
  }
  if (DeviceBackend* b = device != Device::cpu ? opened_backend(device) : nullptr)
    b->release_host(p);
}

}  // namespace strata
