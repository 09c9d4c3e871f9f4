// The CUDA emulator's device memory: exact-size host blocks, filled with 0xFF (NaN as float) and
// tracked, so a wrong size, offset or leading dimension is an AddressSanitizer report or a refused
// call instead of a silent read of a neighbour.
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>

#include "internal.hpp"

namespace strata_emu {
namespace {

constexpr std::size_t kDeviceBytes = std::size_t(16) << 30;  // cudaDeviceProp::totalGlobalMem
constexpr std::align_val_t kAlignment{256};                  // cudaMalloc's alignment

struct Allocation {
  std::size_t bytes;
  bool pinned;  // cudaMallocHost: host memory that kernels may read too
};

std::mutex mutex;
std::map<std::uintptr_t, Allocation> allocations;
std::size_t device_bytes_used = 0;

cudaError_t allocate(void** ptr, std::size_t bytes, bool pinned) {
  if (ptr == nullptr) return set_last_error(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  std::lock_guard lock(mutex);
  if (!pinned && bytes > kDeviceBytes - device_bytes_used)
    return set_last_error(cudaErrorMemoryAllocation);
  void* p = ::operator new(bytes, kAlignment, std::nothrow);
  if (p == nullptr) return set_last_error(cudaErrorMemoryAllocation);
  std::memset(p, 0xFF, bytes);
  allocations.emplace(reinterpret_cast<std::uintptr_t>(p), Allocation{bytes, pinned});
  if (!pinned) device_bytes_used += bytes;
  *ptr = p;
  return cudaSuccess;
}

// The default memory pool's statistics (cudaMallocAsync / cudaFreeAsync): bytes in use and their
// high-water mark. The emulator keeps no cache, so reserved equals used.
struct PoolStats {
  std::uint64_t used = 0, used_high = 0, release_threshold = 0;
};
PoolStats pool;
std::map<std::uintptr_t, std::size_t> pool_blocks;  // pointer -> bytes, of live pool allocations

// Frees a block without waiting for the streams: cudaFree waits (below), cudaFreeAsync runs this in
// stream order on the stream's own thread.
cudaError_t release_now(void* ptr, bool pinned) {
  std::lock_guard lock(mutex);
  const auto it = allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == allocations.end() || it->second.pinned != pinned) {
    report("%s(%p): not a pointer %s returned", pinned ? "cudaFreeHost" : "cudaFree", ptr,
           pinned ? "cudaMallocHost" : "cudaMalloc");
    return set_last_error(cudaErrorInvalidValue);
  }
  if (!pinned) device_bytes_used -= it->second.bytes;
  allocations.erase(it);
  if (const auto block = pool_blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
      block != pool_blocks.end()) {
    pool.used -= block->second;
    pool_blocks.erase(block);
  }
  ::operator delete(ptr, kAlignment);
  return cudaSuccess;
}

cudaError_t release(void* ptr, bool pinned) {
  if (ptr == nullptr) return cudaSuccess;
  // cudaFree waits for the device, so no queued work still uses the block.
  synchronize_all_streams();
  return release_now(ptr, pinned);
}

// Whether a copy's sides are where its kind says, with a message naming the side that is not.
bool check_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_device && !in_device_memory(dst, bytes)) {
    report("cudaMemcpy: destination [%p, +%zu) is not inside one device allocation", dst, bytes);
    return false;
  }
  if (src_device && !in_device_memory(src, bytes)) {
    report("cudaMemcpy: source [%p, +%zu) is not inside one device allocation", src, bytes);
    return false;
  }
  return true;
}

cudaError_t copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                 cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return set_last_error(cudaErrorInvalidMemcpyDirection);
  if (dst == nullptr || src == nullptr || !check_copy(dst, src, bytes, kind))
    return set_last_error(cudaErrorInvalidValue);
  return set_last_error(enqueue(stream, [=] { std::memmove(dst, src, bytes); }));
}

cudaError_t fill(void* ptr, int value, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!in_device_memory(ptr, bytes)) {
    report("cudaMemset: [%p, +%zu) is not inside one device allocation", ptr, bytes);
    return set_last_error(cudaErrorInvalidValue);
  }
  return set_last_error(enqueue(stream, [=] { std::memset(ptr, value, bytes); }));
}

}  // namespace

cudaError_t allocate_block(void** ptr, std::size_t bytes) { return allocate(ptr, bytes, false); }
void free_block(void* ptr) { release_now(ptr, false); }

bool in_device_memory(const void* p, std::size_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mutex);
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return false;
  --it;
  // A pointer one past the end is a valid kernel argument (an empty range) but reads nothing.
  return address + bytes <= it->first + it->second.bytes;
}

}  // namespace strata_emu

using strata_emu::set_last_error;

