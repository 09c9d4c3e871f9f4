// The MFU peak of a rank: its share of the node's peak, and the per-node cache of that peak.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "provenance/node_peak.hpp"
#include "strata/model.hpp"

namespace {

namespace fs = std::filesystem;
using strata::peak_cache_key;
using strata::read_cached_peak;
using strata::write_cached_peak;

// A fresh directory per test, removed afterwards.
class NodePeakCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("strata_node_peak_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    path = (dir / "sub" / "peak_flops.tsv").string();  // the directory is created on write
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
  std::string path;
};

// MFU: the model's FLOPs per token (6N + 12LTh, as PaLM counts) x tokens/s / ranks: gpt2-124m at
// 100k tokens/s over 4 ranks against 100 TFLOP/s per rank; no peak, no MFU.
TEST(NodePeak, MfuIsModelFlopsPerRankOverThePeak) {
  using namespace strata;
  const ModelSpec m = model_preset("gpt2-124m");
  const double per_rank = model_flops_per_rank(1e5, m.flops_per_token(), 4);
  EXPECT_DOUBLE_EQ(per_rank, 1e5 * m.flops_per_token() / 4);
  EXPECT_DOUBLE_EQ(model_flops_utilization(per_rank, 100e12), per_rank / 100e12);
  EXPECT_TRUE(std::isnan(model_flops_utilization(per_rank, 0)));
  EXPECT_TRUE(std::isnan(model_flops_utilization(per_rank, -1)));
}

// A rank's peak is its CPUs' share of the node's: ranks sharing the node's CPUs (no binding) split
// it; a rank bound to fewer CPUs (taskset -c 0, srun --cpu-bind) gets those CPUs' share, never
// more than an even split of the node, nor SLURM_CPUS_PER_TASK's.
TEST(NodePeak, RankShareIsItsCpusShareOfTheNodePeak) {
  using strata::RankCpus, strata::rank_share_of_node_peak, strata::rank_cpu_share;
  auto where = [](int node_cpus, int node_ranks, int mask, int sharing, int cpt = 0) {
    RankCpus w;
    w.node_cpus = node_cpus, w.node_ranks = node_ranks, w.mask_cpus = mask;
    w.ranks_sharing_mask = sharing, w.cpus_per_task = cpt;
    return w;
  };
  // Unbound: every rank's mask is the node's, shared by all its ranks.
  EXPECT_DOUBLE_EQ(rank_share_of_node_peak(400e9, where(4, 4, 4, 4)), 100e9);
  EXPECT_DOUBLE_EQ(rank_share_of_node_peak(400e9, where(4, 1, 4, 1)), 400e9);
  EXPECT_DOUBLE_EQ(rank_share_of_node_peak(300e9, where(2, 3, 2, 3)) * 3, 300e9);
  EXPECT_DOUBLE_EQ(rank_cpu_share(where(2, 4, 2, 4)), 0.5);  // 4 ranks on 2 cores
  // taskset -c 0 on a 2-CPU node, one rank: one CPU's half of the node.
  EXPECT_DOUBLE_EQ(rank_share_of_node_peak(200e9, where(2, 1, 1, 1)), 100e9);
  // srun --cpu-bind=cores, 2 ranks on 8 CPUs with 2 each: a quarter each (not a half).
  EXPECT_DOUBLE_EQ(rank_share_of_node_peak(800e9, where(8, 2, 2, 1)), 200e9);
  // A mask wider than an even split (2 ranks bound to overlapping masks) is capped at the split.
  EXPECT_DOUBLE_EQ(rank_share_of_node_peak(800e9, where(8, 2, 8, 1)), 400e9);
  // SLURM_CPUS_PER_TASK narrows it.
  EXPECT_DOUBLE_EQ(rank_share_of_node_peak(800e9, where(8, 1, 8, 1, 2)), 200e9);
  // Zeros are not divisions.
  EXPECT_DOUBLE_EQ(rank_share_of_node_peak(400e9, where(0, 0, 0, 0)), 400e9);
}

TEST(NodePeak, BusyNodeTakesCpusTimesOneCpuRate) {
  bool busy = true;
  // A quiet node: all-CPU rate near ideal (or a turbo-bound 0.75 of it) is the peak.
  EXPECT_DOUBLE_EQ(strata::node_peak_from_rates(398e9, 200e9, 2, &busy), 398e9);
  EXPECT_FALSE(busy);
  EXPECT_DOUBLE_EQ(strata::node_peak_from_rates(48e9, 1e9, 64, &busy), 48e9);
  EXPECT_FALSE(busy);
  // Another job on one of 2 cores: the 2-thread GEMM runs at one core's pace.
  EXPECT_DOUBLE_EQ(strata::node_peak_from_rates(210e9, 200e9, 2, &busy), 400e9);
  EXPECT_TRUE(busy);
  EXPECT_DOUBLE_EQ(strata::node_peak_from_rates(1e9, 1e9, 1, &busy), 1e9);  // one CPU: itself
  EXPECT_FALSE(busy);
}

TEST(NodePeak, CacheKeyNamesEveryFieldAndNoTab) {
  const std::string k = peak_cache_key("node1", "Xeon\tGold", 48, "fp32", "cblas");
  EXPECT_EQ(k, "node1|Xeon Gold|48 cpus|fp32|cblas");
  EXPECT_NE(k, peak_cache_key("node2", "Xeon Gold", 48, "fp32", "cblas"));
  EXPECT_NE(k, peak_cache_key("node1", "Xeon Gold", 24, "fp32", "cblas"));
  EXPECT_NE(k, peak_cache_key("node1", "Xeon Gold", 48, "bf16", "cblas"));
  EXPECT_NE(k, peak_cache_key("node1", "Xeon Gold", 48, "fp32", "oneDNN 3.0"));
}

TEST_F(NodePeakCache, MissingFileIsAMiss) {
  std::string warnings;
  EXPECT_FALSE(read_cached_peak(path, "k", &warnings));
  EXPECT_EQ(warnings, "");
  EXPECT_FALSE(read_cached_peak("", "k", &warnings));  // no cache configured
}

// STRATA_PEAK_CACHE naming a device: not read for ever, and never replaced by a renamed file.
TEST_F(NodePeakCache, DeviceIsNeitherReadNorWritten) {
  std::string warnings, error;
  EXPECT_FALSE(read_cached_peak("/dev/zero", "k", &warnings));
  EXPECT_EQ(warnings, "strata: warning: peak cache /dev/zero is not a regular file: not used\n");
  EXPECT_FALSE(write_cached_peak("/dev/zero", "k", 1e11, &error));
  EXPECT_EQ(error, "/dev/zero is not a regular file");
  EXPECT_FALSE(std::filesystem::is_regular_file("/dev/zero"));
}

TEST_F(NodePeakCache, WriteReadReplaceRemove) {
  std::string error;
  ASSERT_TRUE(write_cached_peak(path, "a|fp32", 1.25e11, &error)) << error;
  ASSERT_TRUE(write_cached_peak(path, "a|bf16", 3.5e11, &error)) << error;
  std::string warnings;
  EXPECT_EQ(read_cached_peak(path, "a|fp32", &warnings).value_or(0), 1.25e11);
  EXPECT_EQ(read_cached_peak(path, "a|bf16", &warnings).value_or(0), 3.5e11);
  EXPECT_FALSE(read_cached_peak(path, "b|fp32", &warnings));
  // A re-measured value replaces its own line only; the value survives the text round trip.
  ASSERT_TRUE(write_cached_peak(path, "a|fp32", 123456789012.345678, &error)) << error;
  EXPECT_EQ(read_cached_peak(path, "a|fp32", &warnings).value_or(0), 123456789012.345678);
  EXPECT_EQ(read_cached_peak(path, "a|bf16", &warnings).value_or(0), 3.5e11);
  EXPECT_TRUE(strata::remove_cached_peak(path, "a|fp32"));
  EXPECT_FALSE(read_cached_peak(path, "a|fp32", &warnings));
  EXPECT_EQ(read_cached_peak(path, "a|bf16", &warnings).value_or(0), 3.5e11);
  EXPECT_FALSE(strata::remove_cached_peak(path, "a|fp32"));  // already gone
  EXPECT_EQ(warnings, "");
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(text, "a|bf16\t350000000000\n");
}

TEST_F(NodePeakCache, CorruptLinesAreIgnoredWithAWarningEach) {
  fs::create_directories(fs::path(path).parent_path());
  {
    std::ofstream f(path);
    f << "garbage without a tab\n"
      << "k\tnot-a-number\n"
      << "k\t-5\n"
      << "k\t12abc\n"
      << "\t7e10\n"
      << "other\t2e10\n";
  }
  std::string warnings;
  EXPECT_FALSE(read_cached_peak(path, "k", &warnings));
  for (int line = 1; line <= 5; ++line)
    EXPECT_NE(warnings.find("line " + std::to_string(line) + " is not"), std::string::npos)
        << "line " << line << " in: " << warnings;
  EXPECT_EQ(warnings.find("line 6"), std::string::npos) << warnings;
  EXPECT_EQ(read_cached_peak(path, "other", nullptr).value_or(0), 2e10);
  // Writing a key drops the corrupt lines and keeps the valid one.
  std::string error;
  ASSERT_TRUE(write_cached_peak(path, "k", 9e10, &error)) << error;
  warnings.clear();
  EXPECT_EQ(read_cached_peak(path, "k", &warnings).value_or(0), 9e10);
  EXPECT_EQ(read_cached_peak(path, "other", &warnings).value_or(0), 2e10);
  EXPECT_EQ(warnings, "");
}

TEST_F(NodePeakCache, UnwritablePathReportsWhy) {
  std::string error;
  EXPECT_FALSE(write_cached_peak("/proc/strata_no/peak_flops.tsv", "k", 1e9, &error));
  EXPECT_NE(error.find("/proc/strata_no/peak_flops.tsv"), std::string::npos) << error;
}

TEST(NodePeak, CachePathFromTheEnvironment) {
  const char* saved[3] = {std::getenv("STRATA_PEAK_CACHE"), std::getenv("XDG_CACHE_HOME"),
                          std::getenv("HOME")};
  const std::string keep[3] = {saved[0] ? saved[0] : "", saved[1] ? saved[1] : "",
                               saved[2] ? saved[2] : ""};
  ::setenv("HOME", "/home/u", 1);
  ::unsetenv("STRATA_PEAK_CACHE");
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(strata::peak_cache_path(), "/home/u/.cache/strata/peak_flops.tsv");
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(strata::peak_cache_path(), "/xdg/strata/peak_flops.tsv");
  ::setenv("STRATA_PEAK_CACHE", "/tmp/p.tsv", 1);
  EXPECT_EQ(strata::peak_cache_path(), "/tmp/p.tsv");
  ::setenv("STRATA_PEAK_CACHE", "off", 1);
  EXPECT_EQ(strata::peak_cache_path(), "");
  const char* names[3] = {"STRATA_PEAK_CACHE", "XDG_CACHE_HOME", "HOME"};
  for (int i = 0; i < 3; ++i)
    saved[i] ? ::setenv(names[i], keep[i].c_str(), 1) : ::unsetenv(names[i]);
}

}  // namespace
