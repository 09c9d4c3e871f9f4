// The NCCL transport: Group over an NCCL communicator, on device buffers and one CUDA stream.
// Built into strata_cuda when NCCL >= 2.13 is found (STRATA_HAVE_NCCL=1 on the target), and, for
// the tests, against the NCCL stand-in and the CUDA emulator (tests/nccl_standin). Plain C++:
// includable from host-only translation units.
//
// Every call is blocking for the calling thread, as on every transport (see strata/comm.hpp): it
// enqueues the NCCL call on the group's stream and waits for that stream, so time measured on the
// host around a call equals the stream time of the call (plus whatever was queued on the stream
// before it: give the group a stream of its own). A CUDA event pair around the NCCL call gives the
// same call's GPU-measured time, last_gpu_seconds(). Calls are serialised per group: NCCL does not
// allow one communicator to be used from two threads at once.
//
// The wait polls, as NCCL documents for error handling: while the stream is busy it checks
// ncclCommGetAsyncError and comm_stop_requested() (comm/transport.hpp: the watchdog ending the
// job); on either it calls ncclCommAbort and throws, so a failed or dead peer ends the job instead
// of leaving it blocked. An aborted group refuses every later call.
//
// Tags: NCCL has none; its send/recv match in issue order per peer. Each send carries a 24-byte
// header (tag, bytes, dtype) in the same ncclGroupStart/End, and the receiver reads it before the
// payload: a message of another tag is received into a stash and handed to the recv of that tag
// later, so messages of one tag keep their order and different tags may be received in any order,
// as with MPI. A recv whose size differs from its message's is refused with both named (and the
// group aborted).
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "strata/comm.hpp"

namespace strata::nccl {

// "2.x.y", from ncclGetVersion (the library loaded at run time, not the header built against).
std::string nccl_version();

// Adds "nccl" to the transport registry (comm/transport.hpp), with split() below on a stream of
// each group's own, and "NCCL <version>" as its version. The runner calls it when built with NCCL.
void register_transport();

// Collective over MPI_COMM_WORLD (MPI must be initialised): the ranks that pass the same color
// form one group, ordered by key. Every rank calls it in the same order. The caller selects the
// rank's GPU (cudaSetDevice) first: the communicator, its events and `stream` belong to the
// current device. With NCCL >= 2.18 the group is ncclCommSplit of a world communicator made at the
// first call (and kept to the end of the process); before, a communicator of its own from a
// unique id broadcast over MPI. A null `stream`: the group creates (and owns) a non-blocking one.
std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger,
                             cudaStream_t stream = nullptr);

class NcclGroup final : public Group {
 public:
  // Takes ownership of `comm` (destroyed with the group, also when the constructor throws), and of
  // `stream` when owns_stream.
  NcclGroup(std::string name, ncclComm_t comm, cudaStream_t stream, CommLedger* ledger,
            bool owns_stream = false);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // Every later call first makes the group's stream wait (cudaStreamWaitEvent) for the most
  // recent record of `event` made before the call: the compute stream records it after the
  // kernels that produce the buffers, and the collective starts once they are done, without
  // blocking the host (Context::compute_event() on CUDA). nullptr: no wait. Not owned.
  // With `compute_stream`, a call made on the compute thread itself (not on a comm stream's
  // worker) first records `event` there: a collective a plugin issues between two kernels sees
  // everything computed before it, as on the CPU, without a compute_event() call.
  void set_compute_event(cudaEvent_t event, cudaStream_t compute_stream = nullptr);

  // Point-to-point calls go to two groups of the same ranks, one per direction: sends to a higher
  // rank and receives from a lower one on `up`, the others on `down`, each with a communicator and
  // a stream of its own. NCCL's send and recv block until matched, and a communicator runs one
  // call at a time: on one communicator a pipeline stage's send to the next stage (on a comm
  // stream) would wait behind its receive from that stage (on the compute thread), while the next
  // stage does the same, for ever. split() sets them; a group without them sends on its own.
  void set_p2p_channels(std::unique_ptr<NcclGroup> up, std::unique_ptr<NcclGroup> down);

  // GPU time of the last call's NCCL kernel(s), from a CUDA event pair recorded around it.
  double last_gpu_seconds() const { return last_gpu_seconds_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // This group's communicator or one of its point-to-point channels was aborted: the group
  // refuses every later call.
  bool aborted() const {
    return aborted_ || (up_ && up_->aborted()) || (down_ && down_->aborted());
  }

 protected:
  // Buffers are device pointers, except that all_reduce also takes a host buffer of up to 16
  // bytes (a scalar: a gradient norm), staged through device memory. In-place forms, as NCCL
  // defines them: all_gather with in.data == out.data + rank * in.bytes(), reduce_scatter with
  // out.data == in.data + rank * out.bytes(); broadcast and reduce are always in place.
  void do_all_reduce(BufferView buf, Reduction r) override;
  void do_reduce_scatter(BufferView in, BufferView out) override;
  void do_all_gather(BufferView in, BufferView out) override;
  void do_broadcast(BufferView buf, int root) override;
  void do_reduce(BufferView buf, int root) override;
  // A blocking send or recv completes only once the peer posts the matching call; a rank cannot
  // send to itself (that needs the send and the recv in one ncclGroupStart/End).
  void do_send(BufferView buf, int peer, int tag) override;
  void do_recv(BufferView buf, int peer, int tag) override;
  void do_barrier() override;  // a 1-element all-reduce
  void do_all_to_all(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                     const std::vector<std::size_t>& recv_counts) override;
  bool moves_device_memory() const override { return true; }

 private:
  template <class F>
  void timed(const char* what, F&& enqueue);
  void wait_for_stream(const char* what);
  [[noreturn]] void abort_and_throw(ncclResult_t result, const std::string& what,
                                    const std::string& hint);
  void check_usable(const char* op) const;
  void check_peer(int peer, const char* op) const;
  void release() noexcept;
  // Receiving by tag over NCCL's ordered messages (do_recv): messages that came ahead of their
  // recv, per (peer, tag) in arrival order, in device memory of their own.
  struct Stashed {
    void* data;
    std::size_t bytes;
  };
  void check_size(BufferView b, int peer, int tag, std::size_t sent_bytes);
  void stash(int peer, int tag, std::size_t bytes, DType dtype);
  bool take_stashed(BufferView b, int peer, int tag);
  std::map<std::pair<int, int>, std::deque<Stashed>> stash_;

  std::mutex call_mutex_;  // one call at a time (see above)
  ncclComm_t comm_;
  cudaStream_t stream_;
  bool owns_stream_;
  bool aborted_ = false;
  int device_ = -1;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cudaEvent_t compute_event_ = nullptr;
  cudaStream_t compute_stream_ = nullptr;
  static constexpr std::size_t kWordBytes = 16;
  void* word_ = nullptr;  // device scratch: barrier()'s float, all_reduce's host scalars
  static constexpr int kHeaderWords = 3;  // tag, bytes, dtype
  static constexpr std::size_t kHeaderBytes = kHeaderWords * sizeof(std::int64_t);
  std::int64_t* send_header_ = nullptr;  // device: the header of the message being sent
  std::int64_t* recv_header_ = nullptr;  // device: the header received
  std::int64_t* host_header_ = nullptr;  // pinned host staging for both
  double last_gpu_seconds_ = 0.0;
  std::unique_ptr<NcclGroup> up_, down_;  // the point-to-point channels (set_p2p_channels)
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
