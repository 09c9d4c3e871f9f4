// The gloo transport: Group over gloo's tcp device and gloo's own collectives (see
// gloo_transport.cpp for the rendezvous, the interface choice and which collective is which).
#pragma once
#include <memory>
#include <string>

#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata::gloo_comm {

// Collective over MPI_COMM_WORLD (MPI must be initialised; MPI is the rendezvous that exchanges
// the tcp pairs' addresses): the ranks that pass the same color form one group, ordered by key.
std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger);

// "gloo 0.5.0 (tcp)": the headers' version (the library reports none at run time), with where
// the tcp device bound while one exists ("gloo 0.5.0 (tcp, host 127.0.0.1 (...))").
std::string library_version();

// Where the tcp device binds, as decided for a world of ranks on one host (`one_host`) or on
// several: STRATA_GLOO_IFNAME, else GLOO_SOCKET_IFNAME (PyTorch's variable), names an interface;
// else one host binds loopback (127.0.0.1) and several the address this host's name resolves to
// when that is not loopback, else the first interface up that is not loopback (ib* first).
// Returns a description ("interface lo", "host 127.0.0.1"); throws strata::Error when the named
// interface does not exist.
std::string interface_choice(bool one_host);

}  // namespace strata::gloo_comm
STRATA_EXPORT_END
