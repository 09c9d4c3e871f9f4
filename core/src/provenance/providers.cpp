// The provenance and topology providers' registries (providers.hpp), in the SDK library.
#include "provenance/providers.hpp"

#include <algorithm>
#include <mutex>

namespace strata {
namespace {

std::mutex registry_mutex;

template <class Provider>
std::vector<Provider>& registry() {
  static std::vector<Provider> list;
  return list;
}

template <class Provider>
void add(Provider provider) {
  std::lock_guard lock(registry_mutex);
  std::vector<Provider>& list = registry<Provider>();
  if (std::find(list.begin(), list.end(), provider) == list.end()) list.push_back(provider);
}

template <class Provider>
std::vector<Provider> registered() {
  std::lock_guard lock(registry_mutex);
  return registry<Provider>();
}

}  // namespace

void register_provenance_provider(ProvenanceProvider provider) { add(provider); }
void register_topology_provider(TopologyProvider provider) { add(provider); }
std::vector<ProvenanceProvider> provenance_providers() { return registered<ProvenanceProvider>(); }
std::vector<TopologyProvider> topology_providers() { return registered<TopologyProvider>(); }

}  // namespace strata
