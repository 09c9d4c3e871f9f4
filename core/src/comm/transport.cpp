// Transport registry: which backends this build has, and the split that creates a group of one.
#include "comm/transport.hpp"

#include <atomic>
#include <deque>
#include <mutex>

#include "backends/backend.hpp"
#include "comm/mpi_transport.hpp"
#ifdef STRATA_HAVE_UCX
#include "comm/ucx_transport.hpp"
#endif
#ifdef STRATA_HAVE_GLOO
#include "comm/gloo_transport.hpp"
#endif

namespace strata {
namespace {

std::mutex g_registered_mutex;
std::deque<TransportEntry> g_registered;  // a deque: entries stay where they are
std::atomic<bool> g_comm_stop{false};

const TransportEntry* registered(const std::string& transport) {
  std::lock_guard lock(g_registered_mutex);
  for (const TransportEntry& e : g_registered)
    if (e.name == transport) return &e;  // entries are never removed
  return nullptr;
}

// The entry of `transport`, loading the backend library that declared it first if need be; null
// when none has it, with `why` saying what failed to load.
const TransportEntry* entry_of(const std::string& transport, std::string& why) {
  if (const TransportEntry* e = registered(transport)) return e;
  why = load_backend_library_of(transport);
  return registered(transport);
}

}  // namespace

void register_transport(TransportEntry entry) {
  std::lock_guard lock(g_registered_mutex);
  for (TransportEntry& e : g_registered)
    if (e.name == entry.name) return;  // registered once; a second call changes nothing
  g_registered.push_back(std::move(entry));
}

void request_comm_stop() { g_comm_stop = true; }
bool comm_stop_requested() { return g_comm_stop; }

std::vector<std::string> transports_built() {
  std::vector<std::string> out = {"mpi"};
#ifdef STRATA_HAVE_UCX
  out.push_back("ucx");
#endif
#ifdef STRATA_HAVE_GLOO
  out.push_back("gloo");
#endif
  {
    std::lock_guard lock(g_registered_mutex);
    for (const TransportEntry& e : g_registered) out.push_back(e.name);
  }
  for (std::string& t : declared_transports()) out.push_back(std::move(t));
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
#ifdef STRATA_HAVE_GLOO
  if (transport == "gloo") return gloo_comm::split(name, color, key, ledger);
#endif
  std::string why;
  if (const TransportEntry* e = entry_of(transport, why)) return e->split(name, color, key, ledger);
  if (!why.empty()) throw Error("transport '" + transport + "': " + why);
  throw Error("transport '" + transport + "' is not built into this binary",
              "runner --help lists the transports of this build");
}

std::string transport_version(const std::string& transport) {
  if (transport == "mpi") return mpi::initialized() ? mpi::library_version() : "MPI";
#ifdef STRATA_HAVE_UCX
  if (transport == "ucx") return ucx::library_version();
#endif
#ifdef STRATA_HAVE_GLOO
  if (transport == "gloo") return gloo_comm::library_version();
#endif
  std::string why;
  if (const TransportEntry* e = entry_of(transport, why)) return e->version();
  return why.empty() ? "not built" : why;
}

}  // namespace strata
