// strata SDK: the collectives a tensor-parallel model issues inside its layers, supplied by the
// strategy (Megatron-LM's f/g operators and, with sequence parallelism, its all-gather and
// reduce-scatter of the token rows).
//
// StageModel calls these on the compute thread, in the order of the layers, and reads each result
// as soon as the call returns. The default, SyncTensorParallelComm, runs each as a blocking
// collective on the tp group (what Megatron-LM does without its overlap options). A strategy that
// overlaps them (splitting a GEMM and pipelining its chunks with the collective, running them on a
// comm stream behind independent work) implements this interface in its plugin and hands it to
// the model: no core change.
#pragma once
#include <memory>

#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// The views are fp32, or bf16 for activations and their gradients when the run's tp comm dtype
// (MixedPrecision::tp_comm) is bf16: StageModel rounds them into its comm buffer first.
class TensorParallelComm {
 public:
  virtual ~TensorParallelComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sum over the tp ranks, in place: row-parallel outputs, partial input gradients, the vocab-
  // parallel embedding and the cross-entropy's sums.
  virtual void all_reduce_sum(BufferView data) = 0;
  // Max over the tp ranks, in place: the vocab-parallel cross-entropy's row maxima.
  virtual void all_reduce_max(BufferView data) = 0;
  // Sequence parallelism: this rank's token rows to every rank's (shard.count * size() ==
  // full.count), and partial sums of every row to this rank's rows, summed.
  virtual void all_gather(BufferView shard, BufferView full) = 0;
  virtual void reduce_scatter(BufferView full, BufferView shard) = 0;
};

// The default: each call one blocking collective on `group` on the calling thread, recorded by
// the ledger like any Group call.
class SyncTensorParallelComm final : public TensorParallelComm {
 public:
  explicit SyncTensorParallelComm(Group& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_reduce_sum(BufferView data) override { group_.all_reduce(data); }
  void all_reduce_max(BufferView data) override { group_.all_reduce_max(data); }
  void all_gather(BufferView shard, BufferView full) override { group_.all_gather(shard, full); }
  void reduce_scatter(BufferView full, BufferView shard) override {
    group_.reduce_scatter(full, shard);
  }

 private:
  Group& group_;
};

}  // namespace strata
STRATA_EXPORT_END
