// RunConfig: every resolved option of a run (CLI > --config FILE > STRATA_* environment > default),
// validated before any rank allocates. Printed at start and stored verbatim in the run file.
//
// Every option is one row of a table (config_table.cpp): its name, what it accepts, its default
// and help. Each value, from any source, is checked once by its row; the row also yields the values
// it must refuse, which the bad-input suite (tests/unit/test_options.cpp) tries through every
// source, so a new option cannot skip validation or its test.
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
  // Set by the runner (not an option) when a run is given --profile: its predicted step time,
  // stored in /summary beside the measured one (0: none, e.g. "no time model").
  double predicted_step_s = 0;
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

// What a runner option accepts.
enum class OptionKind {
  flag,     // no value on the command line; true/false/yes/no/on/off/1/0 in a file or variable
  integer,  // decimal digits, in [min, max]
  real,     // a finite number, in [min, max] (or (min, max] with min_exclusive)
  size,     // bytes with an optional unit: 80GiB, 512MiB, 1e9; in (0, max]
  choice,   // one of `choices`
  name,     // a file-name-safe word: letters, digits, '.', '_', '+', '-'; not starting with '.'
  text,     // anything non-empty (checked by the option's own rule)
};

struct RunnerOption {
  std::string name;  // the long name, without "--"
  std::string section;
  OptionKind kind;
  std::string default_value;  // empty: none
  std::string help;
  double min = 0, max = 0;
  bool min_exclusive = false;
  std::vector<std::string> choices;
  bool repeatable = false;
  std::vector<std::string> also_invalid;  // refused values beyond those the kind implies
  // "an integer in 1..4096": the allowed values, as error messages and the help say them.
  std::string accepts() const;
  // Values this option must refuse (from its kind and range, plus also_invalid).
  std::vector<std::string> invalid_examples() const;
  // A value this option accepts.
  std::string valid_example() const;
};

// Every runner option, in help order.
const std::vector<RunnerOption>& runner_options();
// Whether STRATA_<OPTION> sets the option: every option but help and version (requests, not
// settings; a site's module may well set STRATA_VERSION=0.1). STRATA_CONFIG names a config file.
bool option_from_environment(const std::string& name);

// Parse argv, then --config FILE (or STRATA_CONFIG), then STRATA_<OPTION> variables of the
// environment. Throws ConfigError with one line naming the option, where its value came from and
// what is allowed.
RunConfig parse_cli(int argc, char** argv);

// Checks that need the world size (known from the launcher's environment before MPI starts, or from
// --nodes x --ranks-per-node): mesh shape, batch divisibility. Fills mesh.dp/nodes/ranks_per_node.
void resolve_mesh(RunConfig& config, int world_size, int ranks_per_host);

// A run id names a file inside --out: letters, digits, '.', '_', '+', '-', at most 128, not
// starting with '.'. ConfigError naming `source` otherwise.
void check_run_id(const std::string& source, const std::string& run_id);

}  // namespace strata
