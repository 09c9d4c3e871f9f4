// Transport registry: which backends this build has, and the split that creates a group of one.
#include "comm/transport.hpp"

#include "comm/mpi_transport.hpp"
#ifdef STRATA_HAVE_UCX
#include "comm/ucx_transport.hpp"
#endif

namespace strata {

std::vector<std::string> transports_built() {
  std::vector<std::string> out = {"mpi"};
#ifdef STRATA_HAVE_UCX
  out.push_back("ucx");
#endif
  return out;
}

bool transport_built(const std::string& transport) {
  for (const auto& t : transports_built())
    if (t == transport) return true;
  return false;
}

std::unique_ptr<Group> split_group(const std::string& transport, const std::string& name, int color,
                                   int key, CommLedger* ledger) {
  if (transport == "mpi") return mpi::split(name, color, key, ledger);
#ifdef STRATA_HAVE_UCX
  if (transport == "ucx") return ucx::split(name, color, key, ledger);
#endif
  throw Error("transport '" + transport + "' is not built into this binary",
              "runner --help lists the transports of this build");
}

std::string transport_version(const std::string& transport) {
  if (transport == "mpi") return mpi::initialized() ? mpi::library_version() : "MPI";
#ifdef STRATA_HAVE_UCX
  if (transport == "ucx") return ucx::library_version();
#endif
  return "not built";
}

}  // namespace strata
