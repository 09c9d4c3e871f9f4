// NCCL backend of the Comm interface (see nccl_transport.hpp).
#include "backends/cuda/nccl_transport.hpp"

#include <mpi.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "backends/cuda/backend.hpp"
#include "backends/cuda/device.hpp"
#include "comm/thread_role.hpp"
#include "comm/transport.hpp"
#include "strata/types.hpp"

namespace strata::nccl {
namespace {

int world_rank_or_minus_one() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = -1;
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string nccl_hint(ncclResult_t result) {
  switch (result) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: check the GPU selection (CUDA_VISIBLE_DEVICES, one "
             "GPU per rank) and `nvidia-smi`; set NCCL_DEBUG=INFO for details";
    case ncclSystemError:
      return "a system call inside NCCL failed (network, shared memory): check NCCL_SOCKET_IFNAME, "
             "the size of /dev/shm and the network between the nodes; set NCCL_DEBUG=INFO for "
             "details";
    case ncclRemoteError:
      return "a peer rank failed or went away: look at the other ranks' errors; set "
             "NCCL_DEBUG=INFO for details";
    default:
      return "set NCCL_DEBUG=INFO for details; check that every rank runs the same collectives in "
             "the same order with the same counts";
  }
}

void check_mpi(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw Error("rank " + std::to_string(world_rank_or_minus_one()) + ": " + call + " failed at " +
                  file + ":" + std::to_string(line) + ": " + std::string(text, len),
              "check that every rank runs the same configuration and the launcher's MPI matches "
              "the one strata was built with");
}

#define STRATA_NCCL_MPI_CHECK(call) check_mpi((call), #call, __FILE__, __LINE__)

ncclDataType_t to_nccl(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
    case DType::bf16:
      return ncclBfloat16;
  }
  throw Error("NCCL transport: unknown dtype " + std::to_string(static_cast<int>(t)),
              "this is a bug in strata");
}

// Makes the communicator's device current on this thread for the scope (comm-stream workers
// start on device 0).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    STRATA_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) STRATA_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_)
      (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

void throw_nccl_error(ncclResult_t result, const char* call, const char* file, int line) {
  // ncclGetLastError ignores its argument in current NCCL releases: the last error of the process.
  const char* last = ncclGetLastError(nullptr);
  std::string what = "rank " + std::to_string(world_rank_or_minus_one()) + ": " + call +
                     " failed at " + file + ":" + std::to_string(line) + ": " +
                     ncclGetErrorString(result);
  if (last != nullptr && *last != '\0') what += std::string(" (") + last + ")";
  throw Error(what, nccl_hint(result));
}

std::string nccl_version() {
  int code = 0;
  STRATA_NCCL_CHECK(ncclGetVersion(&code));
  // NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z since 2.9, X*1000 + Y*100 + Z before.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  const int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

namespace {

// A communicator of its own for the ranks of `color`: a unique id made by the group's first rank
// and broadcast over an MPI split of the world.
ncclComm_t init_from_unique_id(int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  STRATA_NCCL_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &sub));
  int rank = 0, size = 1;
  ncclUniqueId id{};
  ncclResult_t result = ncclSuccess;
  int mpi_code = MPI_SUCCESS;
  // Every rank of `sub` must reach MPI_Comm_free, so errors are thrown only after it.
  if ((mpi_code = MPI_Comm_rank(sub, &rank)) == MPI_SUCCESS &&
      (mpi_code = MPI_Comm_size(sub, &size)) == MPI_SUCCESS) {
    if (rank == 0) result = ncclGetUniqueId(&id);
    // Rank 0 broadcasts even when ncclGetUniqueId failed, so that it can throw (and the job end
    // through the error channel) instead of leaving the others in MPI_Bcast.
    mpi_code = MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, sub);
  }
  MPI_Comm_free(&sub);
  STRATA_NCCL_MPI_CHECK(mpi_code);
  if (result != ncclSuccess) throw_nccl_error(result, "ncclGetUniqueId(&id)", __FILE__, __LINE__);
  ncclComm_t comm = nullptr;
  STRATA_NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  return comm;
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
// The parent of every group: all world ranks, made at the first split and kept to the end of the
// process (destroying it would be collective, and the groups split from it may outlive any one
// owner). Only the split's caller thread uses it.
ncclComm_t world_parent() {
  static std::mutex mutex;
  static ncclComm_t parent = nullptr;
  std::lock_guard lock(mutex);
  if (parent == nullptr) {
    int rank = 0;
    STRATA_NCCL_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    parent = init_from_unique_id(0, rank);
  }
  return parent;
}
#endif

}  // namespace

namespace {

std::unique_ptr<NcclGroup> split_one(const std::string& name, int color, int key,
                                     CommLedger* ledger, cudaStream_t stream) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    throw Error("NCCL transport: split(\"" + name + "\") before MPI_Init",
                "the NCCL bootstrap runs over MPI: initialise MPI first");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  ncclComm_t comm = nullptr;
  STRATA_NCCL_CHECK(ncclCommSplit(world_parent(), color, key, &comm, nullptr));
#else
  ncclComm_t comm = init_from_unique_id(color, key);
#endif
  const bool owns_stream = stream == nullptr;
  if (owns_stream) {
    const cudaError_t created = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (created != cudaSuccess) {
      ncclCommDestroy(comm);
      STRATA_CUDA_CHECK(created);
    }
  }
  return std::make_unique<NcclGroup>(name, comm, stream, ledger, owns_stream);
}

}  // namespace

