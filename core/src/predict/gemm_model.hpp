// Compute time by GEMM shape (docs/predict.md "Other model shapes"): a measured profile's GEMM
// sweep (runner --calibrate) and how a compute entry of one model shape is carried to another with
// it, so that small and large models are not taken to run at one achieved FLOP rate.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "predict/machine_profile.hpp"

namespace strata {

// Whether two samples measure one GEMM under one set of conditions.
bool same_gemm(const GemmSample& a, const GemmSample& b);

// A linear layer as the GEMM it issues: out[m,n] = in[m,k] W[n,k]^T, m the micro-batch's tokens.
struct Linear {
  int n = 0, k = 0;
};

// A block's linear layers at tp 1: qkv (C + 2 K, C; K = C for GPT-2, C kv_heads / heads with
// grouped-query attention), the attention projection (C, C), FC (4C, C; a llama's gate | up
// (2F, C)) and the FC projection (C, 4C; (C, F)); a moe's router (E, C) and its top_k experts as
// one GEMM of k times their rows (k 2F, C) and of their inputs (C, k F): the FLOPs of the k GEMMs a
// token's rows go through, at the rate of one the size of their sum (the experts' GEMMs are
// smaller, about k N / E rows each: the prediction is optimistic where that rate falls off).
std::vector<Linear> block_linears(const ModelSpec& m);
// The head's: the LM matmul (V, C), against the tied embedding or the LM head.
std::vector<Linear> head_linears(const ModelSpec& m);

// The GEMMs runner --calibrate times for an entry (its conditions, m = micro-batch x seq): every
// linear of the block and the head, forward and backward, at hidden sizes from a quarter to 1.5
// times the model's (rounded to multiples of 16): shapes around it bracketed, larger ones at the
// rate of the largest (GEMM rates level off with size), and the sweep within about a third of the
// calibration's time.
std::vector<GemmSample> gemm_sweep_shapes(const ComputeEntry& e);

// The profile's sweep samples measured under the entry's conditions (device, precision, threads,
// ranks on the host); empty when there are none or no forward or no backward ones.
std::vector<GemmSample> sweep_of(const MachineProfile& p, const ComputeEntry& e);

// Seconds of one GEMM of `pass` (forward | backward) by the sweep: its FLOPs at the rate of the
// nearest samples in (log m, log n, log k), the two nearest's log-rates weighted by inverse
// distance (a measured shape: its own rate). Negative without samples of the pass.
double sweep_gemm_seconds(const std::vector<GemmSample>& sweep, const std::string& pass, int m,
                          int n, int k);

// Seconds of a linear layer's GEMMs: forward | backward, m rows, n outputs, k inputs.
using GemmSeconds = std::function<double(const std::string& pass, int m, int n, int k)>;

// Carries an entry (tp 1) to the shape `to` at `micro_batch`: each unit pass is its GEMMs by
// `gemm` plus what the entry holds beyond its own GEMMs by `gemm` (LayerNorm, GELU, the
// attention, softmax, residual adds: bound by memory), that rest scaled by a block's activation
// bytes (predict_activations), the head's by its logits (tokens x vocab) and the embedding by its
// rows (tokens x hidden). Recompute: the full one as the block's forward, the selective one (the
// attention) by tokens x seq x hidden. Per-parameter and per-byte rates stay. The GEMMs are taken
// at the micro-batch's rows, not scaled from the entry's (tile quantization depends on them).
void carry_by_gemms(ComputeEntry& e, const ModelSpec& to, int micro_batch, const GemmSeconds& gemm);

}  // namespace strata
