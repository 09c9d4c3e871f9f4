// The NCCL transport: Group over an NCCL communicator, on device buffers and one CUDA stream.
// Built into strata_cuda when NCCL is found (STRATA_HAVE_NCCL=1 on the target). Plain C++:
// includable from host-only translation units.
//
// Every call is blocking for the calling thread, as on every transport (see strata/comm.hpp): it
// enqueues the NCCL call on the group's stream and waits for that stream, so time measured on the
// host around a call equals the stream time of the call (plus whatever was queued on the stream
// before it: give the group a stream of its own). A CUDA event pair around the NCCL call gives the
// same call's GPU-measured time, last_gpu_seconds().
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "strata/comm.hpp"

namespace strata::nccl {

// "2.x.y", from ncclGetVersion (the library loaded at run time, not the header built against).
std::string nccl_version();

// Collective over MPI_COMM_WORLD (MPI must be initialised): the ranks that pass the same color
// form one group, ordered by key. The caller selects the rank's GPU (cudaSetDevice) first: the
// communicator, its events and `stream` belong to the current device.
std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger,
                             cudaStream_t stream);

class NcclGroup final : public Group {
 public:
  // Takes ownership of `comm` (destroyed with the group, also when the constructor throws).
  NcclGroup(std::string name, ncclComm_t comm, cudaStream_t stream, CommLedger* ledger);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // GPU time of the last call's NCCL kernel(s), from a CUDA event pair recorded around it.
  double last_gpu_seconds() const { return last_gpu_seconds_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 protected:
  // Buffers are device pointers. In-place forms, as NCCL defines them: all_gather with
  // in.data == out.data + rank * in.bytes(), reduce_scatter with
  // out.data == in.data + rank * out.bytes(); broadcast and reduce are always in place.
  void do_all_reduce(BufferView buf, Reduction r) override;
  void do_reduce_scatter(BufferView in, BufferView out) override;
  void do_all_gather(BufferView in, BufferView out) override;
  void do_broadcast(BufferView buf, int root) override;
  void do_reduce(BufferView buf, int root) override;
  // A blocking send or recv completes only once the peer posts the matching call; a rank cannot
  // send to itself (that needs the send and the recv in one ncclGroupStart/End).
  // NCCL has no tags: messages between two ranks match in issue order, which the plugins keep.
  void do_send(BufferView buf, int peer, int tag) override;
  void do_recv(BufferView buf, int peer, int tag) override;
  void do_barrier() override;  // a 1-element all-reduce

 private:
  template <class F>
  void timed(F&& enqueue);
  void check_peer(int peer, const char* op) const;
  void release() noexcept;

  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_ = -1;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  void* barrier_word_ = nullptr;  // one device float, for barrier()
  double last_gpu_seconds_ = 0.0;
};

// Throw strata::Error "rank R: <call> failed at file:line: <NCCL's error string> (<last error>)"
// with a hint. R is the MPI world rank (-1 before MPI_Init).
[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* call, const char* file,
                                   int line);

}  // namespace strata::nccl

// Check an NCCL call; throws strata::Error on failure.
#define STRATA_NCCL_CHECK(call)                                                      \
  do {                                                                               \
    const ncclResult_t strata_nccl_res_ = (call);                                    \
    if (strata_nccl_res_ != ncclSuccess)                                             \
      ::strata::nccl::throw_nccl_error(strata_nccl_res_, #call, __FILE__, __LINE__); \
  } while (0)
