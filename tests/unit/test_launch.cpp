// Threads per rank (launch.hpp): from the process's affinity mask, the ranks sharing it and
// SLURM_CPUS_PER_TASK, unless --blas-threads or OPENBLAS_NUM_THREADS say otherwise. The job-end
// note a rank leaves its supervising runner (comm/job_end_note.hpp).
#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "comm/job_end_note.hpp"
#include "runner/launch.hpp"
#include "scoped_env.hpp"

using namespace strata;

namespace {

// This thread bound to `cpus` for one scope (the mask is per thread; the main thread's is the
// process's as sched_getaffinity(0) reads it).
struct ScopedMask {
  cpu_set_t saved;
  explicit ScopedMask(const cpu_set_t& mask) {
    sched_getaffinity(0, sizeof saved, &saved);
    sched_setaffinity(0, sizeof mask, &mask);
  }
  ~ScopedMask() { sched_setaffinity(0, sizeof saved, &saved); }
};

cpu_set_t first_cpu_of_mask() {
  cpu_set_t all, one;
  sched_getaffinity(0, sizeof all, &all);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  return one;
}

}  // namespace

TEST(ThreadsPerRank, MaskSplitAmongItsRanksCappedBySlurm) {
  EXPECT_EQ(auto_blas_threads(1, 1, 0), 1);
  EXPECT_EQ(auto_blas_threads(2, 2, 0), 1);     // mpirun --bind-to none, 2 ranks on 2 CPUs
  EXPECT_EQ(auto_blas_threads(128, 4, 0), 32);  // 4 unbound ranks on a 128-CPU node
  EXPECT_EQ(auto_blas_threads(32, 1, 0), 32);   // srun --cpus-per-task=32 --cpu-bind=cores
  EXPECT_EQ(auto_blas_threads(128, 4, 8), 8);   // SLURM_CPUS_PER_TASK=8 without binding
  EXPECT_EQ(auto_blas_threads(4, 1, 16), 4);    // the mask is smaller than the cap
  EXPECT_EQ(auto_blas_threads(2, 8, 0), 1);     // oversubscribed: one thread, not zero
  EXPECT_EQ(auto_blas_threads(6, 4, 0), 1);     // rounded down: no more threads than CPUs
}

TEST(ThreadsPerRank, AffinityMaskIsRead) {
  const int cpus = affinity_cpus();
  ASSERT_GE(cpus, 1);
  const auto all = affinity_fingerprint();
  {
    ScopedMask one(first_cpu_of_mask());  // as under `taskset -c 0`
    EXPECT_EQ(affinity_cpus(), 1);
    if (cpus > 1) EXPECT_NE(affinity_fingerprint(), all);
    ScopedEnv no_openblas("OPENBLAS_NUM_THREADS", nullptr),
        no_slurm("SLURM_CPUS_PER_TASK", nullptr);
    RunConfig auto_threads;
    std::string origin;
    EXPECT_EQ(blas_threads_for(auto_threads, 1, &origin), 1);
    EXPECT_EQ(origin, "auto: 1 CPU(s) in the affinity mask / 1 rank(s) sharing it");
  }
  EXPECT_EQ(affinity_cpus(), cpus);
  EXPECT_EQ(affinity_fingerprint(), all);  // the same mask, the same fingerprint
}

TEST(ThreadsPerRank, OptionThenEnvironmentThenAuto) {
  ScopedEnv no_slurm("SLURM_CPUS_PER_TASK", nullptr);
  RunConfig given;
  given.blas_threads = 3;
  std::string origin;
  {
    ScopedEnv openblas("OPENBLAS_NUM_THREADS", "5");
    EXPECT_EQ(blas_threads_for(given, 1, &origin), 3);
    EXPECT_EQ(origin, "--blas-threads");
    EXPECT_EQ(blas_threads_for(RunConfig{}, 1, &origin), 5);
    EXPECT_EQ(origin, "OPENBLAS_NUM_THREADS");
  }
  ScopedEnv no_openblas("OPENBLAS_NUM_THREADS", nullptr);
  EXPECT_EQ(blas_threads_for(RunConfig{}, 1, &origin), affinity_cpus());
  {
    ScopedEnv slurm("SLURM_CPUS_PER_TASK", "1");
    EXPECT_EQ(blas_threads_for(RunConfig{}, 1, &origin), 1);
    EXPECT_NE(origin.find("SLURM_CPUS_PER_TASK 1"), std::string::npos) << origin;
  }
  EXPECT_EQ(blas_threads_for(RunConfig{}, 1 << 20, &origin), 1);
}

// STRATA_MPIRUN_ARGS split as a shell would: `-x FOO="a b"` is two words, not three (the audit's
// `b"` that mpirun then tried to run).
TEST(ShellWords, QuotesAndEscapesAsAShell) {
  using V = std::vector<std::string>;
  EXPECT_EQ(shell_words("-x FOO=\"a b\"", "V"), (V{"-x", "FOO=a b"}));
  EXPECT_EQ(shell_words("  'a b'\tc\\ d \"e\\\"f\\$\" g'h'i ''", "V"),
            (V{"a b", "c d", "e\"f$", "ghi", ""}));
  EXPECT_EQ(shell_words("\"a\\nb\" 'c\\d'", "V"), (V{"a\\nb", "c\\d"}));
  EXPECT_EQ(shell_words(" \t ", "V"), V{});
  auto refusal = [](const std::string& text) {
    try {
      shell_words(text, "STRATA_MPIRUN_ARGS");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal("-x FOO=\"a b"),
            "STRATA_MPIRUN_ARGS=-x FOO=\"a b: an unbalanced \" (split as a shell would)");
  EXPECT_EQ(refusal("it's"), "STRATA_MPIRUN_ARGS=it's: an unbalanced ' (split as a shell would)");
  EXPECT_EQ(refusal("a\\"),
            "STRATA_MPIRUN_ARGS=a\\: a backslash at the end (split as a shell would)");
}

// The first process to end the job names its code; a later one (the main thread's error after the
// watchdog's cancel, another rank) leaves it. Without a supervisor's variable, or with its folder
// gone, nothing is written and the caller ends the job through the launcher.
TEST(JobEndNote, FirstCodeStaysAndNoneWithoutASupervisor) {
  char dir[] = "/tmp/strata-note-test.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/end";
  {
    ScopedEnv none(kJobEndNoteVariable, nullptr);
    EXPECT_FALSE(write_job_end_note(3));
    EXPECT_FALSE(read_job_end_note(path).has_value());
  }
  {
    ScopedEnv note(kJobEndNoteVariable, path.c_str());
    EXPECT_TRUE(write_job_end_note(130));
    EXPECT_TRUE(write_job_end_note(3));
    EXPECT_EQ(read_job_end_note(path), 130);
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir)) ++files;
    EXPECT_EQ(files, 1u) << "a private name left beside the note";
  }
  std::filesystem::remove_all(dir);
  {
    ScopedEnv gone(kJobEndNoteVariable, path.c_str());
    EXPECT_FALSE(write_job_end_note(6));
  }
}