std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger,
                             cudaStream_t stream) {
  std::unique_ptr<NcclGroup> group = split_one(name, color, key, ledger, stream);
  // The point-to-point channels: the same ranks, communicators and streams of their own. Every
  // group gets them (the world-collective splits must be the same on every rank).
  std::unique_ptr<NcclGroup> up = split_one(name + "/up", color, key, nullptr, nullptr);
  std::unique_ptr<NcclGroup> down = split_one(name + "/down", color, key, nullptr, nullptr);
  group->set_p2p_channels(std::move(up), std::move(down));
  return group;
}

void register_transport() {
  strata::register_transport(TransportEntry{
      "nccl",
      [](const std::string& name, int color, int key, CommLedger* ledger) {
        std::unique_ptr<Group> g = split(name, color, key, ledger);
        // A run on the CUDA backend: collectives follow its compute stream.
        if (cuda::CudaBackend* b = cuda::opened_cuda_backend())
          static_cast<NcclGroup&>(*g).set_compute_event(b->compute_event(), b->stream());
        return g;
      },
      [] { return "NCCL " + nccl_version(); }});
}

// ---- NcclGroup ----------------------------------------------------------------------------------

namespace {

int comm_rank(ncclComm_t comm) {
  int r = 0;
  const ncclResult_t res = ncclCommUserRank(comm, &r);
  if (res != ncclSuccess) {
    ncclCommDestroy(comm);  // the group owns it from here on, and never exists
    throw_nccl_error(res, "ncclCommUserRank(comm, &r)", __FILE__, __LINE__);
  }
  return r;
}

int comm_size(ncclComm_t comm) {
  int n = 0;
  const ncclResult_t res = ncclCommCount(comm, &n);
  if (res != ncclSuccess) {
    ncclCommDestroy(comm);
    throw_nccl_error(res, "ncclCommCount(comm, &n)", __FILE__, __LINE__);
  }
  return n;
}

}  // namespace

