// Shared by the NCCL stand-in's sources; not part of the emulated API.
#pragma once
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <memory>

namespace strata_nccl {

// Tags of the stand-in's own messages. The bootstrap's go over MPI_COMM_WORLD (the ranks of a new
// communicator have nothing else in common), 1000 ids in flight per creating rank at most.
constexpr int kHelloTag = 21000;      // + id sequence % 1000: a rank joins an id
constexpr int kTableTag = 22000;      // + id sequence % 1000: the creator's answer
constexpr int kPointToPointTag = 11;  // send/recv on a communicator's data comm
constexpr int kAbortTag = 12;         // "I aborted", on its control comm

// One communicator. Shared by the handle and the stream work that uses it, so that destroying
// the handle while work is queued is safe.
struct CommState {
  ~CommState();
  MPI_Comm data = MPI_COMM_NULL;     // collectives and send/recv, only from stream threads
  MPI_Comm control = MPI_COMM_NULL;  // ncclCommSplit (the calling thread) and abort notices
  int rank = 0, size = 1, device = 0;
  std::atomic<int> async_error{ncclSuccess};  // first error of stream work, sticky
  std::atomic<bool> aborted{false};           // ncclCommAbort: stream work ends at once
  std::atomic<int> fail_next{ncclSuccess};    // ncclStandinFailNext
  std::atomic<int> peer_aborted{-1};          // the rank whose abort notice came in
};

}  // namespace strata_nccl

struct ncclComm {
  std::shared_ptr<strata_nccl::CommState> state;
};

namespace strata_nccl {

// Records the process's last error (ncclGetLastError), also on stderr when NCCL_DEBUG is set, and
// returns `result`.
ncclResult_t fail(ncclResult_t result, const char* format, ...)
    __attribute__((format(printf, 2, 3)));
// Sets the communicator's asynchronous error unless one is set already; records the text.
void set_async_error(CommState& comm, ncclResult_t error, const char* what);
// ncclInvalidArgument unless `comm` is a live communicator.
ncclResult_t check_comm(ncclComm_t comm, const char* call);
// True (and the comm's async error set) once another rank's abort notice came in.
bool peer_aborted(CommState& comm);

}  // namespace strata_nccl
