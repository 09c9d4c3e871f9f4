// The CUDA backend of a run (backend.hpp's DeviceBackend): one GPU per local rank, a compute
// stream with its cuBLAS handle (cuda/layers.cuh's CudaContext), the model kernels and the
// elementwise ops on that stream, and device memory from the GPU's default stream-ordered pool
// (cudaMallocAsync, its release threshold raised so that freed blocks stay cached for the next
// step instead of going back to the driver). Plain C++ header: host-only sources include it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../backend.hpp"  // strata::DeviceBackend ("backend.hpp" would be this file)
#include "backends/cuda/device.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/ops.hpp"
#include "comm/idle_clock.hpp"

namespace strata::cuda {

// Marks on the compute stream for exposed-comm time (comm/idle_clock.hpp): timing events from a
// pool, recorded on the stream, measured against each other once the stream has passed them.
class StreamIdleClock final : public IdleClock {
 public:
  explicit StreamIdleClock(cudaStream_t stream) : stream_(stream) {}
  ~StreamIdleClock() override;
  std::uint64_t mark() override;
  double seconds_between(std::uint64_t a, std::uint64_t b) override;
  void release(std::uint64_t mark) override;

 private:
  cudaStream_t stream_;
  std::mutex mu_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, cudaEvent_t> marks_;  // recorded, not yet measured
  std::vector<cudaEvent_t> free_;
};

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend(int device, AttentionKernel attention);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::cuda; }
  int ordinal() const override { return context_.device; }
  std::string device_name() const override { return name_; }
  std::string device_uuid() const override { return cuda_device_uuid(context_.device); }
  double peak_flops(bool bf16) const override;
  Kernels& kernels() override { return kernels_; }
  DeviceOps& ops() override { return ops_; }
  void* allocate(std::size_t bytes) override;
  void release(void* p) noexcept override;
  void* allocate_host(std::size_t bytes) override;
  void release_host(void* p) noexcept override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void synchronize() override { context_.synchronize(); }
  void record_compute_event() override;
  std::uint64_t peak_device_bytes() override;
  std::unique_ptr<StreamGraph> capture(const std::function<void()>& work) override;

  cudaStream_t stream() const { return context_.stream; }
  static bool on_device(const void* p);  // device memory (not host, pinned or unregistered)
  cudaEvent_t compute_event() const { return compute_event_; }

 private:
  CudaContext context_;
  CudaKernels kernels_;
  CudaOps ops_;
  cudaMemPool_t pool_ = nullptr;
  // Page-locked host blocks released, by size, for the next allocate_host of that size:
  // cudaMallocHost pins every page and costs far more than the copies it speeds up, and offload
  // stages the same shards every step (PyTorch's CachingHostAllocator keeps them the same way).
  std::multimap<std::size_t, void*> host_free_;
  std::map<void*, std::size_t> host_size_;  // every pinned block and its size
  std::mutex host_mu_;
  cudaEvent_t compute_event_ = nullptr;
  // Copies made in comm-stream work (offload's d2h/h2d) run on copy_stream_, after copy_after_
  // recorded on the compute stream.
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t copy_after_ = nullptr;
  std::string name_;
  StreamIdleClock idle_clock_;  // the process's idle clock while this backend is open
};

// "" when request.local_size ranks on this node can each have a GPU of their own, as far as this
// process sees them, and this build has the attention asked for, else one line saying what is
// missing (no GPU or driver; fewer GPUs than ranks; cuDNN for --attention cudnn).
std::string cuda_unavailable(const BackendRequest& request);

// The GPU of local rank `local_rank` of `local_size`: that ordinal where the node's ranks see every
// GPU; 0 where each sees one (Slurm's --gpus-per-task binds one per task). The trainer then checks
// that no two ranks of a node have the same GPU (by UUID).
int cuda_device_for(int local_rank, int local_size);

// Registers the CUDA backend for --device cuda (backend.hpp). The runner calls it at start-up.
void register_backend();

// The run's CUDA backend once open, else null: the NCCL transport orders its groups after it.
CudaBackend* opened_cuda_backend();

}  // namespace strata::cuda
