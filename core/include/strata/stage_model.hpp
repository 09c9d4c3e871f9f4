// strata SDK: the workload split for model parallelism (Megatron-LM style).
//
// A StageModel holds a contiguous range of units (a pipeline stage, or one virtual chunk of an
// interleaved stage) with every tensor split across the tensor-parallel group:
//   QKV, FC1       column-parallel: this rank's attention heads (and, with grouped-query
//                  attention, its K/V heads) / its slice of the MLP's rows (of gate and of up)
//   proj, FC2      row-parallel: the matching input columns; the partial outputs are all-reduced
//   wte, lm_head   vocab-parallel: rows [r V/t, (r+1) V/t) of the embedding and of the LM head
//                  (GPT-2's tied to wte), with a vocab-parallel cross-entropy (max and sum-of-exp
//                  all-reduced, never the logits)
//   norms, biases of row-parallel layers, wpe: replicated.
// One all-reduce in forward and one in backward per sub-block (attention, MLP). With sequence
// parallelism the residual stream between those sub-blocks is sharded by token rows (N/t rows of
// the micro-batch's N = B*T tokens; LayerNorm, residual, bias and dropout are per token, so any row
// split is Megatron's sequence split) and every all-reduce becomes an all-gather before the
// column-parallel matmul and a reduce-scatter after the row-parallel one.
//
// Activations live in *slots*, one per micro-batch in flight (a pipeline schedule decides how
// many); gradient scratch (and the recompute buffers) is shared, since one pass runs at a time.
// All buffers are tagged MemTag::activations (token copies MemTag::workspace);
// predict_activations() (strata/model.hpp) and slot_token_bytes() predict them exactly. Every
// recompute mode works in every configuration. The passes are the same code Model runs.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm.hpp"
#include "strata/context_parallel.hpp"
#include "strata/expert_parallel.hpp"
#include "strata/export.hpp"
#include "strata/memory.hpp"
#include "strata/model.hpp"
#include "strata/optimizer.hpp"
#include "strata/tensor_parallel.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// Throws ConfigError (one line, naming the option) if the model cannot be split tp ways:
// heads, hidden, vocab (and micro-batch x seq with sequence parallelism) must divide.
void validate_tensor_parallel(const ModelSpec& spec, int micro_batch, int tp,
                              bool sequence_parallel);

// Throws ConfigError (one line, naming the option) if the model's experts cannot be split ep ways:
// ep > 1 needs --arch moe and must divide the routed experts.
void validate_expert_parallel(const ModelSpec& spec, int ep);

// Throws ConfigError (one line, naming the option) if the model's sequences cannot be split cp
// ways: 2 cp must divide seq (cp_position's chunks), Ulysses' cp the heads of a tp rank (it gives
// each cp rank whole heads).
void validate_context_parallel(const ModelSpec& spec, int tp, int cp,
                               ContextAttention attention = ContextAttention::ulysses);

// How a local tensor is cut from the global one.
enum class ShardKind {
  replicated,    // whole tensor on every tp rank
  rows,          // a contiguous block of rows (wte, lm_head, fc_w, fc_b)
  stacked_rows,  // this rank's part of each stacked block of rows (LocalTensor::stacked): its
                 // heads of q, k and v (qkv_w, qkv_b), its rows of gate and up (gate_up_w)
  columns,       // a block of input columns (proj_w, fcproj_w, down_w)
  experts        // moe's routed experts (experts.gate_up_w, experts.down_w): the ep rank's block
                 // of E / ep whole experts, over the expert-parallel group (Partition::ep_size)
};

struct LocalTensor {
  int global = 0;          // index into ParamLayout::tensors()
  std::size_t offset = 0;  // in the partition's local flat buffer
  std::size_t count = 0;
  ShardKind shard = ShardKind::replicated;
  bool decay = false;
  // The LM head's copy of the tied wte on a partition without the embedding: its gradient must be
  // exchanged with the embedding's stage, and it is counted once in the gradient norm.
  bool tied_copy = false;
  // stacked_rows: the global rows of each stacked block, in order (q, k, v: heads x head size,
  // K/V heads fewer with grouped-query attention; gate, up: ffn each). Block i's rank-r part is
  // its rows [r * rows_i / tp, (r + 1) * rows_i / tp), the parts concatenated in block order.
  std::vector<std::int64_t> stacked;
};

