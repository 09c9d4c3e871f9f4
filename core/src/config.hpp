// RunConfig: every resolved option of a run (CLI > --config FILE > STRATA_* environment > default),
// validated before any rank allocates. Printed at start and stored verbatim in the run file.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "strata/context.hpp"
#include "strata/model.hpp"

namespace strata {

struct RunConfig {
  // What to run
  std::string plugin;
  std::vector<std::string> plugin_opts;
  std::vector<std::string> plugin_paths;
  std::string transport = "mpi";
  std::string device = "cpu";
  // The workload
  ModelSpec model;
  TrainSpec train;
  std::string data_file;  // empty: the synthetic source
  // The mesh. world = nodes * ranks_per_node; dp defaults to world / (tp * pp).
  MeshSpec mesh;
  bool nodes_given = false, ranks_per_node_given = false, mesh_given = false;
  // Harness
  std::string out_dir = "results/local";
  std::string run_id;    // empty: generated
  int blas_threads = 0;  // 0: auto (cores / ranks on this host)
  double watchdog_s = 300;
  double peak_tflops = 0;  // > 0: the peak per rank for MFU instead of the calibrated one
  bool quiet = false;
  bool trace = false;  // --trace: every compute and comm interval into /trace and a JSON timeline
  bool calibrate_comm = false;  // --calibrate-comm: busbw per op, size and group into /calibration
  // Actions instead of a run
  bool list_plugins = false;
  bool list_transports = false;
  bool dry_run = false;
  double memory_limit = 0;  // bytes per rank, 0 = none (--dry-run)
  std::string describe;
  bool help = false;
  std::string help_text;

  std::string command_line;
  // (option, value) pairs of everything above, for printing and for /config.
  std::vector<std::pair<std::string, std::string>> resolved() const;
};

// Parse argv. Throws ConfigError with one line naming the option and what is allowed.
RunConfig parse_cli(int argc, char** argv);

// Checks that need the world size (known from the launcher's environment before MPI starts, or from
// --nodes x --ranks-per-node): mesh shape, batch divisibility. Fills mesh.dp/nodes/ranks_per_node.
void resolve_mesh(RunConfig& config, int world_size, int ranks_per_host);

// "80GiB", "512MiB", "1e9" -> bytes; ConfigError naming `option` otherwise.
double parse_bytes(const std::string& option, const std::string& text);

}  // namespace strata
