// Memory admission (core/src/runner/memory_admission.hpp): the host's memory from fake /proc and
// cgroup files and Slurm's variables, and the check against the real ddp plugin's predict().
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "installed_plugins.hpp"
#include "runner/memory_admission.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;
constexpr double GiB = 1024.0 * 1024 * 1024;

// A fake host: /proc/meminfo, /proc/self/cgroup and a cgroup tree in a fresh directory.
class FakeHost : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("admission_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "cg");
    src_.meminfo = (dir_ / "meminfo").string();
    src_.self_cgroup = (dir_ / "cgroup").string();
    src_.cgroup_root = (dir_ / "cg").string();
    src_.env = [this](const char* name) -> const char* {
      auto it = env_.find(name);
      return it == env_.end() ? nullptr : it->second.c_str();
    };
    write("meminfo",
          "MemTotal:       25000000 kB\nMemFree:        1000 kB\n"
          "MemAvailable:    8388608 kB\nBuffers:  12 kB\n");  // 8 GiB
    write("cgroup", "0::/\n");
    src_.address_space_limit = [this] { return address_space_; };
  }
  void write(const fs::path& rel, const std::string& text) {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  fs::path dir_;
  HostMemorySources src_;
  std::map<std::string, std::string> env_;
  double address_space_ = 0;  // ulimit -v: none
};

TEST_F(FakeHost, MemAvailableWhenNothingElseLimits) {
  const HostMemory m = host_memory(src_);
  EXPECT_DOUBLE_EQ(m.bytes, 8 * GiB);
  EXPECT_EQ(m.source, "MemAvailable");
}

TEST_F(FakeHost, TightestCgroupLevelLessItsUse) {
  // v2: the job's cgroup 4 GiB with 3 GiB used, 2 GiB of it page cache (3 GiB left), its parent
  // 16 GiB; "max" is no limit.
  write("cgroup", "0::/slurm/job_7/step_0\n");
  write("cg/slurm/job_7/step_0/memory.max", "max\n");
  write("cg/slurm/job_7/memory.max", std::to_string(4ull << 30) + "\n");
  write("cg/slurm/job_7/memory.current", std::to_string(3ull << 30) + "\n");
  write("cg/slurm/job_7/memory.stat", "anon 1073741824\nfile 2147483648\nfile_mapped 0\n");
  write("cg/slurm/memory.max", std::to_string(16ull << 30) + "\n");
  const HostMemory m = host_memory(src_);
  EXPECT_DOUBLE_EQ(m.bytes, 3 * GiB);
  EXPECT_EQ(m.source, "the cgroup's memory limit less its use");
}

TEST_F(FakeHost, CgroupV1MemoryController) {
  write("cgroup", "12:pids:/x\n4:cpu,memory:/job\n");
  write("cg/memory/job/memory.limit_in_bytes", std::to_string(2ull << 30) + "\n");
  write("cg/memory/job/memory.usage_in_bytes", std::to_string(1ull << 30) + "\n");
  write("cg/memory/job/memory.stat", "cache 1\nrss 2\ntotal_cache 536870912\n");  // 0.5 GiB
  write("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");              // v1's "no limit"
  EXPECT_DOUBLE_EQ(host_memory(src_).bytes, 1.5 * GiB);
}

TEST_F(FakeHost, SlurmMemoryPerNodeOrPerCpu) {
  env_["SLURM_MEM_PER_NODE"] = "2048";  // MiB
  EXPECT_DOUBLE_EQ(host_memory(src_).bytes, 2 * GiB);
  EXPECT_EQ(host_memory(src_).source, "Slurm's memory for the job on this node");
  env_.erase("SLURM_MEM_PER_NODE");
  env_["SLURM_MEM_PER_CPU"] = "512", env_["SLURM_CPUS_ON_NODE"] = "3";
  EXPECT_DOUBLE_EQ(host_memory(src_).bytes, 1.5 * GiB);
  env_["SLURM_CPUS_ON_NODE"] = "";  // incomplete: not a figure
  EXPECT_DOUBLE_EQ(host_memory(src_).bytes, 8 * GiB);
}

TEST_F(FakeHost, AddressSpaceLimitBesideTheMemory) {
  EXPECT_EQ(host_memory(src_).address_space, 0);
  address_space_ = 1.5 * GiB;
  const HostMemory m = host_memory(src_);
  EXPECT_DOUBLE_EQ(m.address_space, 1.5 * GiB);
  EXPECT_DOUBLE_EQ(m.bytes, 8 * GiB);  // a per-process limit, not the host's memory
}

TEST_F(FakeHost, NothingReadableIsUnknown) {
  src_.meminfo = (dir_ / "none").string();
  EXPECT_EQ(host_memory(src_).bytes, 0);
}

// tiny under ddp, micro-batch 8 of a global batch of 8, on `ranks` ranks of dp.
RunConfig tiny_ddp(int ranks) {
  RunConfig c;
  c.plugin = "ddp";
  c.model = model_preset("tiny");
  c.mesh.dp = ranks, c.mesh.ranks_per_node = ranks;
  c.train.micro_batch = 8 / ranks, c.train.global_batch = 8;
  return c;
}

double predicted_bytes(const Strategy& s, const RunConfig& c, int rank) {
  const Prediction p = predict(s, PredictInput{c.mesh, c.model, c.train, rank});
  double total = 0;
  for (double b : p.memory_bytes) total += b;
  return total;
}

