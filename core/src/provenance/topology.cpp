#include "provenance/topology.hpp"

#include <hwloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <sstream>

#include "comm/mpi_transport.hpp"

namespace strata {

namespace {

// Owns a loaded hwloc topology.
class Hwloc {
 public:
  Hwloc() {
    if (hwloc_topology_init(&topo_) != 0) return;
    // PCI devices, network and OpenFabrics devices: what decides where GPUs and NICs sit.
    hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    loaded_ = hwloc_topology_load(topo_) == 0;
  }
  ~Hwloc() {
    if (topo_) hwloc_topology_destroy(topo_);
  }
  Hwloc(const Hwloc&) = delete;
  Hwloc& operator=(const Hwloc&) = delete;
  bool loaded() const { return loaded_; }
  hwloc_topology_t get() const { return topo_; }
  std::int64_t count(hwloc_obj_type_t type) const {
    return std::max(0, hwloc_get_nbobjs_by_type(topo_, type));
  }
  // Size of the first data (or unified) cache of `type`: one instance, as `lscpu` reports it.
  std::int64_t cache_bytes(hwloc_obj_type_t type) const {
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(topo_, type, o));)
      if (o->attr && o->attr->cache.type != HWLOC_OBJ_CACHE_INSTRUCTION)
        return std::int64_t(o->attr->cache.size);
    return 0;
  }

 private:
  hwloc_topology_t topo_ = nullptr;
  bool loaded_ = false;
};

// Appends `item` to a `sep`-separated list (one call, not `a + b + c`: GCC 12's -Wrestrict
// misfires on chained concatenation of temporaries).
void append(std::string& list, const char* sep, const std::string& item) {
  if (!list.empty()) list += sep;
  list += item;
}

// A PCI device hwloc keeps that is a GPU or accelerator: display (0x03xx) or processing
// accelerator (0x12xx) class from NVIDIA, AMD or Intel. Board management VGA chips (ASPEED,
// Matrox) are display class too, hence the vendor list.
bool is_gpu(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  const unsigned base = pci.class_id >> 8;
  const bool gpu_vendor =
      pci.vendor_id == 0x10de || pci.vendor_id == 0x1002 || pci.vendor_id == 0x8086;
  return gpu_vendor && (base == 0x03 || base == 0x12);
}

std::string hex4(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04x", v & 0xffff);
  return buf;
}

std::string pci_bus_id(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", unsigned(pci.domain), unsigned(pci.bus),
                unsigned(pci.dev), unsigned(pci.func));
  return buf;
}

void add_io(const Hwloc& hw, NodeTopology& node) {
  std::int64_t gpus = 0;
  std::string gpu_pci;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_pcidev(hw.get(), o));) {
    if (!is_gpu(o->attr->pcidev)) continue;
    ++gpus;
    const auto& pci = o->attr->pcidev;
    append(gpu_pci, ", ", pci_bus_id(pci) + " " + hex4(pci.vendor_id) + ":" + hex4(pci.device_id));
  }
  std::int64_t nics = 0;
  std::string nic_names;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(hw.get(), o));) {
    const auto type = o->attr->osdev.type;
    if (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    ++nics;
    append(nic_names, ",", o->name ? o->name : "?");
  }
  node.numbers.emplace_back("gpus", gpus);
  node.numbers.emplace_back("nics", nics);
  node.text.emplace_back("gpu_pci", gpu_pci);
  node.text.emplace_back("nic_names", nic_names);
}

std::int64_t memory_bytes(const Hwloc& hw) {
  std::int64_t total = 0;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(hw.get(), HWLOC_OBJ_NUMANODE, o));)
    total += std::int64_t(o->attr->numanode.local_memory);
  return total;
}