extern "C" {

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
  if (strata_emu::capture_forbids("cudaMalloc"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  return strata_emu::allocate(ptr, bytes, false);
}
cudaError_t cudaFree(void* ptr) {
  if (strata_emu::capture_forbids("cudaFree"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  return strata_emu::release(ptr, false);
}
cudaError_t cudaMallocHost(void** ptr, std::size_t bytes) {
  if (strata_emu::capture_forbids("cudaMallocHost"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  return strata_emu::allocate(ptr, bytes, true);
}
cudaError_t cudaFreeHost(void* ptr) {
  if (strata_emu::capture_forbids("cudaFreeHost"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  return strata_emu::release(ptr, true);
}

cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return set_last_error(cudaErrorInvalidValue);
  std::lock_guard lock(strata_emu::mutex);
  *total_bytes = strata_emu::kDeviceBytes;
  *free_bytes = strata_emu::kDeviceBytes - strata_emu::device_bytes_used;
  return cudaSuccess;
}

// Stream-ordered allocation from the device's default pool: the block exists at once (the
// emulator need not wait for the stream to reach the call), is NaN-filled like cudaMalloc's, and
// is freed when `stream` reaches cudaFreeAsync.
// On a capturing stream the block is the graph's instead (graphs.cpp), outside the pool.
cudaError_t cudaMallocAsync(void** ptr, std::size_t bytes, cudaStream_t stream) {
  const cudaError_t err = strata_emu::allocate(ptr, bytes, false);
  if (err != cudaSuccess || *ptr == nullptr) return err;
  if (strata_emu::capture_allocates(stream, *ptr)) return cudaSuccess;
  std::lock_guard lock(strata_emu::mutex);
  strata_emu::pool_blocks[reinterpret_cast<std::uintptr_t>(*ptr)] = bytes;
  strata_emu::pool.used += bytes;
  if (strata_emu::pool.used > strata_emu::pool.used_high)
    strata_emu::pool.used_high = strata_emu::pool.used;
  return cudaSuccess;
}
// The pool's statistics drop the block at once, before `stream` reaches the free: in CUDA an
// allocation later on the same stream may reuse it, so a loop that frees and allocates the same
// bytes keeps the pool's high-water mark flat whatever the host and the stream's timing.
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr || strata_emu::capture_frees(stream, ptr)) return cudaSuccess;
  {
    std::lock_guard lock(strata_emu::mutex);
    const auto block = strata_emu::pool_blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (block == strata_emu::pool_blocks.end()) {
      strata_emu::report("cudaFreeAsync(%p): not a pointer cudaMallocAsync returned", ptr);
      return set_last_error(cudaErrorInvalidValue);
    }
    strata_emu::pool.used -= block->second;
    strata_emu::pool_blocks.erase(block);
  }
  return set_last_error(
      strata_emu::enqueue(stream, [ptr] { strata_emu::release_now(ptr, false); }));
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (pool == nullptr) return set_last_error(cudaErrorInvalidValue);
  if (device < 0 || device >= strata_emu::device_count())
    return set_last_error(cudaErrorInvalidDevice);
  static int the_pool;  // one pool: the devices share the host's memory
  *pool = reinterpret_cast<cudaMemPool_t>(&the_pool);
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (pool == nullptr || value == nullptr) return set_last_error(cudaErrorInvalidValue);
  std::lock_guard lock(strata_emu::mutex);
  auto* v = static_cast<std::uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold:
      strata_emu::pool.release_threshold = *v;
      return cudaSuccess;
    case cudaMemPoolAttrReservedMemHigh:  // only resetting to 0 is allowed, as in CUDA
    case cudaMemPoolAttrUsedMemHigh:
      if (*v != 0) return set_last_error(cudaErrorInvalidValue);
      strata_emu::pool.used_high = strata_emu::pool.used;
      return cudaSuccess;
    default:
      return set_last_error(cudaErrorInvalidValue);
  }
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (pool == nullptr || value == nullptr) return set_last_error(cudaErrorInvalidValue);
  std::lock_guard lock(strata_emu::mutex);
  auto* v = static_cast<std::uint64_t*>(value);
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold:
      *v = strata_emu::pool.release_threshold;
      return cudaSuccess;
    case cudaMemPoolAttrReservedMemCurrent:
    case cudaMemPoolAttrUsedMemCurrent:
      *v = strata_emu::pool.used;
      return cudaSuccess;
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh:
      *v = strata_emu::pool.used_high;
      return cudaSuccess;
    default:
      return set_last_error(cudaErrorInvalidValue);
  }
}

// Synchronous copies and fills run on the legacy default stream: after the blocking streams' work.
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (strata_emu::capture_forbids("cudaMemcpy"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  return strata_emu::copy(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return strata_emu::copy(dst, src, bytes, kind, stream);
}
cudaError_t cudaMemset(void* ptr, int value, std::size_t bytes) {
  if (strata_emu::capture_forbids("cudaMemset"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  return strata_emu::fill(ptr, value, bytes, nullptr);
}
cudaError_t cudaMemsetAsync(void* ptr, int value, std::size_t bytes, cudaStream_t stream) {
  return strata_emu::fill(ptr, value, bytes, stream);
}

// Inside an allocation: device memory (cudaMalloc) or host memory (cudaMallocHost); anywhere
// else unregistered host memory, which CUDA >= 11 also answers with cudaSuccess.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return set_last_error(cudaErrorInvalidValue);
  *attributes = {cudaMemoryTypeUnregistered, -2, nullptr, const_cast<void*>(ptr)};
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(strata_emu::mutex);
  auto it = strata_emu::allocations.upper_bound(address);
  if (it == strata_emu::allocations.begin() ||
      address >= std::prev(it)->first + std::prev(it)->second.bytes)
    return cudaSuccess;
  const bool pinned = std::prev(it)->second.pinned;
  *attributes = {pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice, 0, const_cast<void*>(ptr),
                 pinned ? const_cast<void*>(ptr) : nullptr};
  return cudaSuccess;
}

}  // extern "C"
