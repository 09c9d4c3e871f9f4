// The NCCL stand-in's operations: arguments checked as NCCL checks them, then the operation queued
// on its stream (cudaLaunchHostFunc). There it runs as nonblocking MPI calls on the communicator's
// data comm, polled until they complete, the communicator is aborted here, or another rank's
// abort notice comes in: a dead peer never leaves a stream blocked for good.
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "internal.hpp"
#include "strata/types.hpp"

namespace strata_nccl {
namespace {

enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast, reduce, send, recv };
constexpr const char* kKindNames[] = {"AllReduce", "ReduceScatter", "AllGather", "Broadcast",
                                      "Reduce",    "Send",          "Recv"};

struct Op {
  Kind kind = Kind::all_reduce;
  std::shared_ptr<CommState> comm;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  // NCCL's: per rank for all_gather (input) and reduce_scatter (output)
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t red = ncclSum;
  int root = 0;  // or the peer of send/recv
  ncclResult_t fail = ncclSuccess;
  std::vector<unsigned char> staged;  // an in-place reduce_scatter's input
};
struct Batch {
  std::vector<Op> ops;  // posted together: one call, or one ncclGroupStart/End
};

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

MPI_Datatype mpi_type(ncclDataType_t t) {
  const MPI_Datatype kTypes[] = {MPI_INT8_T,  MPI_UINT8_T,  MPI_INT32_T,  MPI_UINT32_T,
                                 MPI_INT64_T, MPI_UINT64_T, MPI_UINT16_T, MPI_FLOAT,
                                 MPI_DOUBLE,  MPI_UINT16_T};  // bf16: 16-bit words, reduced by user
                                                              // ops
  return kTypes[t];
}

// bf16 as NCCL reduces it: through float, rounded to nearest even after each operation. 8-bit
// sums and products wrap as in C (Open MPI's vectorised MPI_SUM saturates them).
template <class T, class F>
void apply(void* in, void* inout, int* len, F f) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f(a[i], b[i]);
}
using strata::bf16;
using strata::to_bf16;
using strata::to_float;
extern "C" void bf16_sum(void* a, void* b, int* n, MPI_Datatype*) {
  apply<bf16>(a, b, n, [](bf16 x, bf16 y) { return to_bf16(to_float(x) + to_float(y)); });
}
extern "C" void bf16_prod(void* a, void* b, int* n, MPI_Datatype*) {
  apply<bf16>(a, b, n, [](bf16 x, bf16 y) { return to_bf16(to_float(x) * to_float(y)); });
}
extern "C" void bf16_max(void* a, void* b, int* n, MPI_Datatype*) {
  apply<bf16>(a, b, n, [](bf16 x, bf16 y) { return to_float(x) < to_float(y) ? y : x; });
}
extern "C" void bf16_min(void* a, void* b, int* n, MPI_Datatype*) {
  apply<bf16>(a, b, n, [](bf16 x, bf16 y) { return to_float(y) < to_float(x) ? y : x; });
}
extern "C" void u8_sum(void* a, void* b, int* n, MPI_Datatype*) {
  apply<std::uint8_t>(a, b, n, [](std::uint8_t x, std::uint8_t y) { return std::uint8_t(x + y); });
}
extern "C" void u8_prod(void* a, void* b, int* n, MPI_Datatype*) {
  apply<std::uint8_t>(a, b, n, [](std::uint8_t x, std::uint8_t y) { return std::uint8_t(x * y); });
}

