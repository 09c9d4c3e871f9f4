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

#include "predict/machine_profile.hpp"
#include "results/run_record.hpp"
#include "strata/model.hpp"

namespace strata {

// Seconds of one micro-batch's passes through every unit, forward and backward (no recompute).
double pass_seconds(const ComputeEntry& e);

// The median of each timed field (timed_fields) over entries of one configuration, the others
// from the first: one slow measurement on a busy machine does not move it.
ComputeEntry median_entry(const std::vector<ComputeEntry>& entries);

// Every timed field of an entry (passes, recompute, optimizer, new buffers, copies), for the
// operations over all of them: the max over ranks, the median over runs.
std::array<double*, 13> timed_fields(ComputeEntry& e);

// Sets an entry's six unit passes from the whole model's forward and backward of one micro-batch
// (seconds), split over the units in proportion to their forward FLOPs (UnitFlops).
void split_passes_by_flops(ComputeEntry& e, const ModelSpec& model, double forward_s,
                           double backward_s);

// After an entry's block_backward_s changed from `old_block_backward_s` (carried to another shape,
// or made a tp rank's own): its split backward's measured passes keep their shares of it.
void keep_split_shares(ComputeEntry& e, double old_block_backward_s);

// Whether two samples measure one point: op, group shape, ranks on the host and bytes.
bool same_point(const CommSample& a, const CommSample& b);

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