class StageModel {
 public:
  // param_dtype: fp32, or bf16 (MixedPrecision::param) for the parameter views the passes get.
  // tp_comm_dtype: fp32, or bf16 (MixedPrecision::tp_comm): the dtype the tensor-parallel
  // collectives move activations and their gradients in (bf16: through a comm buffer of
  // tp_comm_buffer_bytes(), MemTag::comm_buffers); the cross-entropy's statistics stay fp32.
  // split_backward (zero-bubble pipelines; validate_split_backward): backward() computes the
  // input's gradients (and the norms' and biases') only and defers the blocks' GEMMs' weight
  // gradients to backward_weights(), each slot keeping their d(output)s until then
  // (predict_activations' split_backward).
  StageModel(const ModelSpec& spec, int micro_batch, const Partition& part, MemoryLedger& memory,
             Recompute recompute = Recompute::none, DType param_dtype = DType::f32,
             DType tp_comm_dtype = DType::f32, bool split_backward = false);
  ~StageModel();
  StageModel(const StageModel&) = delete;
  StageModel& operator=(const StageModel&) = delete;

  const Partition& partition() const;
  Recompute recompute() const;
  DType param_dtype() const;
  bool has_embedding() const;
  bool has_head() const;
  // Only the embedding and the head read the micro-batch's tokens; forward() of a partition with
  // neither accepts a MicroBatch without token pointers.
  bool needs_tokens() const;
  // This partition's parameters, in local flat order.
  const std::vector<LocalTensor>& tensors() const;
  std::size_t param_count() const;
  // Fill params (param_count() elements, fp32 or bf16) with exactly the values the full model's
  // init_params gives the elements this rank holds.
  void init_params(std::uint64_t seed, BufferView params) const;
  // The same for the local elements [begin, begin + params.count) only (a shard of them).
  void init_params(std::uint64_t seed, std::size_t begin, BufferView params) const;
  // The local wte (vocab shard; the tied copy on a head-only partition); null if none.
  std::size_t wte_offset() const;
  std::size_t wte_count() const;
  // Optimizer segments of the local buffer (weight decay per tensor).
  std::vector<AdamWSegment> adamw_segments() const;
  // Gradients that differ across tp ranks although the tensor is replicated (sequence parallel:
  // LayerNorms, row-parallel biases, wpe see only this rank's token rows): these must be
  // all-reduced over tp before the update. Empty without sequence parallelism.
  std::vector<const LocalTensor*> tp_partial_grads() const;
  // This rank's share of the squared gradient norm: sharded tensors fully, replicated ones on tp
  // rank 0 only, the tied copy never (the embedding's stage counts wte).
  double grad_sum_of_squares(BufferView grads) const;
  // Whether grad_sum_of_squares counts tensor t (for a caller that holds only a slice of the
  // gradients, e.g. a ZeRO-1 shard over data parallelism).
  bool in_grad_norm(const LocalTensor& t) const;

  // Elements of the residual stream at a partition boundary for one micro-batch: rows x C, with
  // rows = B*T, or B*T/tp under sequence parallelism. What a pipeline stage sends and receives.
  std::size_t boundary_count() const;
  static std::size_t boundary_count(const ModelSpec& spec, int micro_batch, const Partition& part);

  // Activation slots. acquire_slot() returns a free slot, allocating one if all are in use;
  // release_slot() returns it (memory is kept for reuse, so the peak is the most in flight).
  int acquire_slot();
  void release_slot(int slot);
  int slots_allocated() const;
  // Where a stage without the embedding receives its input: boundary_count() elements of the
  // residual stream, in the parameters' dtype (bf16 in a bf16 run, as Megatron-LM keeps it).
  BufferView input(int slot);
  // The partition's output after forward (what a stage without the head sends on), as input().
  BufferView output(int slot) const;
  // Where a stage without the head receives d(output) before backward (shared scratch; fp32
  // boundary_count() floats, as every activation gradient).
  float* output_grad();
  // d(input) after backward, on a stage without the embedding (kept in the slot until released;
  // fp32).
  const float* input_grad(int slot) const;

