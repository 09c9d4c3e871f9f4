// Memory admission (core/src/memory_admission.hpp): the host's memory from fake /proc and cgroup
// files and Slurm's variables, and the check against the real ddp plugin's predict().
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "installed_plugins.hpp"
#include "memory_admission.hpp"

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
  }
  void write(const fs::path& rel, const std::string& text) {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  fs::path dir_;
  HostMemorySources src_;
  std::map<std::string, std::string> env_;
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
  const Prediction p = s.predict(PredictInput{c.mesh, c.model, c.train, rank});
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
