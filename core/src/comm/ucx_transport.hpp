// The UCX transport: Group over UCP tagged messages (see ucx_transport.cpp for the algorithms).
#pragma once
#include <memory>
#include <string>

#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata::ucx {

// Collective over MPI_COMM_WORLD (MPI must be initialised; MPI is the bootstrap that exchanges the
// UCP worker addresses): the ranks that pass the same color form one group, ordered by key.
std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger);

// "UCX 1.13.1": the library loaded at run time (ucp_get_version_string).
std::string library_version();

}  // namespace strata::ucx
STRATA_EXPORT_END
