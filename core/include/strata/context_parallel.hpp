// strata SDK: the exchange a context-parallel model issues inside its attention, supplied by the
// strategy (DeepSpeed-Ulysses' sequence parallelism, Megatron-Core's context parallelism with
// cp_comm_type a2a).
//
// With Partition::cp_size > 1 a rank holds seq / cp tokens of each of its micro-batch's
// sequences (slice cp_rank, from position cp_rank x seq / cp) and every per-token layer runs on
// them alone. Each block's attention exchanges q | k | v with an all-to-all so that each rank
// holds every token of the sequences on 1 / cp of its heads, runs the causal attention over whole
// sequences, and exchanges the output back (the backward: the same two trips for the gradients).
// StageModel calls all_to_all on the compute thread and reads the result as soon as the call
// returns; SyncContextParallelComm runs it as a blocking collective on the cp group.
#pragma once
#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

class ContextParallelComm {
 public:
  virtual ~ContextParallelComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Group::all_to_all: block j of `in` (in.count / size() elements) to rank j, block i of `out`
  // from rank i.
  virtual void all_to_all(BufferView in, BufferView out) = 0;
};

// The default: each call one blocking collective on `group` on the calling thread, recorded by
// the ledger like any Group call.
class SyncContextParallelComm final : public ContextParallelComm {
 public:
  explicit SyncContextParallelComm(Group& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_to_all(BufferView in, BufferView out) override { group_.all_to_all(in, out); }

 private:
  Group& group_;
};

}  // namespace strata
STRATA_EXPORT_END