  // The expert-parallel exchanges (expert_parallel.hpp) the passes of an ep_size > 1 partition
  // issue, from now on (a strategy's, e.g. SyncExpertParallelComm over its ep group; not owned).
  void set_expert_comm(ExpertParallelComm* ep);
  // The context-parallel exchanges (context_parallel.hpp) of a cp_size > 1 partition, from now on
  // (e.g. SyncContextParallelComm over its cp group; not owned).
  void set_context_comm(ContextParallelComm* cp);

  // Forward of the partition for micro-batch mb (its tokens, if needed, are copied into the slot).
  // `tp`: the tensor-parallel collectives (tensor_parallel.hpp; SyncTensorParallelComm over the tp
  // group is the default); may be null when tp_size == 1. A partition with the head also computes
  // the loss.
  // params: the local buffer (param_count() elements in param_dtype()).
  void forward(int slot, BufferView params, const MicroBatch& mb, TensorParallelComm* tp);
  // Backward; on a partition without the head, output_grad() must hold d(output). Gradients
  // accumulate into grads (local flat order). grad_scale: d(loss)/d(per-token loss).
  // grads: fp32, or bf16 with bf16 parameters.
  void backward(int slot, BufferView params, BufferView grads, TensorParallelComm* tp,
                float grad_scale);
  // One unit's pass (`unit` in [partition().first_unit, last_unit]), for a caller that drives the
  // units itself: params[u] and grads[u] are unit u's views (unit_range(u).second elements; a
  // tied head's pass (GPT-2's) also reads the embedding unit's wte and writes its gradient when
  // the partition has both; a llama's head has its own lm_head). The first
  // unit's forward takes the micro-batch's tokens into the slot; the first unit's backward, on a
  // partition without the embedding, leaves d(input) in input_grad(slot). The passes of the
  // whole partition above and below are these, unit by unit.
  void forward(int slot, int unit, const UnitPtrs& params, const MicroBatch& mb,
               TensorParallelComm* tp);
  void backward(int slot, int unit, const UnitPtrs& params, const UnitPtrs& grads,
                TensorParallelComm* tp, float grad_scale);
  // Unit at a time, for a caller that holds only some units' parameters or gradients (ZeRO-2 and
  // FSDP on the data-parallel axis of tp). unit_range(u): local unit u's [offset, count) in the
  // local flat order (u from partition().first_unit; the head unit includes a tied wte copy).
  struct UnitAccess {
    std::function<BufferView(int unit)> acquire;  // unit u's view, before the first pass using it
    std::function<void(int unit)> release;        // after the last pass of this call using it
  };
  std::pair<std::size_t, std::size_t> unit_range(int unit) const;
  // Every local unit's [offset, count), first unit first, without building the partition.
  static std::vector<std::pair<std::size_t, std::size_t>> unit_ranges(const ModelSpec& spec,
                                                                      const Partition& part);
  // The same passes as above, in this order (predictions mirror it). Forward: acquire the
  // embedding unit (held to the end, for a tied head's wte; also for an untied model, whose
  // engine schedules may release it earlier: micro_batch_schedule), each block acquired and
  // released in turn, the head acquired and released, the embedding released. Backward: the
  // embedding unit's gradients (and its parameters when the head is here) acquired first and held
  // to the end; then the head's parameters and gradients, acquired and released; each block's, last
  // first; then the embedding's backward and its release.
  void forward(int slot, const UnitAccess& params, const MicroBatch& mb, TensorParallelComm* tp);
  void backward(int slot, const UnitAccess& params, const UnitAccess& grads, TensorParallelComm* tp,
                float grad_scale);
  // The weight pass of a split backward: the weight gradients every backward of the slot since the
  // last weight pass deferred, accumulated into the gradient views those backwards were given (in
  // the order they deferred them: the same sums as an unsplit backward). A slot is released only
  // after it.
  void backward_weights(int slot);
  // Sum of per-token losses of the slot's micro-batch (partitions with the head).
  double loss_sum(int slot) const;
  // --arch moe: the sum over this partition's blocks and the slot's sequences of the
  // load-balancing loss (its coefficient included; 0 for other families). The objective the
  // backward differentiates is the mean per-token loss plus this averaged over the global batch's
  // sequences; the loss a run reports is the first alone (Megatron-LM's "lm loss").
  double aux_loss_sum(int slot) const;