// "32 MiB", "48 KiB", "1280 KiB": the largest binary unit that divides the size.
std::string cache_size(std::int64_t bytes) {
  if (bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::string counted(std::int64_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

NodeTopology collect_node_topology(const std::string& host) {
  NodeTopology node;
  node.host = host;
  const Hwloc hw;
  if (!hw.loaded()) {
    node.text.emplace_back("error", "hwloc could not load this host's topology");
    return node;
  }
  node.numbers = {{"packages", hw.count(HWLOC_OBJ_PACKAGE)},
                  {"numa_nodes", hw.count(HWLOC_OBJ_NUMANODE)},
                  {"cores", hw.count(HWLOC_OBJ_CORE)},
                  {"pus", hw.count(HWLOC_OBJ_PU)},
                  {"memory_bytes", memory_bytes(hw)},
                  {"l1d_bytes", hw.cache_bytes(HWLOC_OBJ_L1CACHE)},
                  {"l2_bytes", hw.cache_bytes(HWLOC_OBJ_L2CACHE)},
                  {"l3_bytes", hw.cache_bytes(HWLOC_OBJ_L3CACHE)}};
  add_io(hw, node);
  const unsigned v = hwloc_get_api_version();
  node.text.emplace_back("hwloc_api_version", std::to_string(v >> 16) + "." +
                                                  std::to_string((v >> 8) & 0xff) + "." +
                                                  std::to_string(v & 0xff));
  for (TopologyProvider provider : topology_providers()) provider(node);
  return node;
}

std::string topology_line(const NodeTopology& n) {
  if (n.number("cores") < 0) return n.host + ": no topology (" + n.str("error") + ")";
  std::string parts;
  append(parts, ", ", counted(n.number("packages"), "package", "packages"));
  append(parts, ", ", counted(n.number("numa_nodes"), "NUMA node", "NUMA nodes"));
  append(parts, ", ", counted(n.number("cores"), "core", "cores"));
  append(parts, ", ", counted(n.number("pus"), "PU", "PUs"));
  for (const auto& [key, label] :
       {std::pair{"l1d_bytes", "L1d "}, {"l2_bytes", "L2 "}, {"l3_bytes", "L3 "}})
    if (n.number(key) > 0) append(parts, ", ", label + cache_size(n.number(key)));
  append(parts, ", ", "GPUs " + std::to_string(n.number("gpus")));
  const std::string nics = n.str("nic_names");
  append(parts, ", ", "NICs " + (nics.empty() ? std::string("none") : nics));
  if (!n.str("gpu_links").empty()) append(parts, ", ", "GPU links [" + n.str("gpu_links") + "]");
  return n.host + ": " + parts;
}

std::string topology_summary(const std::vector<NodeTopology>& nodes) {
  std::string out;
  for (const NodeTopology& n : nodes) append(out, "\n", topology_line(n));
  return out;
}

// Keys and values hold no tab or newline (host names, device names, the link matrix).
std::string encode_topology(const NodeTopology& node) {
  std::string out = "h\t" + node.host + "\n";
  for (const auto& [k, v] : node.numbers) out += "i\t" + k + "\t" + std::to_string(v) + "\n";
  for (const auto& [k, v] : node.text) out += "s\t" + k + "\t" + v + "\n";
  return out;
}

NodeTopology decode_topology(const std::string& text) {
  NodeTopology node;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto tab1 = line.find('\t');
    if (tab1 == std::string::npos) continue;
    const std::string kind = line.substr(0, tab1), rest = line.substr(tab1 + 1);
    if (kind == "h") {
      node.host = rest;
      continue;
    }
    const auto tab2 = rest.find('\t');
    if (tab2 == std::string::npos) continue;
    const std::string key = rest.substr(0, tab2), value = rest.substr(tab2 + 1);
    if (kind == "i") node.numbers.emplace_back(key, std::stoll(value));
    if (kind == "s") node.text.emplace_back(key, value);
  }
  return node;
}

std::vector<NodeTopology> gather_node_topologies() {
  std::string host = mpi::processor_name();
  if (host.empty() || host == "." || host == "..") host = "unknown";  // an HDF5 group name
  const std::string mine =
      mpi::local_rank().rank == 0 ? encode_topology(collect_node_topology(host)) : "";
  const std::vector<std::string> all = mpi::control_gather_strings(mine);
  std::vector<NodeTopology> nodes;
  std::set<std::string> seen;
  for (const std::string& text : all) {
    if (text.empty()) continue;
    NodeTopology node = decode_topology(text);
    if (seen.insert(node.host).second) nodes.push_back(std::move(node));
  }
  return nodes;
}

}  // namespace strata
