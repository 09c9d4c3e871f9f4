// The MPI transport (Group over an MPI communicator) and the MPI control plane: the bootstrap,
// result gathering and error channel that the harness itself uses. Control-plane traffic is not
// recorded in the comm ledger: it is measurement, not training.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata::mpi {

// MPI_THREAD_MULTIPLE, errors returned not fatal. `alone`: no launcher started this process (a
// 1-rank run): a singleton with no peers to reach, which need not start a daemon or probe networks.
void init(int* argc, char*** argv, bool alone = false);
void finalize();
bool initialized();
int world_rank();
int world_size();
// This rank among the ranks sharing its host (a shared-memory split of the world; collective).
struct LocalRank {
  int rank = 0, size = 1;
};
LocalRank local_rank();
// Collectives over the ranks sharing this host, in which waiting ranks sleep rather than spin (so
// that they leave the host's cores to local rank 0 while it measures the node, node_peak.hpp).
void node_barrier();
void node_broadcast(double* values, int n);  // local rank 0's values to the host's other ranks
int node_ranks_with(std::uint64_t value);    // ranks of this host (this one too) passing `value`
std::string processor_name();
std::string library_version();

// Collective over the world: returns the group of ranks that passed the same color, ordered by key.
std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger);

// Control plane, on a private duplicate of the world communicator.
void control_allreduce_sum(double* values, int n);
void control_allreduce_max(double* values, int n);
std::vector<double> control_gather(const std::vector<double>& local);       // root: [ranks x n]
std::vector<std::string> control_gather_strings(const std::string& local);  // root: [ranks]
std::vector<std::vector<double>> control_gather_varying(const std::vector<double>& local);  // root
void control_barrier();

// Control-plane calls in flight on this rank (the watchdog ends the job when one hangs).
std::vector<InFlight> control_in_flight();

// Notices: small messages between the ranks' watchdog threads on a private communicator, sent and
// received without blocking, so a stopped or dead peer never holds up the sender.
enum class Notice : int {
  error = 77,      // to rank 0: "status|message" of a failure on the sender
  heartbeat = 78,  // to rank 0: what the sender waits in ("" = not blocked); from rank 0: alive
  cancel = 79,     // to rank 0: the sender got SIGTERM/SIGINT; from rank 0: I am handling it
  ending = 80,     // from rank 0: the run file is written, the job ends; payload: the exit code
};
// Sends are dropped when `to` already has many unreceived notices of ours (it is not listening).
void post_notice(int to, Notice kind, const std::string& payload);
bool poll_notice(Notice kind, int* from, std::string* payload);  // non-blocking
void send_error_to_root(const std::string& message);
// Ends every rank with `code`: told to a supervising runner, which ends them (job_end_note.hpp),
// or to the launcher (MPI_Abort).
[[noreturn]] void abort_job(int code);

}  // namespace strata::mpi
STRATA_EXPORT_END