NcclGroup::NcclGroup(std::string name, ncclComm_t comm, cudaStream_t stream, CommLedger* ledger,
                     bool owns_stream)
    : Group(std::move(name), comm_rank(comm), comm_size(comm), ledger),
      comm_(comm),
      stream_(stream),
      owns_stream_(owns_stream) {
  try {
    STRATA_NCCL_CHECK(ncclCommCuDevice(comm_, &device_));
    DeviceScope scope(device_);
    STRATA_CUDA_CHECK(cudaEventCreate(&start_));
    STRATA_CUDA_CHECK(cudaEventCreate(&stop_));
    STRATA_CUDA_CHECK(cudaMalloc(&word_, kWordBytes));
    STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&send_header_), kHeaderBytes));
    STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&recv_header_), kHeaderBytes));
    STRATA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_header_), kHeaderBytes));
    STRATA_CUDA_CHECK(cudaMemsetAsync(word_, 0, kWordBytes, stream_));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    release();
    throw;
  }
}

NcclGroup::~NcclGroup() { release(); }

void NcclGroup::release() noexcept {
  int previous = -1;
  const bool switch_device = device_ >= 0 && cudaGetDevice(&previous) == cudaSuccess &&
                             previous != device_ && cudaSetDevice(device_) == cudaSuccess;
  if (comm_ != nullptr) {
    // After an asynchronous error (a failed peer) ncclCommDestroy can hang: abort instead.
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async != ncclSuccess)
      (void)ncclCommAbort(comm_);
    else
      (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  // cudaFree waits for the device; after an abort the stream holds nothing that waits any more.
  if (word_ != nullptr) (void)cudaFree(word_);
  if (send_header_ != nullptr) (void)cudaFree(send_header_);
  if (recv_header_ != nullptr) (void)cudaFree(recv_header_);
  if (host_header_ != nullptr) (void)cudaFreeHost(host_header_);
  for (auto& [key, queue] : stash_)
    for (const Stashed& s : queue) (void)cudaFree(s.data);
  stash_.clear();
  if (start_ != nullptr) (void)cudaEventDestroy(start_);
  if (stop_ != nullptr) (void)cudaEventDestroy(stop_);
  if (owns_stream_ && stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  word_ = nullptr;
  send_header_ = recv_header_ = host_header_ = nullptr;
  start_ = stop_ = nullptr;
  stream_ = nullptr;
  if (switch_device) (void)cudaSetDevice(previous);
}

void NcclGroup::set_compute_event(cudaEvent_t event, cudaStream_t compute_stream) {
  std::lock_guard lock(call_mutex_);
  compute_event_ = event;
  compute_stream_ = compute_stream;
  for (NcclGroup* c : {up_.get(), down_.get()})
    if (c) c->set_compute_event(event, compute_stream);
}

void NcclGroup::set_p2p_channels(std::unique_ptr<NcclGroup> up, std::unique_ptr<NcclGroup> down) {
  if (up->size() != size() || down->size() != size() || up->rank() != rank() ||
      down->rank() != rank())
    throw Error("NCCL group " + name() + ": its point-to-point channels have other ranks",
                "this is a bug in the NCCL transport");
  std::lock_guard lock(call_mutex_);
  up_ = std::move(up);
  down_ = std::move(down);
}

// NCCL's error handling: abort the communicator (the only call that cannot hang on a dead peer),
// then throw. The group refuses every later call.
void NcclGroup::abort_and_throw(ncclResult_t result, const std::string& what,
                                const std::string& hint) {
  (void)ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_ = true;
  const char* last = ncclGetLastError(nullptr);
  std::string message = "rank " + std::to_string(world_rank_or_minus_one()) + ": " + what +
                        " on NCCL group " + name();
  if (result != ncclSuccess) {
    message += std::string(": ") + ncclGetErrorString(result);
    if (last != nullptr && *last != '\0') message += std::string(" (") + last + ")";
  }
  throw Error(message + "; the communicator was aborted", hint.empty() ? nccl_hint(result) : hint);
}

// Waits for the group's stream, polling the communicator's asynchronous error and the stop flag.
void NcclGroup::wait_for_stream(const char* what) {
  for (int polls = 0;; ++polls) {
    const cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) STRATA_CUDA_CHECK(state);
    ncclResult_t async = ncclSuccess;
    STRATA_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess) abort_and_throw(async, what, "");
    if (comm_stop_requested())
      abort_and_throw(ncclSuccess, std::string(what) + " stopped",
                      "the job is ending (the watchdog or a signal): see the run's first error");
    // Spin briefly (a call of a few microseconds), then back off to leave the cores to others.
    if (polls < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ncclResult_t async = ncclSuccess;  // an operation that failed also leaves the stream idle
  STRATA_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess) abort_and_throw(async, what, "");
}

// Enqueue one NCCL call between the event pair (after the compute event), wait for the stream,
// keep the GPU time and give it to the ledger as the call's interval. The caller holds call_mutex_.
template <class F>
void NcclGroup::timed(const char* what, F&& enqueue) {
  DeviceScope scope(device_);
  if (compute_event_ != nullptr) {
    if (compute_stream_ != nullptr && !t_on_comm_worker)
      STRATA_CUDA_CHECK(cudaEventRecord(compute_event_, compute_stream_));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_event_, 0));
  }
  STRATA_CUDA_CHECK(cudaEventRecord(start_, stream_));
  enqueue();
  STRATA_CUDA_CHECK(cudaEventRecord(stop_, stream_));
  wait_for_stream(what);
  const double t_done = now();
  float ms = 0.0f;
  STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
  last_gpu_seconds_ = double(ms) * 1e-3;
  // The ledger's busy interval: the events' time, ending when the host saw the stream finish
  // (within a poll). The host's own interval would also count the wait for the compute event.
  t_device_interval.emplace(t_done - last_gpu_seconds_, t_done);
}

