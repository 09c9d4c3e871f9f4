// Which rows of the experts' input each token's routing choices take (--arch moe): the one
// dispatch plan the passes, their backward and the memory plan share; and, for expert
// parallelism, how those rows travel between the ranks that hold the experts.
#pragma once
#include <cstdint>
#include <vector>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN  // for the tests
    namespace strata {
  // Expert e's rows are [offset[e], offset[e] + count[e]), the experts one after another; inside an
  // expert, its choices in token order (sequence by sequence). row_of[n * k + j]: the row of token
  // n's j-th choice, -1 when dropped; token_of[r]: the token of row r.
  struct MoeDispatch {
    std::vector<std::int32_t> offset, count, row_of, token_of;
    std::int64_t dropped = 0;  // choices over capacity
    std::int32_t rows() const { return std::int32_t(token_of.size()); }
  };

  // Capacity per expert and sequence: ceil(capacity_factor x k T / E) choices; 0 for a factor of 0
  // (dropless).
  int moe_capacity(double capacity_factor, int T, int E, int k);
  // The most rows a micro-batch of B sequences can take: B E capacity, at most B T k (dropless:
  // B T k).
  std::int64_t moe_max_rows(int B, int T, int E, int k, int capacity);
  // The most rows one rank's E / ep experts receive from ep ranks' micro-batches of B sequences
  // each (expert parallelism): from each, at most min(k, E / ep) choices per token, and with a
  // capacity E / ep x capacity per sequence. moe_max_rows at ep 1.
  std::int64_t moe_max_rows_received(int B, int T, int E, int k, int capacity, int ep);

  // Where a rank's T tokens of each sequence sit in it. Whole sequences (cp 1): one chunk, nothing
  // before it. Context parallelism: `chunks` chunks of T / chunks tokens (cp_tokens' two zig-zag
  // chunks), and before[(b chunks + h) E + e] the choices of expert e that sequence b's tokens
  // ahead of chunk h made (on every cp rank).
  struct MoeSequenceSplit {
    int chunks = 1;
    std::vector<std::int32_t> before;  // empty: none
  };

  // The plan of B sequences of T tokens from their choices experts[B T, k] (host memory). With a
  // capacity, each sequence keeps its first `capacity` choices of each expert (in token order, then
  // choice order) and drops the rest, as GShard's groups of one sequence each: a sequence's plan
  // does not depend on the sequences beside it, so splitting a batch over micro-batches or ranks
  // keeps every token's experts; split over cp ranks, `split.before` counts the choices ahead of
  // each chunk, so each token's drops are the whole sequence's. capacity 0: dropless.
  MoeDispatch moe_dispatch(const std::int32_t* experts, int B, int T, int E, int k, int capacity,
                           const MoeSequenceSplit& split = {});

  // Each chunk's choices of each expert, [B chunks, E], from experts[B T, k] (chunks of T / chunks
  // tokens of each sequence).
  std::vector<std::int32_t> moe_chunk_choices(const std::int32_t* experts, int B, int T, int E,
                                              int k, int chunks);
  // Context parallelism's sequence-wise counts (every moe block: cp rank `rank` of cp, each holding
  // two zig-zag chunks of B sequences): from every rank's moe_chunk_choices, all-gathered rank
  // after rank ([cp, B, 2, E]), this rank's split (the choices ahead of its chunks: chunk h of rank
  // r is the sequence's chunk r, or 2 cp - 1 - r) and each whole sequence's choices [B, E]. At cp 1
  // `all` is the rank's own [B, 1, E]: no split, the sequences' choices themselves.
  struct MoeSequenceChoices {
    MoeSequenceSplit split;
    std::vector<std::int32_t> sequence;
  };
  MoeSequenceChoices moe_sequence_choices(const std::vector<std::int32_t>& all, int cp, int rank,
                                          int B, int E);

  // Expert parallelism's exchange of one moe block's rows (ep ranks, E experts, E / ep on each:
  // expert e on rank e / (E / ep)), from counts[s E + e], the rows rank s's plan gives expert e
  // (every rank's MoeDispatch::count, all-gathered). A plan's rows are in expert order, so the
  // rows for one rank are contiguous: this rank sends send_rows[d] rows from send_offset[d] to
  // rank d and receives recv_rows[s] rows from rank s at recv_offset[s], source after source (as
  // all_to_allv lays them out). Received, each source's rows are in its local-expert order;
  // the experts' GEMMs need each local expert's rows together: local expert l's are rows
  // [expert_offset[l], + expert_rows[l]) of the regrouped order, from each source in rank order,
  // and received row order[i] is regrouped row i (Megatron-Core's sort of chunks by expert).
  struct MoeExchange {
    std::vector<std::int64_t> send_rows, send_offset, recv_rows, recv_offset;
    std::vector<std::int32_t> expert_rows, expert_offset, order;
  };
  MoeExchange moe_exchange(const std::vector<std::int32_t>& counts, int rank, int ep, int E);

  // This process's routing choices so far, those dropped over capacity, and the load-balancing
  // loss its blocks added (coefficient included, summed over their sequences): every moe block's
  // forward adds its micro-batch's, recomputes do not. What a run reports as moe_dropped_fraction
  // and each step's moe_aux_loss, from the differences summed over the ranks.
  struct MoeRoutingCounts {
    std::int64_t choices = 0, dropped = 0;
    double aux_loss = 0;
  };
  MoeRoutingCounts moe_routing_counts();
  void add_moe_routing(std::int64_t choices, std::int64_t dropped);
  void add_moe_aux_loss(double sum);

}  // namespace strata
STRATA_EXPORT_END
