// The MPI transport (Group over an MPI communicator) and the MPI control plane: the bootstrap,
// result gathering and error channel that the harness itself uses. Control-plane traffic is not
// recorded in the comm ledger: it is measurement, not training.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "strata/comm.hpp"

namespace strata::mpi {

void init(int* argc, char*** argv);  // MPI_THREAD_MULTIPLE, errors returned not fatal
void finalize();
bool initialized();
int world_rank();
int world_size();
int local_size();  // ranks sharing this host
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

// Error channel: a failing rank tells rank 0, which records it in the run file before the job ends.
void send_error_to_root(const std::string& message);
bool poll_error(std::string* message);  // rank 0, non-blocking
[[noreturn]] void abort_job(int code);

}  // namespace strata::mpi
