// strata SDK: the exchanges an expert-parallel mixture of experts issues inside its moe blocks,
// supplied by the strategy (Megatron-Core's and DeepSpeed's token dispatch and combine).
//
// With Partition::ep_size > 1 a rank holds E / ep of a block's routed experts. Each moe block's
// forward routes the rank's own tokens, all-gathers every rank's rows per expert (the plans'
// counts), sends each token's rows to the ranks holding its experts (all_to_allv), runs its
// local experts on the rows it received from every rank, and sends their outputs back (the
// inverse all_to_allv); the backward sends d(output) rows the same way and d(input) rows back.
// StageModel calls these on the compute thread and reads each result as soon as the call
// returns; SyncExpertParallelComm runs each as a blocking collective on the ep group. A strategy
// that overlaps them implements this interface in its plugin: no core change.
#pragma once
#include <vector>

#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

class ExpertParallelComm {
 public:
  virtual ~ExpertParallelComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's `mine` (i32: its rows per expert), rank after rank: all.count == mine.count x
  // size().
  virtual void all_gather(BufferView mine, BufferView all) = 0;
  // Group::all_to_allv: send_counts[j] elements of `in` to rank j, recv_counts[i] into `out` from
  // rank i (rows of the activation's dtype: the GEMMs' for inputs, fp32 for outputs and
  // gradients).
  virtual void all_to_allv(BufferView in, const std::vector<std::size_t>& send_counts,
                           BufferView out, const std::vector<std::size_t>& recv_counts) = 0;
};

// The default: each call one blocking collective on `group` on the calling thread, recorded by
// the ledger like any Group call.
class SyncExpertParallelComm final : public ExpertParallelComm {
 public:
  explicit SyncExpertParallelComm(Group& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_gather(BufferView mine, BufferView all) override { group_.all_gather(mine, all); }
  void all_to_allv(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                   const std::vector<std::size_t>& recv_counts) override {
    group_.all_to_allv(in, send_counts, out, recv_counts);
  }

 private:
  Group& group_;
};

}  // namespace strata
STRATA_EXPORT_END
