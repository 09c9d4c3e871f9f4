// The NCCL stand-in's communicators: ids, the bootstrap over MPI, split, destroy and abort, the
// queries and the error texts.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "internal.hpp"
#include "nccl_standin.h"

namespace strata_nccl {
namespace {

constexpr char kMagic[16] = "strata-standin";

// What an id carries: the world rank that answers the bootstrap, and its sequence number.
struct IdData {
  char magic[16];
  int creator;
  int sequence;
};
static_assert(sizeof(IdData) <= NCCL_UNIQUE_ID_BYTES);

std::mutex g_error_mutex;
std::string g_last_error;
std::atomic<int> g_next_sequence{0};

bool mpi_ready() {
  int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return false;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

ncclResult_t mpi_failed(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return fail(ncclSystemError, "%s failed: %.*s", call, len, text);
}

#define STANDIN_MPI(call)                                                      \
  do {                                                                         \
    const int standin_code_ = (call);                                          \
    if (standin_code_ != MPI_SUCCESS) return mpi_failed(standin_code_, #call); \
  } while (0)

// The communicator over `data` (taken over), with a control comm of its own.
ncclResult_t make_comm(MPI_Comm data, ncclComm_t* out) {
  auto state = std::make_shared<CommState>();
  state->data = data;
  MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN);
  STANDIN_MPI(MPI_Comm_rank(data, &state->rank));
  STANDIN_MPI(MPI_Comm_size(data, &state->size));
  STANDIN_MPI(MPI_Comm_dup(data, &state->control));
  MPI_Comm_set_errhandler(state->control, MPI_ERRORS_RETURN);
  if (cudaGetDevice(&state->device) != cudaSuccess)
    return fail(ncclUnhandledCudaError, "cudaGetDevice failed");
  *out = new ncclComm{std::move(state)};
  return ncclSuccess;
}

// The creator of the id: gathers each rank's place, answers every rank with the table of world
// ranks in communicator order (entry 0 is -1 when the ranks disagree).
ncclResult_t answer_hellos(const IdData& id, int nranks) {
  std::vector<int> table(std::size_t(nranks), -1);
  bool consistent = true;
  std::vector<int> from(std::size_t(nranks), -1);
  for (int i = 0; i < nranks; ++i) {
    int hello[3];
    MPI_Status status;
    STANDIN_MPI(MPI_Recv(hello, 3, MPI_INT, MPI_ANY_SOURCE, kHelloTag + id.sequence % 1000,
                         MPI_COMM_WORLD, &status));
    from[std::size_t(i)] = status.MPI_SOURCE;
    const int rank = hello[0];
    if (hello[1] != nranks || hello[2] != id.sequence || rank < 0 || rank >= nranks ||
        table[std::size_t(rank)] != -1)
      consistent = false;
    else
      table[std::size_t(rank)] = status.MPI_SOURCE;
  }
  if (!consistent) table.assign(std::size_t(nranks), -1);
  std::vector<MPI_Request> requests(static_cast<std::size_t>(nranks));
  for (int i = 0; i < nranks; ++i)
    STANDIN_MPI(MPI_Isend(table.data(), nranks, MPI_INT, from[std::size_t(i)],
                          kTableTag + id.sequence % 1000, MPI_COMM_WORLD,
                          &requests[std::size_t(i)]));
  STANDIN_MPI(MPI_Waitall(nranks, requests.data(), MPI_STATUSES_IGNORE));
  return ncclSuccess;
}

}  // namespace

CommState::~CommState() {
  // An aborted communicator may have operations posted that will never complete: left to MPI.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || aborted) return;
  if (control != MPI_COMM_NULL) MPI_Comm_free(&control);
  if (data != MPI_COMM_NULL) MPI_Comm_free(&data);
}

ncclResult_t fail(ncclResult_t result, const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  if (std::getenv("NCCL_DEBUG") != nullptr) std::fprintf(stderr, "NCCL stand-in WARN %s\n", text);
  std::lock_guard lock(g_error_mutex);
  g_last_error = text;
  return result;
}

void set_async_error(CommState& comm, ncclResult_t error, const char* what) {
  int expected = ncclSuccess;
  if (comm.async_error.compare_exchange_strong(expected, error))
    fail(error, "rank %d of %d: %s", comm.rank, comm.size, what);
}

ncclResult_t check_comm(ncclComm_t comm, const char* call) {
  if (comm == nullptr || !comm->state) return fail(ncclInvalidArgument, "%s: comm is NULL", call);
  if (comm->state->aborted) return fail(ncclInvalidUsage, "%s: the communicator was aborted", call);
  return ncclSuccess;
}

bool peer_aborted(CommState& comm) {
  if (comm.peer_aborted >= 0) return true;
  int flag = 0;
  MPI_Status status;
  if (MPI_Iprobe(MPI_ANY_SOURCE, kAbortTag, comm.control, &flag, &status) != MPI_SUCCESS || !flag)
    return false;
  comm.peer_aborted = status.MPI_SOURCE;
  const std::string what = "rank " + std::to_string(status.MPI_SOURCE) +
                           " aborted the communicator (ncclCommAbort): its operations will never "
                           "complete";
  set_async_error(comm, ncclRemoteError, what.c_str());
  return true;
}

}  // namespace strata_nccl

using namespace strata_nccl;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
  if (!mpi_ready())
    return fail(ncclInvalidUsage,
                "the NCCL stand-in needs MPI initialised with "
                "MPI_THREAD_MULTIPLE (its streams call MPI)");
  IdData id{};
  std::memcpy(id.magic, kMagic, sizeof kMagic);
  MPI_Comm_rank(MPI_COMM_WORLD, &id.creator);
  id.sequence = g_next_sequence++;
  std::memset(unique_id, 0, sizeof *unique_id);
  std::memcpy(unique_id->internal, &id, sizeof id);
  return ncclSuccess;
}

