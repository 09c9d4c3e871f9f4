/* The NCCL stand-in's own test hooks: no NCCL API, used only by the tests of the transport. */
#pragma once
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The next operation this rank enqueues on `comm` fails when its stream reaches it, with `error`
 * in ncclCommGetAsyncError and no MPI call posted, as a broken link would leave a real rank: the
 * failure tests. The peers waiting for it hang until a rank calls ncclCommAbort. */
ncclResult_t ncclStandinFailNext(ncclComm_t comm, ncclResult_t error);

#ifdef __cplusplus
}
#endif