TEST(MemoryAdmission, RefusesOneByteShortAndSaysWhatFits) {
  const auto ddp = installed_strategy("ddp", {});
  RunConfig c = tiny_ddp(1);
  const double need = predicted_bytes(*ddp, c, 0);
  RunConfig half = c;
  half.train.micro_batch = 4;
  const double need_half = predicted_bytes(*ddp, half, 0);
  ASSERT_LT(need_half, need);
  EXPECT_EQ(memory_admission(c, *ddp, 1, HostMemory{need, "MemAvailable"}), "");
  const std::string refusal = memory_admission(c, *ddp, 1, HostMemory{need - 1, "MemAvailable"});
  EXPECT_NE(refusal.find("memory: the 1 rank(s) of this host need"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("(MemAvailable)"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("--micro-batch 4 would fit"), std::string::npos) << refusal;
  EXPECT_EQ(refusal.find('\n'), std::string::npos);
  // Below what micro-batch 1 needs: the advice, not a micro-batch.
  const std::string none = memory_admission(c, *ddp, 1, HostMemory{1e3, "MemAvailable"});
  EXPECT_NE(none.find("no smaller micro-batch fits"), std::string::npos) << none;
}

TEST(MemoryAdmission, RanksOfTheHostAddUp) {
  const auto ddp = installed_strategy("ddp", {});
  const RunConfig c = tiny_ddp(2);
  const double both = predicted_bytes(*ddp, c, 0) + predicted_bytes(*ddp, c, 1);
  EXPECT_EQ(memory_admission(c, *ddp, 2, HostMemory{both, "MemAvailable"}), "");
  EXPECT_NE(memory_admission(c, *ddp, 2, HostMemory{both - 1, "MemAvailable"}), "");
  // Under a launcher with one of the two ranks here: that rank alone.
  EXPECT_EQ(memory_admission(c, *ddp, 1, HostMemory{both / 2 + 1, "MemAvailable"}), "");
}

// ulimit -v: each rank's memory and the runtime's reserve within it, one byte short refused with
// the limit named; a smaller micro-batch that fits is named as for the host's memory.
TEST(MemoryAdmission, AddressSpaceLimitHoldsEachRankAndItsRuntime) {
  // The runtime's share: 512 MiB and 136 MiB per BLAS thread, at least two (measured).
  EXPECT_DOUBLE_EQ(runtime_address_space(1), 784.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(runtime_address_space(8), 1600.0 * 1024 * 1024);
  const auto ddp = installed_strategy("ddp", {});
  const RunConfig c = tiny_ddp(2);
  const double rank = std::max(predicted_bytes(*ddp, c, 0), predicted_bytes(*ddp, c, 1));
  const double runtime = runtime_address_space(2);
  HostMemory host{1e15, "MemAvailable", rank + runtime, runtime};
  EXPECT_EQ(memory_admission(c, *ddp, 2, host), "");  // per process: the two ranks do not add up
  host.address_space -= 1;
  const std::string refusal = memory_admission(c, *ddp, 2, host);
  EXPECT_NE(refusal.find("of address space"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("each process may map (ulimit -v)"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("--micro-batch 2 would fit"), std::string::npos) << refusal;
  // Below the runtime's reserve alone: nothing fits.
  host.address_space = runtime / 2;
  EXPECT_NE(memory_admission(c, *ddp, 2, host).find("no smaller micro-batch fits"),
            std::string::npos);
}

// A GPU run: each rank's device memory against its GPU's free memory (NVML's figure), which
// --memory-limit replaces; host memory then holds only the offloaded state.
TEST(MemoryAdmission, DeviceMemoryAgainstTheGpusFreeMemory) {
  const auto ddp = installed_strategy("ddp", {});
  RunConfig c = tiny_ddp(1);
  c.device = "cuda", c.train.device = Device::cuda;
  const double need = predicted_bytes(*ddp, c, 0);
  HostMemory host{1, "MemAvailable"};  // nothing offloaded: the host's figure does not matter
  host.device_free = need;
  EXPECT_EQ(memory_admission(c, *ddp, 1, host), "");
  host.device_free = need - 1;
  const std::string refusal = memory_admission(c, *ddp, 1, host);
  EXPECT_NE(refusal.find("of device memory, more than the"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("free on the GPU with the least (NVML)"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("--micro-batch 4 would fit"), std::string::npos) << refusal;
  c.memory_limit = need;  // --memory-limit in its place
  EXPECT_EQ(memory_admission(c, *ddp, 1, host), "");
  c.memory_limit = 0;
  host.device_free = 0;  // unknown (no NVML): nothing to refuse
  EXPECT_EQ(memory_admission(c, *ddp, 1, host), "");
}

TEST(MemoryAdmission, MemoryLimitReplacesTheHostsFigureOnTheCpu) {
  const auto ddp = installed_strategy("ddp", {});
  RunConfig c = tiny_ddp(1);
  const double need = predicted_bytes(*ddp, c, 0);
  c.memory_limit = need - 1;
  const std::string refusal = memory_admission(c, *ddp, 1, HostMemory{1e15, "MemAvailable"});
  EXPECT_NE(refusal.find("(--memory-limit)"), std::string::npos) << refusal;
  c.memory_limit = need;
  EXPECT_EQ(memory_admission(c, *ddp, 1, HostMemory{1, "MemAvailable"}), "");
  // Nothing known about the host, no limit: nothing to refuse.
  c.memory_limit = 0;
  EXPECT_EQ(memory_admission(c, *ddp, 1, HostMemory{}), "");
}

}  // namespace
}  // namespace strata
