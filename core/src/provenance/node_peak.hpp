// The peak FLOP/s that MFU divides by, per rank, and where it came from.
//
// On the CPU the peak belongs to the node, not to a process: one rank per node (local rank 0)
// measures the node's GEMM rate in the run's precision on all of the node's CPUs while the node's
// other ranks sleep, the value is cached per node (host, CPU model, CPUs, precision, GEMM library)
// so later runs reuse it, and each rank's peak is its share of the node's CPUs times the node's
// peak per CPU: the CPUs of its affinity mask split among the ranks sharing that mask, at most
// the node's CPUs split among the node's ranks (and SLURM_CPUS_PER_TASK). Ranks that share cores
// therefore split one stable figure instead of each measuring the contended rate, their MFUs add
// up to at most the node's, and a rank confined to fewer CPUs (taskset, srun --cpu-bind) is
// measured against those.
#pragma once

#include <optional>
#include <string>

namespace strata {

struct RunConfig;

struct PeakFlops {
  double per_rank = 0;  // the MFU denominator of this rank (0: none, no MFU)
  double node = 0;      // the whole node's (CPU) or device's (GPU) peak
  int node_ranks = 1;   // ranks sharing the node (CPU) or 1 (GPU: one device per rank)
  std::string source;   // measured | cache | table | option | none
  std::string detail;   // one line for the summary and the run file: what, how, where cached
};

// MFU, defined once: the model's FLOPs per second per rank (tokens/s x the model's FLOPs per token
// / ranks) over one rank's peak FLOP/s; NaN without a peak (<= 0). The run's summary, the peak's
// recheck after the steps and the step-time predictor all read it from here.
double model_flops_per_rank(double tokens_per_s, double flops_per_token, int ranks);
double model_flops_utilization(double flops_per_rank, double peak_per_rank);

// Where a rank may run: the node's CPUs and ranks, the CPUs of the rank's affinity mask and the
// node's ranks bound to that same mask, SLURM_CPUS_PER_TASK (0: not set).
struct RankCpus {
  int node_cpus = 1, node_ranks = 1, mask_cpus = 1, ranks_sharing_mask = 1, cpus_per_task = 0;
};
// The CPUs a rank computes on (fractional when ranks share cores): mask CPUs / ranks sharing the
// mask, at most node CPUs / node ranks and cpus_per_task.
double rank_cpu_share(const RankCpus& where);
// A rank's share of its node's peak: node_peak x rank_cpu_share / node CPUs.
double rank_share_of_node_peak(double node_peak, const RankCpus& where);

// The node's peak from its GEMM rate on all its CPUs and on one. On a busy node (other work holding
// some cores) the all-CPU GEMM runs at the pace of its slowest thread while one thread still finds
// a free core; GEMM threads created while the process was bound to one core (mpirun --bind-to
// core) stay there. All-CPU scaling below kMinNodeScaling of ideal sets *busy and takes cpus x the
// one-CPU rate instead. A quiet node scales above it (OpenBLAS SGEMM: 1.99 on
// 2 CPUs here; all-core turbo clocks stay within ~1/0.7 of one core's).
constexpr double kMinNodeScaling = 0.7;
double node_peak_from_rates(double all_cpus_rate, double one_cpu_rate, int cpus, bool* busy);

// The cache: one text file, one "key<TAB>FLOP/s" line per node configuration.
// peak_cache_path(): $STRATA_PEAK_CACHE if set ("off": no cache), else
// $XDG_CACHE_HOME/strata/peak_flops.tsv, else $HOME/.cache/strata/peak_flops.tsv ("" when none).
std::string peak_cache_path();
std::string peak_cache_key(const std::string& host, const std::string& cpu_model, int cpus,
                           const std::string& precision, const std::string& gemm_library);
// The cached FLOP/s for `key`, if a valid line holds it. Malformed lines (not "key<TAB>positive
// number") are ignored; each one found appends a line to *warnings.
std::optional<double> read_cached_peak(const std::string& path, const std::string& key,
                                       std::string* warnings);
// Replaces (or adds) the line of `key`, keeping the valid lines of other keys; written to a
// temporary file and renamed, so that concurrent runs never read half a file. False (and
// *error) if it could not be written.
bool write_cached_peak(const std::string& path, const std::string& key, double flops,
                       std::string* error);
bool remove_cached_peak(const std::string& path, const std::string& key);

// Collective over the world (every rank calls it once, before training): this rank's peak.
// --peak-tflops wins (source option); on a GPU the device table (table, or none for a GPU not in
// it); on the CPU the node's peak from the cache or measured (STRATA_PEAK_REMEASURE=1 measures
// even when cached, and rewrites the cache).
PeakFlops resolve_peak_flops(const RunConfig& config);

// Collective over the world, after the steps, when a rank's MFU (mfu_max, the highest over the
// world) came out above 1 against a measured or cached node peak: that peak was too low (measured
// while something else ran on the node). The node is measured again, twice as long, the larger of
// the two kept (and cached); source measured, detail saying why.
PeakFlops remeasure_node_peak(const RunConfig& config, const PeakFlops& too_low, double mfu_max);

// After a run whose MFU stayed above 1 even against the re-measured peak: drops this node's cache
// entry so that the next run measures again. Rank 0 only.
void forget_node_peak(const RunConfig& config);

}  // namespace strata