  // Exact bytes of one slot's token copies, inputs and targets of the partition's seq / cp_size
  // tokens per sequence (MemTag::workspace; its activations: predict_activations()).
  static std::uint64_t slot_token_bytes(const ModelSpec& spec, int micro_batch,
                                        const Partition& part);
  // Exact bytes of the tp comm buffer a partition built with this tp comm dtype holds
  // (MemTag::comm_buffers): 0 at tp 1 or in fp32; in bf16 an [N,C] activation, and with sequence
  // parallelism a reduce-scatter's [N/tp,C] output beside it.
  static std::uint64_t tp_comm_buffer_bytes(const ModelSpec& spec, int micro_batch,
                                            const Partition& part, DType tp_comm_dtype);
  // The tensor table of a partition without building it (for predictions).
  static std::vector<LocalTensor> local_tensors(const ModelSpec& spec, const Partition& part);

 private:
  // Views of each local unit inside a local buffer of param_count() elements, indexed by unit.
  UnitPtrs unit_views(BufferView local) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One collective of the tp group inside a unit's pass: its op and bytes (nccl-tests size
// convention).
struct PassCollective {
  CommOp op;
  double bytes;
};

// The tensor-parallel collectives of one micro-batch's forward (backward: false) or backward of
// unit `unit` (ParamLayout's numbering) on a tp group of `tp` ranks (of a cp-way context-parallel
// mesh: seq / cp tokens of each sequence), as StageModel issues them,
// those a full recompute repeats in backward included: activations in tp_comm_dtype (2 bytes an
// element in bf16), the cross-entropy's statistics in fp32. Empty at tp 1. The step-plan bytes
// (plan_comm_bytes) and the step-time predictor both read them from here.
std::vector<PassCollective> tensor_parallel_collectives(const ModelSpec& spec, int micro_batch,
                                                        int unit, bool backward, int tp,
                                                        bool sequence_parallel, int cp,
                                                        Recompute recompute, DType tp_comm_dtype);

// The expert-parallel exchanges of one micro-batch's forward (backward: false) or backward of unit
// `unit` on an ep group of `ep` ranks, as a moe block issues them (expert_parallel.hpp), those a
// full recompute repeats in backward included: the rows per expert all-gathered (i32), then the
// rows to the experts' ranks (in the parameters' dtype) and their outputs back (fp32); backward
// d(output) rows out and d(input) rows back (fp32). all_to_all's bytes are the rank's send buffer:
// its own rows out, what it received back, so they follow the routing; stated here dropless at a
// uniform routing (each rank receives as many rows as it sends), where the sum over the ranks is
// exact for any routing. A rank routes its seq / cp tokens of each sequence (context
// parallelism). Empty at ep 1 and for other units.
std::vector<PassCollective> expert_parallel_collectives(const ModelSpec& spec, int micro_batch,
                                                        int unit, bool backward, int ep, int cp,
                                                        Recompute recompute, DType param_dtype);

// The context-parallel exchanges (context_parallel.hpp) of one micro-batch's forward or backward
// of unit `unit` on a cp group of `cp` ranks and a tp group of `tp`, in the attention's dtype on
// `device` (the parameters' where it reads and writes bf16, attention_writes_bf16) forward and
// fp32 backward. Ulysses, per block: q | k | v and the attention's output forward, their
// gradients backward, a full recompute's forward ones again (all_to_all's bytes: the rank's send
// buffer). Ring: the key-value block's cp - 1 passes forward (a send and a receive each); backward
// those again and its gradient's cp passes, after a recompute's (full or selective) forward ones.
// A moe block then gathers every cp rank's routing choices per chunk of each sequence and expert
// ([cp, B, 2, E] of int32, moe_sequence_choices) in each forward, a full recompute's too. Empty at
// cp 1 and for the embedding and the head.
std::vector<PassCollective> context_parallel_collectives(const ModelSpec& spec, int micro_batch,
                                                         int unit, bool backward, int tp, int cp,
                                                         ContextAttention attention,
                                                         Recompute recompute, DType param_dtype,
                                                         Device device);

}  // namespace strata
STRATA_EXPORT_END
