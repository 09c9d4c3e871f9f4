// The transports of the training data plane, behind one factory. MPI is the bootstrap and control
// plane of every run; a transport only decides what carries the Group calls of the mesh groups.
//   mpi  MPI collectives and MPI_Send/Recv on a split communicator (always built)
//   ucx  UCP tagged messages between the group's ranks, collectives built on them (STRATA_HAVE_UCX)
//   gloo gloo's collectives over its tcp device, rendezvous through MPI (STRATA_HAVE_GLOO)
//   nccl NCCL on device buffers (strata_cuda, registered by the runner when built with NCCL)
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// The CPU-side transports built into this binary, in a stable order ("mpi" first).
std::vector<std::string> transports_built();
bool transport_built(const std::string& transport);

// Collective over MPI_COMM_WORLD (MPI must be initialised): the ranks that pass the same color
// form one group of `transport`, ordered by key. Every rank must call it in the same order.
std::unique_ptr<Group> split_group(const std::string& transport, const std::string& name, int color,
                                   int key, CommLedger* ledger);

// A transport built outside strata_core (NCCL's, in strata_cuda): the runner registers it at
// start-up, before the options are parsed, and it is then built like the others.
struct TransportEntry {
  std::string name;
  std::function<std::unique_ptr<Group>(const std::string& name, int color, int key,
                                       CommLedger* ledger)>
      split;
  std::function<std::string()> version;
};
void register_transport(TransportEntry entry);

// The job is ending (the watchdog gave up, a signal came): a transport whose waits poll (NCCL's)
// stops waiting and throws instead of blocking the thread that the job's end needs.
void request_comm_stop();
bool comm_stop_requested();

// Version string of the transport's library ("Open MPI v4.1.4", "UCX 1.13.1", "gloo 0.5.0 (tcp)"),
// or "not built".
std::string transport_version(const std::string& transport);

}  // namespace strata
STRATA_EXPORT_END