void NcclGroup::check_usable(const char* op) const {
  if (aborted())
    throw Error("NCCL " + std::string(op) + " on group " + name() +
                    ": the group's communicator was aborted after an earlier error",
                "the first error of this rank says why");
}

void NcclGroup::check_peer(int peer, const char* op) const {
  check_usable(op);  // a peer outside the group: Group::send/recv refused it
  if (peer == rank())
    throw Error("NCCL " + std::string(op) + " on group " + name() + ": rank " +
                    std::to_string(peer) + " to itself would never complete",
                "a blocking send/recv needs another rank; copy the buffer instead");
}

void NcclGroup::do_all_reduce(BufferView b, Reduction r) {
  std::lock_guard lock(call_mutex_);
  check_usable("all_reduce");
  // A host scalar (a gradient norm's sum of squares) goes through the group's device word.
  cudaPointerAttributes where{};
  STRATA_CUDA_CHECK(cudaPointerGetAttributes(&where, b.data));
  const bool staged = where.type == cudaMemoryTypeUnregistered;
  if (staged && b.bytes() > kWordBytes)
    throw Error("NCCL all_reduce on group " + name() + ": " + std::to_string(b.bytes()) +
                    " bytes of host memory (at most " + std::to_string(kWordBytes) +
                    ", a few scalars, are staged through the device)",
                "allocate the buffer through the run's ledger: it is then device memory");
  void* data = staged ? word_ : b.data;
  timed("all_reduce", [&] {
    if (staged)
      STRATA_CUDA_CHECK(cudaMemcpyAsync(word_, b.data, b.bytes(), cudaMemcpyHostToDevice, stream_));
    STRATA_NCCL_CHECK(ncclAllReduce(data, data, b.count, to_nccl(b.dtype),
                                    r == Reduction::sum ? ncclSum : ncclMax, comm_, stream_));
    if (staged)
      STRATA_CUDA_CHECK(cudaMemcpyAsync(b.data, word_, b.bytes(), cudaMemcpyDeviceToHost, stream_));
  });
}

