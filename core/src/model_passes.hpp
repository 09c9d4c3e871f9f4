// The one implementation of the GPT-2 workload's computation: the activation plan (what a
// micro-batch in flight keeps, what is shared scratch) and the passes of the embedding, a block
// and the head, for any contiguous unit range, any tensor-parallel rank and size with or without
// sequence parallelism, and every recompute mode. Model (the whole model at tp 1, one slot) and
// StageModel (pipeline stages and chunks, tensor parallel, slots) are thin front ends over it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model_parts.hpp"
#include "strata/comm.hpp"
#include "strata/memory.hpp"
#include "strata/model.hpp"
#include "strata/stage_model.hpp"
#include "strata/tensor_parallel.hpp"

namespace strata {

// How block tensor k (BlockTensor) is cut across tensor-parallel ranks.
ShardKind block_shard(int k);

// Throws ConfigError for a spec the model cannot be built from (defined in model.cpp).
void validate_model_spec(const ModelSpec& spec);
// Every check a partition needs before anything is allocated: the spec, micro-batch > 0, the unit
// range, the tp rank, the tensor-parallel split and the recompute mode.
void validate_partition(const ModelSpec& spec, int micro_batch, const Partition& part,
                        Recompute recompute);

// Sizes of one partition for a micro-batch of B sequences. N = B*T token rows; Nl the rows of the
// residual stream on this rank (N/tp with sequence parallelism).
struct Dims {
  int B, T, C, NH, V, tp, blocks;
  bool sp, embedding, head;
  std::size_t N, Nl, Cl, NHl, Vl, row0, att;  // row0: first token row; att: B*NHl*T*T
  Dims(const ModelSpec& s, int micro_batch, const Partition& p);
};

// One block's activations; [Nl,C] pieces are the rank's token rows, [N,...] pieces all rows.
struct BlockActs {
  float *ln1, *ln1_mean, *ln1_rstd, *ln1_full;  // [Nl,C] [Nl] [Nl] [N,C] (= ln1 without sp)
  float* qkv;                                   // [N,3Cl] this rank's heads of q | k | v
  float* atty;                                  // [N,Cl]
  float* att;                                   // [B,NHl,T,T] softmax probabilities
  float* xmid;                                  // [Nl,C]  x_in + attention projection
  float *ln2, *ln2_mean, *ln2_rstd, *ln2_full;  // as ln1
  float *fch, *fch_gelu;                        // [N,4Cl]
  void carve(const Dims& d, bool with_att, Carver& c);
};

// Shared by all micro-batches, live only inside one pass call (dres: from one backward call to
// the next). Both views of the union start at the same place; the larger one is kept:
//   head view   logits [N,Vl] (d(logits)), ce [3N] (vocab-parallel cross-entropy, tp > 1)
//   block view  a [4N Cl]: d(fch_gelu), later d(qkv) (and the discarded attention output of a
//               selective recompute); b [max(4N Cl, att)]: d(fch), later attention's d(att)
//               scratch; then the shared recompute buffers: Recompute::selective one att,
//               Recompute::full one whole BlockActs.
// A block's forward writes the shared recompute buffers and nothing reads them afterwards (its
// backward recomputes them), and the head's view is dead outside the head's passes, so the two
// views can overlap.
struct Scratch {
  float* dres;     // [Nl,C] d(residual stream), carried from the head down to the embedding
  float* partial;  // [N,C] partial sums before a tp reduction (d(ln) inputs, d(atty), forward sp)
  float* full;     // [N,C] all-gathered d(residual) (sequence parallel; else = dres)
  float* shard;    // [Nl,C] reduce-scattered (sequence parallel; else = partial)
  float *logits, *ce;
  float *a, *b;
  BlockActs shared;
  void carve(const Dims& d, Recompute r, Carver& c);
};

// What one micro-batch in flight keeps from its forward to its backward.
struct SlotActs {
  std::vector<float*> x;  // residual stream [Nl,C]: x[0] input (or embedding output) .. x[blocks]
  // Recompute::none: a set per block; selective: a set per block whose att is the shared one;
  // full: every entry is the shared set (only x[l], the block's input, is kept).
  std::vector<BlockActs> block;
  float *lnf, *lnf_mean, *lnf_rstd, *lnf_full;  // head: [Nl,C] [Nl] [Nl] [N,C]
  float *probs, *losses;                        // [N,Vl] [N]
  float* grad_in;                               // [Nl,C] d(input), partitions without embedding
  void carve(const Dims& d, Recompute r, const Scratch& scratch, Carver& c);
};

// The passes of one partition. Parameters and gradients are passed per unit (a block's tensors at
// the block's local offsets, wte/wpe/lnf by pointer), so a front end keeps them where it likes.
// Gradients accumulate (+=).
class ModelPasses {
 public:
  struct Slot {
    Buffer<float> memory;  // MemTag::activations
    SlotActs acts;
  };

  // Validates, then allocates the shared scratch (MemTag::activations).
  ModelPasses(const ModelSpec& spec, int micro_batch, const Partition& part, Recompute recompute,
              MemoryLedger& memory);
  std::unique_ptr<Slot> make_slot();

  const Dims& dims() const { return alloc_; }
  Recompute recompute() const { return recompute_; }
  // Offset of block tensor k (BlockTensor) from the block's first local element.
  std::size_t block_offset(int k) const { return block_off_[k]; }
  // Run the following passes on a micro-batch of `batch` sequences (at most the allocated one;
  // exactly it when tp > 1).
  void set_batch(int batch);
  int batch() const { return run_.B; }
  float* dres() { return g_.dres; }

  // l: block index within the partition. forward_head also computes the per-token losses.
  void forward_embedding(SlotActs& s, const float* wte, const float* wpe,
                         const std::int32_t* inputs, TensorParallelComm* tp);
  void forward_block(int l, SlotActs& s, const float* p, TensorParallelComm* tp,
                     bool recomputing = false);
  void forward_head(SlotActs& s, const float* lnf, const float* wte, const std::int32_t* targets,
                    TensorParallelComm* tp);
  // dres() holds d(output) on entry of a block's backward and d(input) on return.
  void backward_head(SlotActs& s, const float* lnf, const float* wte, float* glnf, float* gwte,
                     const std::int32_t* targets, TensorParallelComm* tp, float grad_scale);
  void backward_block(int l, SlotActs& s, const float* p, float* g, TensorParallelComm* tp);
  void backward_embedding(float* gwte, float* gwpe, const std::int32_t* inputs,
                          TensorParallelComm* tp);
  // Sum of the per-token losses of the first `rows` token rows (after forward_head).
  static double loss_sum(const SlotActs& s, std::size_t rows);

 private:
  void gather(TensorParallelComm* tp, const float* shard, float* full);
  void scatter(TensorParallelComm* tp, float* full, float* shard);
  void row_parallel(TensorParallelComm* tp, float* out, const float* inp, const float* w,
                    const float* bias, int icl);
  float* reduce_input_grad(TensorParallelComm* tp);
  void vocab_parallel_xent(SlotActs& s, const std::int32_t* targets, TensorParallelComm* tp);

  ModelSpec spec_;
  Partition part_;
  Recompute recompute_;
  Dims alloc_, run_;
  MemoryLedger& memory_;
  std::size_t block_off_[kBlockTensors] = {};
  Buffer<float> scratch_memory_;
  Scratch g_;
};

}  // namespace strata