MPI_Op mpi_op(ncclRedOp_t red, ncclDataType_t t) {
  static std::once_flag once;
  static MPI_Op bf16_ops[4], byte_ops[2];  // indexed by ncclRedOp_t (sum, prod, max, min)
  std::call_once(once, [] {
    MPI_Op_create(bf16_sum, 1, &bf16_ops[ncclSum]);
    MPI_Op_create(bf16_prod, 1, &bf16_ops[ncclProd]);
    MPI_Op_create(bf16_max, 1, &bf16_ops[ncclMax]);
    MPI_Op_create(bf16_min, 1, &bf16_ops[ncclMin]);
    MPI_Op_create(u8_sum, 1, &byte_ops[ncclSum]);
    MPI_Op_create(u8_prod, 1, &byte_ops[ncclProd]);
  });
  if (t == ncclBfloat16) return bf16_ops[red];
  if ((t == ncclInt8 || t == ncclUint8) && (red == ncclSum || red == ncclProd))
    return byte_ops[red];
  const MPI_Op kBuiltin[] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};
  return kBuiltin[red];
}

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// Posts one operation; MPI_REQUEST_NULL when there is nothing to move.
int post(Op& op, MPI_Request* request) {
  *request = MPI_REQUEST_NULL;
  if (op.count == 0) return MPI_SUCCESS;
  const CommState& c = *op.comm;
  const int n = int(op.count);
  const std::size_t bytes = op.count * type_size(op.type);
  const MPI_Datatype dt = mpi_type(op.type);
  switch (op.kind) {
    case Kind::all_reduce:
      return MPI_Iallreduce(op.send == op.recv ? MPI_IN_PLACE : op.send, op.recv, n, dt,
                            mpi_op(op.red, op.type), c.data, request);
    case Kind::reduce_scatter: {
      const void* in = op.send;
      if (overlap(op.send, bytes * std::size_t(c.size), op.recv, bytes)) {  // MPI forbids aliasing
        const auto* from = static_cast<const unsigned char*>(op.send);
        op.staged.assign(from, from + bytes * std::size_t(c.size));
        in = op.staged.data();
      }
      return MPI_Ireduce_scatter_block(in, op.recv, n, dt, mpi_op(op.red, op.type), c.data,
                                       request);
    }
    case Kind::all_gather: {
      const bool in_place = op.send == static_cast<unsigned char*>(op.recv) + c.rank * bytes;
      return MPI_Iallgather(in_place ? MPI_IN_PLACE : op.send, n, dt, op.recv, n, dt, c.data,
                            request);
    }
    case Kind::broadcast:
      if (c.rank == op.root && op.send != op.recv) std::memcpy(op.recv, op.send, bytes);
      return MPI_Ibcast(op.recv, n, dt, op.root, c.data, request);
    case Kind::reduce: {
      const bool root = c.rank == op.root;
      return MPI_Ireduce(root && op.send == op.recv ? MPI_IN_PLACE : op.send,
                         root ? op.recv : nullptr, n, dt, mpi_op(op.red, op.type), op.root, c.data,
                         request);
    }
    case Kind::send:
      return MPI_Isend(op.send, n, dt, op.root, kPointToPointTag, c.data, request);
    case Kind::recv:
      return MPI_Irecv(op.recv, n, dt, op.root, kPointToPointTag, c.data, request);
  }
  return MPI_ERR_OTHER;
}

void fail_batch(Batch& batch, ncclResult_t error, const std::string& what) {
  for (Op& op : batch.ops) set_async_error(*op.comm, error, what.c_str());
}

// Polls the batch's requests until done; false when it ended otherwise (an abort, an error).
bool wait(Batch& batch, std::vector<MPI_Request>& requests) {
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int code = MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (code != MPI_SUCCESS) {
      char text[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(code, text, &len);
      fail_batch(batch, ncclSystemError, "MPI_Testall failed: " + std::string(text, len));
      return false;
    }
    if (done) return true;
    for (Op& op : batch.ops)
      if (op.comm->aborted || peer_aborted(*op.comm)) return false;
    // Yield first (latency), then sleep: the ranks may share few cores with their streams.
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 4096 ? 5 : 100));
  }
}

// A stream's host function: one batch, start to end.
extern "C" void run_batch(void* p) {
  std::unique_ptr<Batch> batch(static_cast<Batch*>(p));
  for (Op& op : batch->ops)  // a failed or aborted communicator runs nothing more
    if (op.comm->aborted || op.comm->async_error != ncclSuccess) return;
  for (Op& op : batch->ops)
    if (op.fail != ncclSuccess) {
      set_async_error(
          *op.comm, op.fail,
          (std::string("injected failure (ncclStandinFailNext) in ") + kKindNames[int(op.kind)])
              .c_str());
      return;
    }
  std::vector<MPI_Request> requests(batch->ops.size());
  for (std::size_t i = 0; i < batch->ops.size(); ++i)
    if (const int code = post(batch->ops[i], &requests[i]); code != MPI_SUCCESS) {
      fail_batch(*batch, ncclSystemError,
                 std::string("posting ") + kKindNames[int(batch->ops[i].kind)] + " failed");
      return;
    }
  if (!wait(*batch, requests)) return;
}

thread_local int t_group_depth = 0;
thread_local std::vector<std::pair<cudaStream_t, std::unique_ptr<Batch>>> t_group;

ncclResult_t launch(cudaStream_t stream, std::unique_ptr<Batch> batch) {
  if (cudaLaunchHostFunc(stream, run_batch, batch.get()) != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(ncclUnhandledCudaError, "cudaLaunchHostFunc failed on stream %p",
                static_cast<void*>(stream));
  }
  (void)batch.release();  // run_batch owns it now
  return ncclSuccess;
}

// A device buffer of `bytes`, or nothing to move.
ncclResult_t check_buffer(const void* p, std::size_t bytes, const char* op, const char* which) {
  if (bytes == 0) return ncclSuccess;
  cudaPointerAttributes first{}, last{};
  if (p == nullptr) return fail(ncclInvalidArgument, "%s : %s is NULL", op, which);
  const void* end = static_cast<const unsigned char*>(p) + bytes - 1;
  if (cudaPointerGetAttributes(&first, p) != cudaSuccess ||
      cudaPointerGetAttributes(&last, end) != cudaSuccess ||
      first.type == cudaMemoryTypeUnregistered || last.type == cudaMemoryTypeUnregistered)
    return fail(ncclInvalidArgument, "%s : %s %p (+%zu bytes) is not device memory", op, which, p,
                bytes);
  return ncclSuccess;
}

