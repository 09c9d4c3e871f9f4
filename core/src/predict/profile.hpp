// A machine profile (schema strata-profile/1, docs/predict.md "Predicting step time"): what one
// node type computes and communicates, measured by `runner --calibrate` or taken from run files, so
// that a step time can be predicted for configurations that never ran (predictor.hpp).
//
// Compute: seconds of one unit pass (forward, backward, recompute) for one micro-batch, per model
// shape, micro-batch size, device, precision, threads per rank and ranks sharing the node; the
// optimizer in seconds per parameter updated. Comm: per op and group shape (ranks, ranks per
// node), an alpha-beta fit time(bytes) = alpha + bytes / beta from measured (bytes, time) points.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "results/run_record.hpp"
#include "strata/model.hpp"

namespace strata {

inline constexpr const char* kProfileSchema = "strata-profile/1";

// One calibrated compute configuration. Times are medians, s per micro-batch of `micro_batch`
// sequences of model.seq tokens; block_* are per block (all blocks of one shape cost the same).
struct ComputeEntry {
  ModelSpec model;
  int micro_batch = 1;
  std::string device = "cpu";
  std::string precision = "fp32";  // fp32 | bf16 (the param dtype)
  int threads = 1;                 // BLAS threads per rank
  int ranks_per_node = 1;          // ranks computing at once on the host (virtual nodes: all)
  // 1: the whole model's passes; > 1: a tp rank's own (StageModel split over tp ranks, its tp
  // all-reduces included), so a tp run's passes need not be taken as 1/tp of the whole's.
  int tp = 1;
  double embedding_forward_s = 0, embedding_backward_s = 0;
  double block_forward_s = 0, block_backward_s = 0;
  double head_forward_s = 0, head_backward_s = 0;
  // Extra backward time per block under --recompute full / selective (recomputing the forward).
  double block_recompute_full_s = 0, block_recompute_selective_s = 0;
  double optimizer_s_per_param = 0;  // AdamW (with the norm), s per element updated
  // A new buffer allocated and written once (page faults included), s per byte: what the sharded
  // engine pays per group and micro-batch for its gathered parameters and gradient buffers.
  double fresh_memory_s_per_byte = 0;
  // A copy between buffers that stay (offload's device<->host transfers), s per byte copied; 0:
  // not measured (files before it; profiles from runs), so offload has no time model.
  double copy_s_per_byte = 0;
  // How far apart runner --calibrate's rounds measured one micro-batch's passes (all units,
  // forward and backward): (max - min) / median; 0: not measured (profiles from runs, files
  // before it). A study's second calibration that moved more than this is flagged.
  double pass_spread = 0;
};

// Seconds of one micro-batch's passes through every unit, forward and backward (no recompute).
double pass_seconds(const ComputeEntry& e);

// The median of each timed field (timed_fields) over entries of one configuration, the others
// from the first: one slow measurement on a busy machine does not move it.
ComputeEntry median_entry(const std::vector<ComputeEntry>& entries);

// Forward FLOPs of one token through a unit, as ModelSpec::flops_per_token counts them (a block's
// GEMMs 24 h^2 and its attention 4 h T; the LM head 2 h V); the embedding's lookup as h.
struct UnitFlops {
  double embedding, block, attention, head;
  explicit UnitFlops(const ModelSpec& m)
      : embedding(m.hidden),
        block(24.0 * m.hidden * m.hidden + 4.0 * m.hidden * m.seq),
        attention(4.0 * m.hidden * m.seq),
        head(2.0 * m.hidden * m.vocab) {}
};

// Every timed field of an entry (passes, recompute, optimizer, new buffers, copies), for the
// operations over all of them: the max over ranks, the median over runs.
std::array<double*, 11> timed_fields(ComputeEntry& e);

// Sets an entry's six unit passes from the whole model's forward and backward of one micro-batch
// (seconds), split over the units in proportion to their forward FLOPs (UnitFlops).
void split_passes_by_flops(ComputeEntry& e, const ModelSpec& model, double forward_s,
                           double backward_s);

// One measured comm point: group shape, op, nccl-tests bytes, median time of the slowest rank.
struct CommSample {
  std::string op;  // all_reduce | reduce_scatter | all_gather
  int ranks = 0, ranks_per_node = 0;
  double bytes = 0, time_s = 0;
  // Ranks computing on the measuring host (0: unknown). Virtual nodes put every rank on one
  // machine: a 2-rank group measured there among 4 ranks is slower than on 2 alone, so the two
  // are kept apart.
  int host_ranks = 0;
};

// Whether two samples measure one point: op, group shape, ranks on the host and bytes.
bool same_point(const CommSample& a, const CommSample& b);

// time(bytes) = alpha_s + bytes / beta, for `op` on groups of `ranks` ranks, `ranks_per_node` of
// them on each node (ranks_per_node == ranks: inside one node; 1: one rank per node).
struct CommFit {
  std::string op;
  int ranks = 0, ranks_per_node = 0;
  double alpha_s = 0;
  double beta_bytes_per_s = 0;  // algbw for large messages (bytes / s)
  int points = 0;
  double max_rel_error = 0;  // largest |fit - measured| / measured over its points
  int host_ranks = 0;        // of its samples (CommSample::host_ranks)
  double time_s(double bytes) const { return alpha_s + bytes / beta_bytes_per_s; }
};

// FLOPs of a linear layer's pass on m rows, n outputs, k inputs: forward 2mnk, backward (d(in)
// and d(W)) 4mnk.
inline double linear_flops(const std::string& pass, double m, double n, double k) {
  return (pass == "forward" ? 2.0 : 4.0) * m * n * k;
}

// One GEMM of runner --calibrate's sweep: a linear layer's forward, out[m,n] = in[m,k] W[n,k]^T,
// or its backward (d(in) and d(W) together), through the kernels the model passes call; the
// median over the rounds of the slowest rank's seconds. Its conditions (device, precision, BLAS
// threads, ranks computing on the host) are those of the compute entry measured with it.
struct GemmSample {
  std::string device = "cpu";
  std::string precision = "fp32";
  int threads = 1, ranks_per_node = 1;
  std::string pass = "forward";  // forward | backward
  int m = 0, n = 0, k = 0;
  double time_s = 0;
  double flops() const { return linear_flops(pass, m, n, k); }
};

// Whether two samples measure one GEMM under one set of conditions.
bool same_gemm(const GemmSample& a, const GemmSample& b);

// A published profile's GEMM time by shape, a model with its assumptions stated (gemm_model.cpp):
// output tiles of tile x tile elements run in waves over the device's SMs, each wave taking one
// full tile's FLOPs at one SM's share of flops_per_s (partial tiles and a last partial wave cost a
// whole one: tile and wave quantization), unless moving the operands and the result once at
// bytes_per_s takes longer (a roofline of arithmetic intensity against HBM bandwidth).
struct GemmRoofline {
  double flops_per_s = 0;  // one device's achieved dense rate (peak x gemm_efficiency); 0: none
  double bytes_per_s = 0;  // its achieved memory bandwidth (HBM x memory_efficiency)
  int sms = 0;             // streaming multiprocessors
  int tile = 128;          // output tile edge (cuBLAS's and CUTLASS's common 128 x 128)
  double element_bytes = 2;
  // Seconds of a linear layer's forward out[m,n] = in[m,k] W[n,k]^T, or of its backward (the two
  // GEMMs d(in)[m,k] and d(W)[n,k]).
  double seconds(const std::string& pass, int m, int n, int k) const;
};

struct MachineProfile {
  std::string source = "measured";  // measured | published | synthetic
  std::string description;          // what machine, how made
  std::string created_utc;
  std::string host;
  double node_peak_flops = 0;  // the node's peak FLOP/s (node_peak.hpp), 0: unknown (no MFU)
  std::vector<ComputeEntry> compute;
  std::vector<CommSample> samples;
  std::vector<CommFit> comm;  // fit_comm(samples), plus fits given directly (published figures)
  // runner --calibrate's GEMM sweep (empty: files before it, profiles from runs): what lets a
  // measured entry answer for another model shape (find_compute, gemm_model.hpp).
  std::vector<GemmSample> gemms;
  GemmRoofline roofline;  // published profiles with the device's SM count (flops_per_s > 0)
};

// Whether two entries describe one configuration (shape, micro-batch, device, precision, threads,
// ranks per node): a merge replaces the one by the other.
bool same_configuration(const ComputeEntry& a, const ComputeEntry& b);

// Least-squares alpha-beta fit of (bytes, time) points of one op and group shape, weighted by
// 1 / time^2 (relative errors), after dropping points slower than a larger size (a descheduled
// rank). alpha is kept >= 0 (a negative intercept refits through the origin). Throws Error
// without points.
CommFit fit_alpha_beta(const std::vector<CommSample>& points);
// Replaces the fits of every (op, ranks, ranks_per_node) that has samples by a fit of them.
void refit_comm(MachineProfile& profile);

// Adds samples, GEMMs and compute entries of `more` to `profile`; an entry for the same
// configuration (or a sample for the same op, shape and bytes; a GEMM of the same shape and
// conditions) replaces the old one. Then refits.
void merge_profile(MachineProfile& profile, const MachineProfile& more);

// Comm samples from a run file's /calibration (--calibrate-comm), with the group shape taken from
// the run's mesh (its /config: nodes, ranks_per_node, mesh).
std::vector<CommSample> samples_from_run(const RunRecord& run);

// The compute entry for this configuration: same model shape, device and precision; then the
// same tp (else a tp 1 entry), the closest threads, ranks per node and micro-batch (`*how` says
// what differed, "" for exact). Another shape answers where the profile can carry an entry to it:
// a measured tp 1 entry with a GEMM sweep of its conditions, or any entry of a published profile
// (by its roofline, carry_by_gemms; without one, FLOP-proportionally at the entry's rate); the
// entry with the nearest FLOPs per token is carried.
// nullopt when no entry has the shape (or can be carried), device and precision.
std::optional<ComputeEntry> find_compute(const MachineProfile& p, const ModelSpec& model,
                                         int micro_batch, const std::string& device,
                                         const std::string& precision, int threads,
                                         int ranks_per_node, std::string* how, int tp = 1);

// Seconds of `op` moving nccl-tests `bytes` on a group of `ranks` (ranks_per_node per node): for
// a shape with measured samples, piecewise-linear through them (end segments extended); with
// only a fit of that shape (published figures), the fit; else of the nearest shape on the same side
// of the node boundary (intra: all ranks in one node) with its bus bandwidth carried over
// (nccl-tests busbw is meant not to depend on the ranks). Among shapes alike, the one measured
// with `host_ranks` ranks on the host (0: any). `*how` says which fit. Negative when the profile
// has no fit for `op`.
double comm_time(const MachineProfile& p, const std::string& op, double bytes, int ranks,
                 int ranks_per_node, std::string* how = nullptr, int host_ranks = 0);

// The HDF5 file: written atomically (temporary name, then rename); read back exactly.
void write_profile(const MachineProfile& profile, const std::string& path);
// Throws strata::Error naming the file on any problem (not a profile, wrong schema, bad table).
MachineProfile read_profile(const std::string& path);

}  // namespace strata
