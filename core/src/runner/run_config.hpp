// RunConfig: every resolved option of a run (CLI > --config FILE > STRATA_* environment > default),
// validated before any rank allocates (config.hpp parses it; config_table.hpp's rows fill it).
// Printed at start and stored verbatim in the run file.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/kernels.hpp"
#include "results/run_record.hpp"
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
  Device device_kind() const { return train.device; }  // `device` as a Device
  std::string attention = "auto";                      // --attention: auto, own or reference
  // What --attention resolves to: own where it was asked for, or with auto on --device cuda in a
  // --precision bf16 run whose head size the tensor-core kernel takes; else reference.
  AttentionKernel attention_kernel() const;
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
  int blas_threads = 0;  // 0: auto (affinity mask / ranks sharing it, launch.hpp)
  double watchdog_s = 300;
  double peak_tflops = 0;  // > 0: the peak per rank for MFU instead of the calibrated one
  double max_cv = 0.1;     // --max-cv: a larger CV of the timed steps marks the run unstable
  double target_ci = 0;    // --target-ci: stop once the median step's 95% interval is within it
  bool quiet = false;
  int log_interval = 1;  // --log-interval: a progress line every this many steps
  bool trace = false;    // --trace: every compute and comm interval into /trace and a JSON timeline
  bool calibrate_comm = false;  // --calibrate-comm: busbw per op, size and group into /calibration
  // --profile FILE: a machine profile (predict/profile.hpp) that --dry-run predicts step time
  // from; with --calibrate, the profile to create or merge into.
  std::string profile;
  // Set by the runner (not an option) when a run is given --profile: its predicted step time and
  // the replay's bubble in it (the mean stage's idle time, transfers included), stored in /summary
  // beside the measured ones (0: none, e.g. "no time model").
  double predicted_step_s = 0, predicted_bubble_s = 0;
  // Actions instead of a run
  bool list_plugins = false;
  bool list_transports = false;
  bool dry_run = false;
  bool calibrate = false;  // --calibrate: measure this allocation into --profile instead of a run
  std::vector<std::string> calibrate_from;  // --calibrate-from RUN.h5: comm samples from run files
  double memory_limit = 0;                  // bytes per rank, 0 = none (memory_admission.hpp)
  bool skip_memory_check = false;           // run even when the memory admission refuses
  bool overwrite = false;                   // replace an existing run file of the same id
  bool advise = false;                      // --advise: rank configurations (predict/advisor.hpp)
  std::vector<int> advise_micro_batches = {1, 2, 4, 8};
  int advise_top = 10;
  std::string describe;
  bool help = false;
  bool version = false;  // --version
  std::string help_text;

  std::string command_line;
  // (option, value) pairs of everything above, for printing and for /config; `types` (when
  // given) receives how /config stores each value.
  std::vector<std::pair<std::string, std::string>> resolved(
      std::map<std::string, ConfigType>* types = nullptr) const;
};

}  // namespace strata