ncclResult_t check(const Op& op, const char* name) {
  const CommState& c = *op.comm;
  if (op.type < 0 || op.type >= ncclNumTypes)
    return fail(ncclInvalidArgument, "%s : invalid type %d", name, int(op.type));
  if (op.type == ncclFloat16)
    return fail(ncclInvalidArgument, "%s : the stand-in does not emulate ncclFloat16", name);
  if (op.red < 0 || op.red >= ncclNumOps)
    return fail(ncclInvalidArgument, "%s : invalid reduction operation %d", name, int(op.red));
  if (op.red == ncclAvg)
    return fail(ncclInvalidArgument, "%s : the stand-in does not emulate ncclAvg", name);
  if (op.root < 0 || op.root >= c.size)
    return fail(ncclInvalidArgument, "%s : invalid %s %d (should be in the 0..%d range)", name,
                op.kind == Kind::send || op.kind == Kind::recv ? "peer" : "root", op.root,
                c.size - 1);
  const bool gathers = op.kind == Kind::all_gather || op.kind == Kind::reduce_scatter;
  if (op.count > std::size_t(INT_MAX) / (gathers ? std::size_t(c.size) : 1))
    return fail(ncclInvalidArgument, "%s : count %zu: the stand-in moves < 2^31 elements", name,
                op.count);
  const std::size_t bytes = op.count * type_size(op.type), all = bytes * std::size_t(c.size);
  const bool root = c.rank == op.root;
  const std::size_t in = op.kind == Kind::reduce_scatter       ? all
                         : op.kind == Kind::recv               ? 0
                         : op.kind == Kind::broadcast && !root ? 0
                                                               : bytes;
  const std::size_t out = op.kind == Kind::all_gather        ? all
                          : op.kind == Kind::send            ? 0
                          : op.kind == Kind::reduce && !root ? 0
                                                             : bytes;
  if (const ncclResult_t r = check_buffer(op.send, in, name, "sendbuff"); r != ncclSuccess)
    return r;
  return check_buffer(op.recv, out, name, "recvbuff");
}

Op make_op(Kind kind, const void* send, void* recv, std::size_t count, ncclDataType_t type,
           ncclRedOp_t red, int root) {
  Op op;
  op.kind = kind;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.type = type;
  op.red = red;
  op.root = root;
  return op;
}

ncclResult_t enqueue(Op op, ncclComm_t comm, cudaStream_t stream) {
  const char* name = kKindNames[int(op.kind)];
  if (const ncclResult_t r = check_comm(comm, name); r != ncclSuccess) return r;
  op.comm = comm->state;
  if (const ncclResult_t r = check(op, name); r != ncclSuccess) return r;
  op.fail = ncclResult_t(op.comm->fail_next.exchange(ncclSuccess));
  if (t_group_depth == 0) {
    auto batch = std::make_unique<Batch>();
    batch->ops.push_back(std::move(op));
    return launch(stream, std::move(batch));
  }
  for (auto& [s, batch] : t_group)
    if (s == stream) {
      batch->ops.push_back(std::move(op));
      return ncclSuccess;
    }
  t_group.emplace_back(stream, std::make_unique<Batch>());
  t_group.back().second->ops.push_back(std::move(op));
  return ncclSuccess;
}

}  // namespace
}  // namespace strata_nccl

using strata_nccl::Kind;
using strata_nccl::make_op;

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return strata_nccl::enqueue(make_op(Kind::all_reduce, sendbuff, recvbuff, count, datatype, op, 0),
                              comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return strata_nccl::enqueue(
      make_op(Kind::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, 0), comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return strata_nccl::enqueue(
      make_op(Kind::all_gather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0), comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return strata_nccl::enqueue(
      make_op(Kind::broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root), comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return strata_nccl::enqueue(make_op(Kind::reduce, sendbuff, recvbuff, count, datatype, op, root),
                              comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return strata_nccl::enqueue(
      make_op(Kind::send, sendbuff, nullptr, count, datatype, ncclSum, peer), comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return strata_nccl::enqueue(
      make_op(Kind::recv, nullptr, recvbuff, count, datatype, ncclSum, peer), comm, stream);
}

ncclResult_t ncclGroupStart(void) {
  ++strata_nccl::t_group_depth;
  return ncclSuccess;
}

// The outermost ncclGroupEnd queues each stream's operations as one batch, posted together.
ncclResult_t ncclGroupEnd(void) {
  if (strata_nccl::t_group_depth == 0)
    return strata_nccl::fail(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
  if (--strata_nccl::t_group_depth > 0) return ncclSuccess;
  auto group = std::move(strata_nccl::t_group);
  strata_nccl::t_group.clear();
  ncclResult_t result = ncclSuccess;
  for (auto& [stream, batch] : group) {
    const ncclResult_t r = strata_nccl::launch(stream, std::move(batch));
    if (result == ncclSuccess) result = r;
  }
  return result;
}

}  // extern "C"