void NcclGroup::do_reduce_scatter(BufferView in, BufferView out) {
  // NCCL's count is the per-rank output count; in place when out sits at this rank's slot of in.
  std::lock_guard lock(call_mutex_);
  check_usable("reduce_scatter");
  timed("reduce_scatter", [&] {
    STRATA_NCCL_CHECK(ncclReduceScatter(in.data, out.data, out.count, to_nccl(in.dtype), ncclSum,
                                        comm_, stream_));
  });
}

void NcclGroup::do_all_gather(BufferView in, BufferView out) {
  // NCCL's count is the per-rank input count; in place when in sits at this rank's slot of out.
  std::lock_guard lock(call_mutex_);
  check_usable("all_gather");
  timed("all_gather", [&] {
    STRATA_NCCL_CHECK(
        ncclAllGather(in.data, out.data, in.count, to_nccl(in.dtype), comm_, stream_));
  });
}

void NcclGroup::do_broadcast(BufferView b, int root) {
  std::lock_guard lock(call_mutex_);
  check_usable("broadcast");
  timed("broadcast", [&] {
    STRATA_NCCL_CHECK(
        ncclBroadcast(b.data, b.data, b.count, to_nccl(b.dtype), root, comm_, stream_));
  });
}

void NcclGroup::do_reduce(BufferView b, int root) {
  // recvbuff matters only on the root; elsewhere b is left as it was.
  std::lock_guard lock(call_mutex_);
  check_usable("reduce");
  timed("reduce", [&] {
    STRATA_NCCL_CHECK(
        ncclReduce(b.data, b.data, b.count, to_nccl(b.dtype), ncclSum, root, comm_, stream_));
  });
}

// A send to and a receive from every rank (itself included) in one group, as nccl-tests'
// alltoall: NCCL runs them together. Empty blocks are left out on both sides alike (the counts
// match). After a failed post the rest are not posted, and the group is still ended.
void NcclGroup::do_all_to_all(BufferView in, const std::vector<std::size_t>& send_counts,
                              BufferView out, const std::vector<std::size_t>& recv_counts) {
  std::lock_guard lock(call_mutex_);
  check_usable("all_to_all");
  DeviceScope scope(device_);
  const std::size_t esize = dtype_size(in.dtype);
  const ncclDataType_t type = to_nccl(in.dtype);
  timed("all_to_all", [&] {
    ncclResult_t posted = ncclSuccess;
    std::size_t send_at = 0, recv_at = 0;
    STRATA_NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < size() && posted == ncclSuccess; ++peer) {
      const std::size_t s = send_counts[std::size_t(peer)], r = recv_counts[std::size_t(peer)];
      if (s > 0)
        posted = ncclSend(static_cast<const char*>(in.data) + send_at * esize, s, type, peer, comm_,
                          stream_);
      if (r > 0 && posted == ncclSuccess)
        posted =
            ncclRecv(static_cast<char*>(out.data) + recv_at * esize, r, type, peer, comm_, stream_);
      send_at += s, recv_at += r;
    }
    STRATA_NCCL_CHECK(ncclGroupEnd());
    STRATA_NCCL_CHECK(posted);
  });
}

// The header and the payload in one group: the receiver reads the header first.
void NcclGroup::do_send(BufferView b, int peer, int tag) {
  if (up_) return (peer > rank() ? *up_ : *down_).do_send(b, peer, tag);
  std::lock_guard lock(call_mutex_);
  check_peer(peer, "send");
  DeviceScope scope(device_);
  host_header_[0] = tag;
  host_header_[1] = std::int64_t(b.bytes());
  host_header_[2] = static_cast<std::int64_t>(b.dtype);
  STRATA_CUDA_CHECK(
      cudaMemcpyAsync(send_header_, host_header_, kHeaderBytes, cudaMemcpyHostToDevice, stream_));
  timed("send", [&] {
    STRATA_NCCL_CHECK(ncclGroupStart());
    const ncclResult_t header =
        ncclSend(send_header_, kHeaderWords, ncclInt64, peer, comm_, stream_);
    const ncclResult_t payload =
        header == ncclSuccess ? ncclSend(b.data, b.count, to_nccl(b.dtype), peer, comm_, stream_)
                              : header;
    STRATA_NCCL_CHECK(ncclGroupEnd());
    STRATA_NCCL_CHECK(payload);
  });
}

