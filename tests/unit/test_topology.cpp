// The node topology of /provenance (topology.hpp): hwloc's counts on a fake node read from XML
// (HWLOC_XMLFILE), the summary line, the text form gathered over MPI, and this machine's counts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "provenance/topology.hpp"
#include "results/run_record.hpp"
#include "scoped_env.hpp"

namespace {

// Sets HWLOC_XMLFILE for one test: hwloc then reads the topology from that file. The fake's GPU
// and NICs are PCI and OS devices, so a caller's HWLOC_COMPONENTS (the MPI tests' -pci,-linuxio)
// is set aside for the test and put back after it.
struct FakeNode {
  explicit FakeNode(const std::string& xml) : xml_file("HWLOC_XMLFILE", xml.c_str()) {}
  ScopedEnv all_components{"HWLOC_COMPONENTS", nullptr};
  ScopedEnv xml_file;
};

const std::string kFakeXml = std::string(STRATA_TEST_DATA_DIR) + "/fake_topology.xml";

TEST(Topology, FakeNodeFromXml) {
  FakeNode fake(kFakeXml);
  const strata::NodeTopology n = strata::collect_node_topology("fake");
  EXPECT_EQ(n.number("packages"), 2);
  EXPECT_EQ(n.number("numa_nodes"), 2);
  EXPECT_EQ(n.number("cores"), 8);
  EXPECT_EQ(n.number("pus"), 16);
  EXPECT_EQ(n.number("memory_bytes"), 2 * (std::int64_t(16) << 30));
  EXPECT_EQ(n.number("l1d_bytes"), 48 << 10);
  EXPECT_EQ(n.number("l2_bytes"), 1 << 20);
  EXPECT_EQ(n.number("l3_bytes"), 32 << 20);
  EXPECT_EQ(n.number("gpus"), 1);  // the NVIDIA 3D controller; the ASPEED BMC VGA chip is not one
  EXPECT_EQ(n.str("gpu_pci"), "0000:07:00.0 10de:2330");
  EXPECT_EQ(n.number("nics"), 2);
  EXPECT_EQ(n.str("nic_names"), "ib0,mlx5_0");
  EXPECT_EQ(strata::topology_line(n),
            "fake: 2 packages, 2 NUMA nodes, 8 cores, 16 PUs, L1d 48 KiB, L2 1 MiB, L3 32 MiB, "
            "GPUs 1, NICs ib0,mlx5_0");
}

TEST(Topology, SummaryJoinsOneLinePerNode) {
  strata::NodeTopology a{"a",
                         {{"packages", 1},
                          {"numa_nodes", 1},
                          {"cores", 1},
                          {"pus", 2},
                          {"l3_bytes", 1280 << 10},
                          {"gpus", 4}},
                         {{"gpu_links", "X NV4; NV4 X"}}};
  strata::NodeTopology b{"b", {}, {{"error", "hwloc could not load this host's topology"}}};
  EXPECT_EQ(strata::topology_summary({a, b}),
            "a: 1 package, 1 NUMA node, 1 core, 2 PUs, L3 1280 KiB, GPUs 4, NICs none, "
            "GPU links [X NV4; NV4 X]\n"
            "b: no topology (hwloc could not load this host's topology)");
}

TEST(Topology, TextFormRoundTrips) {
  FakeNode fake(kFakeXml);
  const strata::NodeTopology n = strata::collect_node_topology("node-01.cluster");
  const strata::NodeTopology back = strata::decode_topology(strata::encode_topology(n));
  EXPECT_EQ(back.host, "node-01.cluster");
  EXPECT_EQ(back.numbers, n.numbers);
  EXPECT_EQ(back.text, n.text);
}

// A provider stays registered for the process's life (there is no unregistering), so this one
// adds its entry only while a test turns it on: the other tests, run in the same process in any
// order (--gtest_shuffle, --gtest_repeat), see no gpu_links of it.
bool g_links_on = false;
void add_links(strata::NodeTopology& n) {
  if (g_links_on) n.text.emplace_back("gpu_links", "X");
}

TEST(Topology, ThisMachineAndProviders) {
  const strata::NodeTopology n = strata::collect_node_topology("here");
  EXPECT_EQ(n.number("pus"), sysconf(_SC_NPROCESSORS_ONLN));  // no SMT hidden from hwloc
  EXPECT_GE(n.number("cores"), 1);
  EXPECT_LE(n.number("cores"), n.number("pus"));
  EXPECT_GE(n.number("packages"), 1);
  EXPECT_GE(n.number("numa_nodes"), 1);
  EXPECT_TRUE(n.str("gpu_links").empty());
  strata::register_topology_provider(&add_links);
  strata::register_topology_provider(&add_links);  // twice: still once
  g_links_on = true;
  const strata::NodeTopology with = strata::collect_node_topology("here");
  g_links_on = false;
  EXPECT_EQ(with.str("gpu_links"), "X");
  EXPECT_EQ(with.text.size(), n.text.size() + 1);
}

// The run file's /provenance/topology: int64 and string attributes per host, read back in order.
TEST(Topology, RunFileRoundTrip) {
  FakeNode fake(kFakeXml);
  strata::RunRecord in;
  in.run_id = "topology";
  in.ranks = 2;
  in.hostnames = {"node-a", "node-b"};
  in.topology = {strata::collect_node_topology("node-a"), strata::collect_node_topology("node-b")};
  in.topology[1].text.emplace_back("gpu_links", "X NV18; NV18 X");
  const auto dir =
      std::filesystem::temp_directory_path() / ("strata-topology-" + std::to_string(getpid()));
  const std::string path = (dir / "run.h5").string();
  strata::write_run_file(in, path);
  const strata::RunRecord out = strata::read_run_file(path);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(out.topology.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(out.topology[i].host, in.topology[i].host);
    EXPECT_EQ(out.topology[i].numbers, in.topology[i].numbers);
    EXPECT_EQ(out.topology[i].text, in.topology[i].text);
  }
  EXPECT_EQ(out.topology[0].number("cores"), 8);
  EXPECT_EQ(out.topology[1].str("gpu_links"), "X NV18; NV18 X");
}

}  // namespace
