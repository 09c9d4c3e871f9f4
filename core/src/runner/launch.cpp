#include "runner/launch.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "runner/supervisor.hpp"
#include "strata/types.hpp"

namespace strata {

static int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  return std::atoi(v);
}

LaunchEnv detect_launch_env() {
  LaunchEnv e;
  e.in_slurm_allocation = std::getenv("SLURM_JOB_ID") != nullptr;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    e.under_launcher = true;
    e.world = env_int("OMPI_COMM_WORLD_SIZE", 1);
    e.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    e.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 0);
  } else if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK") ||
             (std::getenv("SLURM_PROCID") && std::getenv("SLURM_STEP_ID"))) {
    e.under_launcher = true;
    e.world = env_int("SLURM_STEP_NUM_TASKS", env_int("PMI_SIZE", env_int("SLURM_NTASKS", 1)));
    e.rank = env_int("SLURM_PROCID", env_int("PMIX_RANK", env_int("PMI_RANK", 0)));
    e.local_size = env_int("SLURM_STEP_TASKS_PER_NODE", env_int("MPI_LOCALNRANKS", 0));
  }
  return e;
}

int affinity_cpus() {
  cpu_set_t mask;
  if (::sched_getaffinity(0, sizeof mask, &mask) == 0) return std::max(1, CPU_COUNT(&mask));
  return std::max(1, int(std::thread::hardware_concurrency()));
}

std::uint64_t affinity_fingerprint() {
  cpu_set_t mask;
  if (::sched_getaffinity(0, sizeof mask, &mask) != 0) return 0;
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the CPU numbers in the mask
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mask)) h = (h ^ std::uint64_t(cpu + 1)) * 1099511628211ull;
  return h;
}

int slurm_cpus_per_task() { return env_int("SLURM_CPUS_PER_TASK", 0); }

int auto_blas_threads(int mask_cpus, int ranks_sharing_mask, int slurm_cpus_per_task) {
  int threads = std::max(1, mask_cpus / std::max(1, ranks_sharing_mask));
  if (slurm_cpus_per_task > 0) threads = std::min(threads, slurm_cpus_per_task);
  return threads;
}

int blas_threads_for(const RunConfig& config, int ranks_sharing_mask, std::string* origin) {
  auto say = [&](const std::string& why) {
    if (origin) *origin = why;
  };
  if (config.blas_threads > 0) {
    say("--blas-threads");
    return config.blas_threads;
  }
  if (int from_env = env_int("OPENBLAS_NUM_THREADS", 0); from_env > 0) {
    say("OPENBLAS_NUM_THREADS");
    return from_env;
  }
  const int cpus = affinity_cpus(), slurm = slurm_cpus_per_task();
  say("auto: " + std::to_string(cpus) + " CPU(s) in the affinity mask / " +
      std::to_string(std::max(1, ranks_sharing_mask)) + " rank(s) sharing it" +
      (slurm > 0 ? ", SLURM_CPUS_PER_TASK " + std::to_string(slurm) : ""));
  return auto_blas_threads(cpus, ranks_sharing_mask, slurm);
}

static std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  for (std::string dir; std::getline(ss, dir, ':');) {
    std::filesystem::path p = std::filesystem::path(dir) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

void check_local_world(const RunConfig& config, int world) {
  if (std::getenv("SLURM_JOB_ID") && !find_in_path("srun").empty()) return;  // srun places ranks
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  if (world > 16 * cores)
    throw ConfigError("--nodes " + std::to_string(config.mesh.nodes) + " x --ranks-per-node " +
                      std::to_string(config.mesh.ranks_per_node) + " = " + std::to_string(world) +
                      " ranks on this host: more than 16 per core (" + std::to_string(cores) +
                      " cores); run them under your cluster's launcher");
  // Descriptors: mpirun keeps about 25 + 3 per rank here (pipes and sockets for each; measured
  // 2026-11-29: 31 for 2 ranks, 73 for 16), a rank about 17 and one per peer. Below that mpirun
  // fails to start a rank and waits for it for ever. The soft limit is raised toward the hard one.
  const rlim_t need = rlim_t(32 + 4 * world);
  struct rlimit files {};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
      files.rlim_cur < need) {
    files.rlim_cur = files.rlim_max == RLIM_INFINITY ? need : std::min(files.rlim_max, need);
    ::setrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur < need)
      throw ConfigError("--nodes " + std::to_string(config.mesh.nodes) + " x --ranks-per-node " +
                        std::to_string(config.mesh.ranks_per_node) + " = " + std::to_string(world) +
                        " ranks on this host need about " + std::to_string(need) +
                        " open files, more than the hard limit of " +
                        std::to_string(files.rlim_max) +
                        " (ulimit -Hn); raise it or use fewer "
                        "ranks");
  }
}