// Every rank tells the id's creator its place; the creator answers with the world ranks in
// communicator order; the ranks then build their MPI communicator among themselves.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (!mpi_ready())
    return fail(ncclInvalidUsage,
                "the NCCL stand-in needs MPI initialised with "
                "MPI_THREAD_MULTIPLE (its streams call MPI)");
  IdData id;
  std::memcpy(&id, comm_id.internal, sizeof id);
  if (std::memcmp(id.magic, kMagic, sizeof kMagic) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: the id does not come from ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument,
                "ncclCommInitRank: rank %d, nranks %d: need 0 <= rank < nranks", rank, nranks);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  const int hello[3] = {rank, nranks, id.sequence};
  MPI_Request sent;
  STANDIN_MPI(MPI_Isend(hello, 3, MPI_INT, id.creator, kHelloTag + id.sequence % 1000,
                        MPI_COMM_WORLD, &sent));
  if (world_rank == id.creator) {
    const ncclResult_t answered = answer_hellos(id, nranks);
    if (answered != ncclSuccess) return answered;
  }
  std::vector<int> table(static_cast<std::size_t>(nranks));
  STANDIN_MPI(MPI_Recv(table.data(), nranks, MPI_INT, id.creator, kTableTag + id.sequence % 1000,
                       MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  STANDIN_MPI(MPI_Wait(&sent, MPI_STATUS_IGNORE));
  if (table[0] < 0)
    return fail(ncclInvalidUsage,
                "ncclCommInitRank: the ranks of the id disagree on nranks or "
                "claim the same rank");
  MPI_Group world_group, group;
  STANDIN_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  STANDIN_MPI(MPI_Group_incl(world_group, nranks, table.data(), &group));
  MPI_Comm data = MPI_COMM_NULL;
  const int created = MPI_Comm_create_group(MPI_COMM_WORLD, group, kHelloTag, &data);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  STANDIN_MPI(created);
  return make_comm(data, comm);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* /*config: blocking only*/) {
  if (const ncclResult_t r = check_comm(comm, "ncclCommSplit"); r != ncclSuccess) return r;
  if (newcomm == nullptr) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument, "ncclCommSplit: color %d is negative", color);
  // On the control comm: the data comm belongs to the stream that may be using it right now.
  MPI_Comm data = MPI_COMM_NULL;
  STANDIN_MPI(MPI_Comm_split(comm->state->control,
                             color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &data));
  if (data == MPI_COMM_NULL) return ncclSuccess;
  return make_comm(data, newcomm);
}

// Queued work keeps the communicator's state; its MPI comms go with the last user.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
  delete comm;
  return ncclSuccess;
}

// Returns at once: work of this communicator still queued or waiting ends without MPI calls, and
// every other rank hears of the abort (its waiting operations fail with ncclRemoteError).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  CommState& state = *comm->state;
  if (!state.aborted.exchange(true)) {
    static const int kNotice = 1;
    for (int r = 0; r < state.size; ++r) {
      if (r == state.rank) continue;
      MPI_Request request;
      if (MPI_Isend(&kNotice, 1, MPI_INT, r, kAbortTag, state.control, &request) == MPI_SUCCESS)
        MPI_Request_free(&request);
    }
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr)
    return fail(ncclInvalidArgument, "ncclCommCount: NULL argument");
  *count = comm->state->size;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr)
    return fail(ncclInvalidArgument, "ncclCommCuDevice: NULL argument");
  *device = comm->state->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr)
    return fail(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
  *rank = comm->state->rank;
  return ncclSuccess;
}

// Also where a peer's abort is noticed when no operation is waiting.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr)
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  *async_error = ncclResult_t(comm->state->async_error.load());
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

// As in NCCL: the process's last error, whatever `comm`; the text stays until the next error of
// the calling thread's ncclGetLastError.
const char* ncclGetLastError(ncclComm_t /*comm*/) {
  thread_local std::string copy;
  std::lock_guard lock(g_error_mutex);
  copy = g_last_error;
  return copy.c_str();
}

ncclResult_t ncclStandinFailNext(ncclComm_t comm, ncclResult_t error) {
  if (const ncclResult_t r = check_comm(comm, "ncclStandinFailNext"); r != ncclSuccess) return r;
  comm->state->fail_next = error;
  return ncclSuccess;
}

}  // extern "C"
