// The data of a machine profile (schema strata-profile/1): compute entries, comm samples and
// their fits, the GEMM sweep and a published profile's GEMM model. Types only: reading, writing,
// merging and querying them is profile.hpp's; GEMM time by shape is gemm_model.hpp's
// (GemmRoofline::seconds among it).
#pragma once
#include <string>
#include <vector>

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
  // A block's backward split as zero-bubble pipelines run it (runner --calibrate): the input's
  // gradients, and the weight gradients deferred to the weight pass. 0: not measured (published
  // profiles, profiles from runs, files before it): the weight pass is its FLOP share of
  // block_backward_s (ModelSpec::block_weight_grad_share) and the input pass the rest.
  double block_input_backward_s = 0, block_weight_backward_s = 0;
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

// Forward FLOPs of one token through a unit, as ModelSpec::flops_per_token counts them (a block's
// GEMMs twice its linear weights, GPT-2's 24 h^2, and its attention 4 h T; the LM head 2 h V);
// the embedding's lookup as h.
struct UnitFlops {
  double embedding, block, attention, head;
  explicit UnitFlops(const ModelSpec& m)
      : embedding(m.hidden),
        block(2.0 * double(m.block_active_linear_params()) + 4.0 * m.hidden * m.seq),
        attention(4.0 * m.hidden * m.seq),
        head(2.0 * m.hidden * m.vocab) {}
};

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

}  // namespace strata
