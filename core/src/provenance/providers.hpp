// The registries a backend library adds to a run's provenance through (libstrata_cuda.so: the
// CUDA, cuBLAS and NCCL versions; NVML's GPU link matrix). They live in the SDK library
// (libstrata_core), as the backend and transport registries do, not in the runner's own: a
// library the runner loads with dlopen then registers into the registry the runner reads.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

struct NodeTopology;  // results/run_record.hpp
using Provenance = std::vector<std::pair<std::string, std::string>>;

// What collect_provenance() adds: a provider's key replaces the core's entry of the same name
// (e.g. cuda_version "not built").
using ProvenanceProvider = Provenance (*)();
// What collect_node_topology() adds to this node's topology (NVML's gpu_links matrix).
using TopologyProvider = void (*)(NodeTopology&);

// Registering a provider twice adds nothing.
void register_provenance_provider(ProvenanceProvider provider);
void register_topology_provider(TopologyProvider provider);
// The registered providers, in registration order.
std::vector<ProvenanceProvider> provenance_providers();
std::vector<TopologyProvider> topology_providers();

}  // namespace strata
STRATA_EXPORT_END