// NCCL delivers a peer's messages in the order they were sent; strata's tags match like MPI's. A
// message of another tag that comes ahead of the one wanted (a pipeline stage's activation and
// gradient sends run on two comm streams) is received into a stash of its own, in arrival order,
// and handed to the recv of its tag. A size that differs from the sender's is refused.
void NcclGroup::do_recv(BufferView b, int peer, int tag) {
  if (up_) return (peer < rank() ? *up_ : *down_).do_recv(b, peer, tag);
  std::lock_guard lock(call_mutex_);
  check_peer(peer, "recv");
  DeviceScope scope(device_);
  if (take_stashed(b, peer, tag)) return;
  for (;;) {
    timed("recv", [&] {
      STRATA_NCCL_CHECK(ncclRecv(recv_header_, kHeaderWords, ncclInt64, peer, comm_, stream_));
      STRATA_CUDA_CHECK(cudaMemcpyAsync(host_header_, recv_header_, kHeaderBytes,
                                        cudaMemcpyDeviceToHost, stream_));
    });
    const int sent_tag = int(host_header_[0]);
    const auto bytes = std::size_t(host_header_[1]);
    const auto dtype = static_cast<DType>(host_header_[2]);
    if (sent_tag != tag) {
      stash(peer, sent_tag, bytes, dtype);
      continue;
    }
    check_size(b, peer, tag, bytes);
    timed("recv", [&] {
      STRATA_NCCL_CHECK(ncclRecv(b.data, b.count, to_nccl(b.dtype), peer, comm_, stream_));
    });
    return;
  }
}

void NcclGroup::check_size(BufferView b, int peer, int tag, std::size_t sent_bytes) {
  if (sent_bytes == b.bytes()) return;
  abort_and_throw(ncclSuccess,
                  "recv (tag " + std::to_string(tag) + ", " + std::to_string(b.bytes()) +
                      " bytes) from rank " + std::to_string(peer) + ": its message of tag " +
                      std::to_string(tag) + " is " + std::to_string(sent_bytes) + " bytes",
                  "receive each message with the size it was sent with");
}

void NcclGroup::stash(int peer, int tag, std::size_t bytes, DType dtype) {
  Stashed s{nullptr, bytes};
  STRATA_CUDA_CHECK(cudaMalloc(&s.data, bytes > 0 ? bytes : 1));
  stash_[{peer, tag}].push_back(s);  // owned from here (release() frees what is left)
  timed("recv", [&] {
    STRATA_NCCL_CHECK(
        ncclRecv(s.data, bytes / dtype_size(dtype), to_nccl(dtype), peer, comm_, stream_));
  });
}

bool NcclGroup::take_stashed(BufferView b, int peer, int tag) {
  const auto it = stash_.find({peer, tag});
  if (it == stash_.end() || it->second.empty()) return false;
  const Stashed s = it->second.front();
  check_size(b, peer, tag, s.bytes);
  it->second.pop_front();
  timed("recv", [&] {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(b.data, s.data, s.bytes, cudaMemcpyDeviceToDevice, stream_));
  });
  STRATA_CUDA_CHECK(cudaFree(s.data));
  return true;
}

void NcclGroup::do_barrier() {
  std::lock_guard lock(call_mutex_);
  check_usable("barrier");
  timed("barrier", [&] {
    STRATA_NCCL_CHECK(ncclAllReduce(word_, word_, 1, ncclFloat32, ncclSum, comm_, stream_));
  });
}

}  // namespace strata::nccl
