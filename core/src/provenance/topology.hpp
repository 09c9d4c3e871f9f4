// The node topology in a run file's provenance: hwloc's view of each distinct host (packages, NUMA
// nodes, cores, PUs, caches, PCI GPUs and NICs) and, from a registered provider (the CUDA
// backend's NVML reader), the GPU-to-GPU link matrix. Results depend on all of these, so a run
// file says what it ran on.
#pragma once
#include <string>
#include <vector>

#include "provenance/providers.hpp"  // register_topology_provider
#include "results/run_record.hpp"

namespace strata {

// This host as hwloc sees it, with I/O discovery (PCI devices, network and OpenFabrics devices).
// HWLOC_XMLFILE=topo.xml makes hwloc read a saved topology instead (the tests' fake nodes).
// Numbers (int64 in the file): packages, numa_nodes, cores, pus, memory_bytes, l1d_bytes,
// l2_bytes, l3_bytes (one cache instance; 0 without that level), gpus, nics. Text: nic_names,
// gpu_pci ("bus-id vendor:device" per GPU), hwloc_api_version, and what providers add (gpu_links).
NodeTopology collect_node_topology(const std::string& host);

// One line per node: "host: 1 package, 1 NUMA node, 2 cores, 2 PUs, L1d 32 KiB, L2 1 MiB,
// L3 32 MiB, GPUs 0, NICs eth0" (+ ", GPU links [X NV18; NV18 X]" where known).
std::string topology_line(const NodeTopology& node);
// The lines of every node joined with '\n': /provenance's topology_summary.
std::string topology_summary(const std::vector<NodeTopology>& nodes);

// Text form for gathering over MPI: one "i|s <key>\t<value>" line per entry.
std::string encode_topology(const NodeTopology& node);
NodeTopology decode_topology(const std::string& text);

// Collective over the world: local rank 0 of every host describes it; rank 0 returns one entry
// per distinct host name, in rank order (ranks of virtual nodes on one host share it); other
// ranks return nothing.
std::vector<NodeTopology> gather_node_topologies();

}  // namespace strata