std::vector<std::string> shell_words(const std::string& text, const std::string& what) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;  // ' or " while inside quotes
  auto refuse = [&](const std::string& why) {
    throw ConfigError(what + "=" + text + ": " + why + " (split as a shell would)");
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quote == '\'') {
      if (ch == '\'')
        quote = 0;
      else
        word += ch;
    } else if (quote == '"') {
      if (ch == '"')
        quote = 0;
      else if (ch == '\\' && i + 1 < text.size() && std::strchr("\"\\$`", text[i + 1]))
        word += text[++i];
      else
        word += ch;
    } else if (ch == ' ' || ch == '\t' || ch == '\n') {
      if (in_word) words.push_back(word), word.clear(), in_word = false;
    } else {
      in_word = true;
      if (ch == '\'' || ch == '"')
        quote = ch;
      else if (ch != '\\')
        word += ch;
      else if (i + 1 < text.size())
        word += text[++i];
      else
        refuse("a backslash at the end");
    }
  }
  if (quote) refuse(std::string("an unbalanced ") + quote);
  if (in_word) words.push_back(word);
  return words;
}

// A folder of this job's own for mpirun's session directory and Open MPI's shared-memory
// segments, so that the supervisor may end mpirun before its clean-up (supervisor.hpp) and still
// leave nothing behind: in /dev/shm, where the segments are by default. None (Open MPI's own
// places, and mpirun's own end) where /dev/shm is not writable or the user chose either place.
static std::string private_job_dir(const char* extra_args) {
  for (const std::string name : {"orte_tmpdir_base", "btl_vader_backing_directory"})
    if (std::getenv(("OMPI_MCA_" + name).c_str()) ||
        (extra_args && std::strstr(extra_args, name.c_str())))
      return "";
  std::string dir = "/dev/shm/strata-job." + std::to_string(::getpid()) + ".XXXXXX";
  return ::mkdtemp(dir.data()) ? dir : "";
}

int relaunch(const RunConfig& config, int world, int argc, char** argv) {
  std::vector<std::string> cmd;
  std::string job_dir;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const int cores = int(std::thread::hardware_concurrency());
  if (config.mesh.nodes * config.mesh.ranks_per_node != world)
    throw Error("internal: relaunch world mismatch");
  if (std::getenv("SLURM_JOB_ID") && !find_in_path("srun").empty()) {
    // No thread count exported: each rank reads its own mask (srun's binding) and
    // SLURM_CPUS_PER_TASK; this batch step's mask is only the first node's.
    cmd = {"srun",
           "--mpi=pmix",
           "--nodes=" + std::to_string(config.mesh.nodes),
           "--ntasks=" + std::to_string(world),
           "--ntasks-per-node=" + std::to_string(config.mesh.ranks_per_node),
           "--export=ALL"};
  } else {
    std::string mpirun = std::getenv("STRATA_MPIRUN") ? std::getenv("STRATA_MPIRUN") : "mpirun";
    if (find_in_path(mpirun).empty() && !std::filesystem::exists(mpirun))
      throw Error(
          "cannot re-launch on " + std::to_string(world) + " ranks: " + mpirun +
              " not found on PATH",
          "install Open MPI (apt-get install openmpi-bin) or start runner under your launcher");
    const int threads = blas_threads_for(config, world);  // every rank unbound: this mask shared
    cmd = {mpirun, "-np", std::to_string(world), "--bind-to", "none",
           // Open MPI's UCX layer here needs these to use shared memory/loopback between ranks.
           "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any",
           // When a rank dies or mpirun is signalled, it sends SIGTERM after this many seconds and
           // SIGKILL as many later (default 1 s each): time for rank 0 to hear the others and write
           // the run file.
           "--mca", "odls_base_sigkill_timeout", "3", "-x",
           "OPENBLAS_NUM_THREADS=" + std::to_string(threads)};
    if (world > cores) cmd.push_back("--oversubscribe");
    if (::geteuid() == 0) {
      cmd.push_back("--allow-run-as-root");
      ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
      ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    const char* extra = std::getenv("STRATA_MPIRUN_ARGS");
    if (extra)
      for (std::string& a : shell_words(extra, "STRATA_MPIRUN_ARGS")) cmd.push_back(std::move(a));
    job_dir = private_job_dir(extra);
    if (!job_dir.empty())
      cmd.insert(cmd.end(), {"--mca", "orte_tmpdir_base", job_dir, "--mca",
                             "btl_vader_backing_directory", job_dir});
  }
  cmd.push_back(self);
  for (int i = 1; i < argc; ++i) cmd.push_back(argv[i]);

  std::string line;
  for (const auto& a : cmd) line += (line.empty() ? "" : " ") + a;
  std::fprintf(stderr, "strata: launching %s\n", line.c_str());
  return run_supervised(cmd, Supervision{.direct_to_ranks = cmd[0] != "srun", .job_dir = job_dir});
}

}  // namespace strata
