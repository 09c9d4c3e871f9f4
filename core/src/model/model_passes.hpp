// The one implementation of the GPT-2 workload's computation: the activation plan (what a
// micro-batch in flight keeps, what is shared scratch) and the passes of the embedding, a block
// and the head, for any contiguous unit range, any tensor-parallel rank and size with or without
// sequence parallelism, and every recompute mode. Model (the whole model at tp 1, one slot) and
// StageModel (pipeline stages and chunks, tensor parallel, slots) are thin front ends over it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backends/kernels.hpp"
#include "model/model_parts.hpp"
#include "model/moe_dispatch.hpp"
#include "strata/comm.hpp"
#include "strata/context_parallel.hpp"
#include "strata/export.hpp"
#include "strata/memory.hpp"
#include "strata/model.hpp"
#include "strata/stage_model.hpp"
#include "strata/tensor_parallel.hpp"

namespace strata {

// How block tensor k (BlockTensor) of an `arch` block is cut across tensor-parallel ranks, and for
// ShardKind::stacked_rows its stacked blocks' global rows (LocalTensor::stacked; else empty).
ShardKind block_shard(Arch arch, int k);
std::vector<std::int64_t> block_stacked_rows(const ModelSpec& spec, int k);

// Every check a partition needs before anything is allocated: the spec, micro-batch > 0, the unit
// range, the tp rank, the tensor-parallel split, the recompute mode and the parameter dtype.
void validate_partition(const ModelSpec& spec, int micro_batch, const Partition& part,
                        Recompute recompute, DType param_dtype = DType::f32,
                        Device device = Device::cpu);

// Exported for the tests (test_mixed_precision, test_stage_model): the sizes, the head's chunking
// and context parallelism's exchanges.
STRATA_EXPORT_BEGIN
// Sizes of one partition for a micro-batch of B sequences. N = B*T token rows; Nl the rows of the
// residual stream on this rank (N/tp with sequence parallelism). Context parallelism (cp > 1):
// T is the rank's share of each sequence (seq / cp tokens at the positions cp_tokens gives), Ta
// the whole sequence. Ulysses' attention runs over whole sequences on NHa = NHl / cp heads (Ca =
// NHa hs columns); ring attention (ring) on the rank's queries and every head (NHa = NHl). With
// grouped-query attention whose K/V heads cp divides or divide cp (ulysses_kv), Ulysses exchanges
// q | k | v before K/V are repeated: KVa K/V heads a rank (KVl / cp, or 1 where KVl < cp: each
// K/V head sent to the kv_copies = cp / KVl ranks whose query heads use it, its gradient's copies
// summed on the way back), repeated to its NHa query heads after the exchange. DeepSpeed repeats
// them to every query head before it; strata does where neither divides the other. QKVx: the
// columns a token's q | k | v takes in the exchange ((NHl + 2 KVl kv_copies) hs, or 3 Cl).
// KVl: K/V heads on this rank, hs the head size, QKVl = (NHl + 2 KVl) hs the q | k | v
// projection's outputs on this rank, Fl the MLP's hidden size on this rank, FCl the FC layer's
// outputs (Fl, or a llama's gate | up 2 Fl; moe: one expert's).
struct Dims {
  int B, T, C, NH, V, tp, blocks;
  int cp, Ta;
  bool sp, embedding, head, llama, moe;  // llama: the llama block (moe's too)
  // row0: first token row; att: floats of the attention's state (attention_state_floats)
  std::size_t N, Nl, Cl, NHl, KVl, hs, QKVl, Fl, FCl, Vl, row0, att;
  std::size_t NHa, Ca;
  int cp_rank;
  bool ring;
  bool ulysses_kv;
  std::size_t KVa, kv_copies, QKVx;
  // moe: E experts, topk per token, capacity per expert and sequence (0: dropless), R the most
  // rows this rank's tokens send to the experts (moe_max_rows), SF the shared experts' hidden
  // size; 0 otherwise. Expert parallelism: ep ranks, El = E / ep experts here, Rx the most rows
  // they receive from all ranks (R at ep 1; expert_rows_received)
  int E, topk, capacity, ep, El;
  std::size_t R, SF, Rx;
  // attention_bf16: the device's attention takes bf16 q | k | v and output
  // (attention_writes_bf16)
  bool attention_bf16;
  Dims(const ModelSpec& s, int micro_batch, const Partition& p, Device device);
};

// The sequence positions of the T tokens of cp rank `rank` (cp_position's zig-zag chunks).
TokenPositions cp_tokens(const Dims& d, int rank);

// bf16 elements of ModelPasses' tp comm buffer: 0 at tp 1 or with fp32 tp comm.
std::size_t tp_comm_buffer_count(const Dims& d, DType tp_comm_dtype);

// With bf16 parameters the head's GEMM and cross-entropy run one chunk of token rows at a time:
// as many rows as kHeadLogitsBudget bytes of fp32 logits hold (at least 1, at most N), which
// bounds the GEMM's scratchpad and the row statistics of a vocab-parallel cross-entropy.
constexpr std::size_t kHeadLogitsBudget = std::size_t(256) << 20;
std::size_t head_chunk_rows(const Dims& d);

// Ulysses' exchanges as row permutations of cp_perm_cols(d, which) columns (context
// parallelism): CpPerm's entries, each an array of cp_perm_rows(d, which) row indices for
// Kernels::moe_gather (out row r = in row perm[r]). qkv_send packs the rank's q | k | v rows by
// destination cp rank, qkv_full unpacks what arrives into whole sequences; dqkv_send and
// dqkv_local are their inverses for the backward. Their rows are a head group's Ca columns
// ([N, 3, cp, Ca] -> [B, Ta, 3, Ca]), or with ulysses_kv one head's hs ([N, NHl + 2 KVl] ->
// [B, Ta, NHa + 2 KVa]: the projection's heads, K/V not repeated). With kv_copies > 1 qkv_send
// sends each K/V row kv_copies times, and dqkv_local is the summing gather back
// (Kernels::moe_gather_backward): kv_copies entries per local row, -1 where a q row has one.
// out_send, out_local and their inverses dout_full, dout_send do the same for the attention's
// output [B, Ta, Ca] -> [N, cp, Ca].
enum CpPerm {
  qkv_send,
  qkv_full,
  dqkv_send,
  dqkv_local,
  out_send,
  out_local,
  dout_send,
  dout_full
};
constexpr int kCpPerms = 8;
std::size_t cp_perm_rows(const Dims& d, int which);
std::size_t cp_perm_cols(const Dims& d, int which);
std::size_t cp_perm_offset(const Dims& d, int which);
// Every permutation, concatenated in CpPerm order (cp_perm_offset's).
std::vector<std::int32_t> cp_permutations(const Dims& d);
// Ring attention's row maps over rows of hs columns: kv_gather [2 N KVl] takes the rank's keys
// and values [N, 2, KVl, hs] out of q | k | v [N, 3, NHl, hs] (its K/V heads once, the repeat's
// first copy), dkv_scatter [3 N NHl] puts their gradients back into that first copy (-1
// elsewhere: Kernels::moe_gather_backward with k = 1). Concatenated in that order.
std::vector<std::int32_t> ring_indices(const Dims& d);
// Elements of the ring's key-value block [N, 2, KVl, hs].
std::size_t ring_block_count(const Dims& d);
STRATA_EXPORT_END

// One block's activations; [Nl,C] pieces are the rank's token rows, [N,...] pieces all rows.
// The residual stream (xmid, SlotActs::x) and the GEMMs' inputs and outputs (the LayerNorms'
// outputs, q | k | v, the attention's output, the GELU's input and output) are in the GEMMs'
// dtype (bf16 with bf16 parameters, as Megatron-LM keeps them), so that the GEMMs, the attention
// and the LayerNorms read and write them as they are, forward and backward; each is computed in
// fp32 and rounded once. Gradients of activations stay fp32 (one [Nl,C] d(residual) in flight).
struct BlockActs {
  ActView ln1, ln1_full;       // [Nl,C] [N,C] (= ln1 without sp)
  float *ln1_mean, *ln1_rstd;  // [Nl] [Nl] (RMSNorm: no mean, null)
  // [N,3Cl] this rank's heads of q | k | v as the attention reads them (bf16 where
  // Dims::attention_bf16); a llama's after the rotary embedding, its K/V heads repeated to every
  // query head (as torchtitan's repeat_kv before its attention call)
  ActView qkv;
  ActView atty;  // [N,Cl], a GEMM input (bf16 where Dims::attention_bf16)
  // Context parallelism: qkv holds every token of the rank's sequences on its cp rank's heads
  // [B*Ta, 3Ca] (Ulysses' exchange of the projection's [N, 3Cl]), and atty_full the attention's
  // output in that layout [B*Ta, Ca], exchanged back into atty; else atty_full is atty.
  ActView atty_full;
  float* att;    // the attention's state: [B,NHl,T,T] probabilities or [B,NHl,T] log-sum-exps
  ActView xmid;  // [Nl,C]  x_in + attention projection, the residual stream
  ActView ln2, ln2_full;       // as ln1
  float *ln2_mean, *ln2_rstd;  // as ln1
  // [N,FCl] [N,Fl] the activation's input and output (the FC layers' GEMMs'): GELU's, or
  // SwiGLU's from gate | up; moe's [R,FCl] [R,Fl], the experts' rows one expert after another
  ActView fch, fch_act;
  // moe (null otherwise): the router's softmax probs [N,E], each token's experts and gates [N,k],
  // the dispatch plan's row_of [N,k] and token_of [R] (MoeDispatch), the experts' input xe [R,C]
  // (ln2's rows, in the GEMMs' dtype) and output eout [R,C]; on the host the plan's expert
  // segments (the GEMMs' row ranges) and its rows.
  float *probs = nullptr, *gates = nullptr, *eout = nullptr;
  std::int32_t *experts = nullptr, *row_of = nullptr, *token_of = nullptr;
  // moe: each whole sequence's routing choices of each expert [B,E] (the load-balancing loss's
  // counts; under context parallelism over every cp rank's tokens of it)
  std::int32_t* sequence_choices = nullptr;
  ActView xe;
  ActView sfch, sfch_act;  // moe with shared experts: their [N,2SF] gate | up, [N,SF] SwiGLU
  std::vector<std::int32_t> expert_offset, expert_rows;
  std::int64_t rows = 0;
  // Expert parallelism (ep > 1; else xg is xe, the rest empty): the rows this rank's experts
  // received, regrouped by local expert, xg [Rx,C] (the experts' GEMMs' input; fch and fch_act
  // are theirs, Rx rows), the regrouping's permutation and its inverse [Rx] (MoeExchange::order),
  // and on the host the block's exchange (its expert segments are xg's).
  ActView xg;
  std::int32_t *ep_order = nullptr, *ep_inverse = nullptr;
  MoeExchange ex;
  // gemm_in: the dtype of the GEMM inputs (the parameters').
  void carve(const Dims& d, bool with_att, DType gemm_in, Carver& c);
};

// Shared by all micro-batches, live only inside one pass call (dres: from one backward call to
// the next). Both views of the union start at the same place; the larger one is kept:
//   head view   fp32 parameters: logits [N,Vl] (the backward's d(logits)), ce [3N] (vocab-parallel
//               cross-entropy, tp > 1); bf16 parameters: ce [3R], the row statistics of one chunk
//               of R = head_chunk_rows token rows (the bf16 logits are the slot's dlogits)
//   block view  a [max(N FCl, 3N Cl)]: d(fch_act), later d(qkv) (and the discarded attention
//               output of a selective recompute); in forward a bf16 GEMM's fp32 outputs.
//               b [max(N FCl, att, N QKVl)]: d(fch), later attention's d(att) scratch, then
//               grouped-query attention's d(q | k | v) before the repeat; in forward its q | k | v
//               (moe: R rows for N in both, and b also the router's logits [N,E]), then moe's.
//               Then the shared recompute buffers: Recompute::selective one att,
//               Recompute::full one whole BlockActs.
// A block's forward writes the shared recompute buffers and nothing reads them afterwards (its
// backward recomputes them), and the head's view is dead outside the head's passes, so the two
// views can overlap.
struct Scratch {
  // bf16 parameters only (null otherwise): the matmuls' operands rounded to bf16, op_in for an
  // fp32 input [N, Cl] (atty where the attention writes fp32, Dims::attention_bf16; else none),
  // op_out for a block's d(output) [N, max(C, 4Cl)] (the head's d(logits) is already bf16, the
  // slot's dlogits; no op_out without blocks); fp32 copies of a unit's small tensors (LayerNorm
  // weights, biases) and of their gradients, small [6C + 7Cl] each. gemm_pad: the bf16 GEMMs'
  // scratchpad, the largest any of this partition's needs (oneDNN's own figure,
  // gemm_bf16_scratchpad_bytes), so that it is in the ledger and in predictions.
  bf16 *op_in, *op_out;
  float *small_params, *small_grads;
  float* gemm_pad;
  std::size_t gemm_pad_bytes;
  float* dres;     // [Nl,C] d(residual stream), carried from the head down to the embedding
  float* partial;  // [N,C] partial sums before a tp reduction (d(ln) inputs, d(atty), forward sp)
  float* full;     // [N,C] all-gathered d(residual) (sequence parallel; else = dres)
  float* shard;    // [Nl,C] reduce-scattered (sequence parallel; else = partial)
  float *logits, *ce;
  float *a, *b;
  // moe: moe_rows [max(R,N),C] d(eout), then d(xe), then the shared experts' d(ln2) (in forward
  // their output); moe_router [N,E] d(probs) | [N,E] d(logits) | [N,k] d(gates) | [B,E] the
  // load-balancing loss's per-sequence fractions
  float *moe_rows, *moe_router;
  // moe at ep > 1: two [Rx,C] staging buffers of the exchange (what arrives, what leaves); fp32
  // or, for the experts' input, in the GEMMs' dtype; the rows per expert, this rank's [E] then
  // every rank's [ep,E], in the device's memory (what a GPU transport moves)
  float *ep_a, *ep_b;
  std::int32_t* ep_counts;
  // moe at cp > 1: the routing choices per expert of each chunk of each sequence, this rank's [B,
  // 2, E] then every cp rank's [cp, B, 2, E] (moe_sequence_choices), in the device's memory
  std::int32_t* cp_counts;
  // llama blocks: the rotary table of the rank's token positions [T, hs/2, 2] (rope_table's rows
  // at cp_tokens), written once
  float* rope;
  // Context parallelism (cp > 1; else null): two staging buffers of Ulysses' all-to-alls
  // [3 N Cl] (what leaves, what arrives; fp32 or in the attention's dtype) and the exchanges'
  // row permutations (cp_permutations), written once.
  float *cp_a, *cp_b;
  std::int32_t* cp_perm;
  // Ring attention: cp_a, cp_b hold the key-value block in hand and the one arriving [N, 2, KVl,
  // hs] (in the attention's dtype), ring_dkv their gradients (fp32), ring_out the fp32 output
  // before its rounding (bf16 attention); cp_perm its ring_indices.
  float *ring_dkv[2], *ring_out;
  // cp > 1, GPT-2's embedding: the rank's rows of wpe [T, C] (fp32), then their gradients.
  float* positions;
  BlockActs shared;
  void carve(const Dims& d, Recompute r, DType param_dtype, Carver& c);
};

// fp32 access to a unit's small tensors (LayerNorm weights, biases) whatever the unit's dtype:
// its own memory when fp32; when bf16, parameters widened into the scratch and gradients summed
// in the scratch, then added into the unit by flush() (rounded once per pass).
class SmallTensors {
 public:
  SmallTensors(Kernels& k, BufferView unit, float* scratch)
      : k_(k), unit_(unit), scratch_(scratch) {}
  const float* param(std::size_t offset, std::size_t count);
  float* grad(std::size_t offset, std::size_t count);  // accumulate into it
  void flush();

 private:
  Kernels& k_;
  BufferView unit_;
  float* scratch_;
  std::size_t used_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> grads_;  // (offset in unit, count)
};

// One GEMM's weight gradient a split backward defers to the weight pass (zero-bubble pipelines):
// dw += dout^T @ inp, dout [N,OC] copied at `dout` into the slot's store (SlotActs::douts), inp
// [N,C] the slot's activation the GEMM read.
struct DeferredGemm {
  BufferView dw;
  std::size_t dout;
  ActView inp;
  int N, C, OC;
};

// Elements of the d(output)s a split backward defers per micro-batch: every block GEMM's (the
// head's weight gradient stays in the backward: it would keep a [N,Vl] d(logits) per micro-batch).
std::size_t deferred_dout_count(const Dims& d);

// What one micro-batch in flight keeps from its forward to its backward.
struct SlotActs {
  // residual stream [Nl,C], in the GEMMs' dtype: x[0] input (or embedding output) .. x[blocks]
  std::vector<ActView> x;
  // Recompute::none: a set per block; selective: a set per block whose att is the shared one;
  // full: every entry is the shared set (only x[l], the block's input, is kept).
  std::vector<BlockActs> block;
  ActView lnf, lnf_full;       // head: [Nl,C] [N,C], in the GEMMs' dtype as a block's ln1
  float *lnf_mean, *lnf_rstd;  // [Nl] [Nl]
  // The head's cross-entropy state, by parameter dtype (the other is null):
  //   fp32  probs [N,Vl], the softmax; the backward forms d(logits) from it
  //   bf16  dlogits [N,Vl] the head GEMM's bf16 logits, then bf16(softmax - onehot(target))
  //         written over them unscaled by the forward a chunk of rows at a time, scaled in place
  //         by the backward and fed to its GEMMs as it is
  float* probs;
  bf16* dlogits;
  float* losses;   // [N]
  float* aux;      // moe: [blocks,B] each block's load-balancing loss per sequence; else null
  float* grad_in;  // [Nl,C] d(input), partitions without embedding
  // split backward: the deferred GEMMs' d(output)s [deferred_dout_count] in the GEMMs' dtype,
  // and the GEMMs in the order the backward deferred them (until the weight pass); else empty
  ActView douts;
  std::vector<DeferredGemm> deferred;
  std::size_t douts_used = 0;
  void carve(const Dims& d, Recompute r, DType param_dtype, const Scratch& scratch, Carver& c,
             bool split_backward = false);
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
  // param_dtype f32 or bf16 (MixedPrecision::param): the dtype of the parameter views the passes
  // get; gradient views are f32, or bf16 with bf16 parameters.
  // tp_comm_dtype f32 or bf16 (MixedPrecision::tp_comm): what the activation collectives move;
  // bf16 at tp > 1 allocates the bf16 comm buffer (MemTag::comm_buffers, tp_comm_buffer_count).
  // The compute runs on the kernels of the memory's device (device_kernels(memory.device())).
  // split_backward: backward_block computes the input's gradients (and the norms' and biases')
  // and defers its GEMMs' weight gradients to backward_weights (validate_split_backward).
  ModelPasses(const ModelSpec& spec, int micro_batch, const Partition& part, Recompute recompute,
              DType param_dtype, DType tp_comm_dtype, MemoryLedger& memory,
              bool split_backward = false);
  std::unique_ptr<Slot> make_slot();

  const Dims& dims() const { return alloc_; }
  Recompute recompute() const { return recompute_; }
  DType param_dtype() const { return param_dtype_; }
  // Offset of block tensor k (BlockTensor) from the block's first local element.
  std::size_t block_offset(int k) const { return block_off_[k]; }
  // Run the following passes on a micro-batch of `batch` sequences (at most the allocated one;
  // exactly it when tp > 1).
  void set_batch(int batch);
  int batch() const { return run_.B; }
  float* dres() { return g_.dres; }
  // The expert-parallel exchanges of an ep_size > 1 partition (not owned).
  void set_expert_comm(ExpertParallelComm* ep) { ep_ = ep; }
  // The context-parallel group of a cp_size > 1 partition (not owned).
  void set_context_comm(ContextParallelComm* cp) { cp_ = cp; }

  // Parameters and gradients are views of a unit's elements (the embedding: wte and GPT-2's wpe,
  // none for a llama; the head: the final norm's weight (| bias), and the LM head's weight: wte
  // when tied). l: block index within the partition. forward_head also computes the per-token
  // losses.
  void forward_embedding(SlotActs& s, BufferView wte, BufferView wpe, const std::int32_t* inputs,
                         TensorParallelComm* tp);
  void forward_block(int l, SlotActs& s, BufferView p, TensorParallelComm* tp,
                     bool recomputing = false);
  void forward_head(SlotActs& s, BufferView lnf, BufferView lm_head, const std::int32_t* targets,
                    TensorParallelComm* tp);
  // dres() holds d(output) on entry of a block's backward and d(input) on return.
  void backward_head(SlotActs& s, BufferView lnf, BufferView lm_head, BufferView glnf,
                     BufferView glm_head, const std::int32_t* targets, TensorParallelComm* tp,
                     float grad_scale);
  // grad_scale: d(loss)/d(per-token loss), for moe's load-balancing loss (its gradient only).
  void backward_block(int l, SlotActs& s, BufferView p, BufferView g, TensorParallelComm* tp,
                      float grad_scale);
  void backward_embedding(BufferView gwte, BufferView gwpe, const std::int32_t* inputs,
                          TensorParallelComm* tp);
  // The weight pass of a split backward: the slot's deferred GEMMs, in order; then none is left.
  void backward_weights(SlotActs& s);
  // Sum of the per-token losses of the first `rows` token rows (after forward_head).
  double loss_sum(const SlotActs& s, std::size_t rows) const;
  // moe: the sum of SlotActs::aux (after the blocks' forwards); 0 otherwise.
  double aux_loss_sum(const SlotActs& s) const;

 private:
  // The activation collectives (never called at tp 1), in the tp comm dtype: fp32 in place, or
  // rounded into comm_, moved as bf16 and widened back.
  void all_reduce_activation(TensorParallelComm* tp, float* data, std::size_t n);
  void gather(TensorParallelComm* tp, const float* shard, float* full);
  // The same for a LayerNorm's output in bf16: moved as bf16, or with fp32 tp comm widened into
  // the scratch's shard, gathered in fp32 into partial and rounded back (the same values).
  void gather(TensorParallelComm* tp, ActView shard, ActView full);
  void scatter(TensorParallelComm* tp, float* full, float* shard);
  void row_parallel(TensorParallelComm* tp, float* out, ActView inp, BufferView w,
                    const float* bias, int icl);
  // out[N,OC] = inp[N,C] @ w[OC,C]^T (+ bias), and gelu_out = GELU(out) of out as stored when
  // given: sgemm for f32 weights, for bf16 ones Kernels::matmul_bf16_forward (bf16 operands, fp32
  // accumulation; the bias in cuBLASLt's epilogue on a GPU).
  void matmul_forward(ActView out, ActView inp, BufferView w, const float* bias, int N, int C,
                      int OC, ActView gelu_out = {});
  // dinp[N,C] = dout @ w (overwritten: a bf16 GEMM writes it with beta 0, no zeroing pass);
  // dw[OC,C] += dout^T @ inp (dw f32 or bf16); dbias += sum_n dout.
  void matmul_backward(float* dinp, BufferView dw, float* dbias, const float* dout, ActView inp,
                       BufferView w, int N, int C, int OC);
  // The same for bf16 weights and a d(output) already in bf16 (no bias): inp rounded to bf16
  // unless it is bf16.
  void matmul_backward_bf16(float* dinp, BufferView dw, const bf16* dout, ActView inp, BufferView w,
                            int N, int C, int OC);
  // Inside a split backward's block: dout [N,OC] (fp32 or bf16) copied into the slot's store and
  // dw's GEMM recorded for the weight pass.
  void defer_weight_grad(BufferView dw, const void* dout, ActView inp, int N, int C, int OC);
  // inp in bf16 for a bf16 GEMM: itself, or rounded into op_in.
  const bf16* gemm_input(ActView inp, std::size_t n);
  // matmul_backward of d(output) = GELU'(pre_gelu) * dgelu [N,OC], formed in scratch b; with bf16
  // weights in one pass that writes the bf16 operand and the bias gradient
  // (Kernels::gelu_backward_bf16_bias_grad), never the fp32 d(output).
  void gelu_matmul_backward(float* dinp, BufferView dw, float* dbias, const float* dgelu,
                            ActView pre_gelu, ActView inp, BufferView w, int N, int C, int OC);
  float* reduce_input_grad(TensorParallelComm* tp);
  // The family's pieces of a block (model_passes.cpp says which is which).
  void norm_forward(ActView out, float* mean, float* rstd, ActView inp, const float* w,
                    const float* b, int rows);
  void residual_norm_forward(ActView sum, ActView out, float* mean, float* rstd, const float* a,
                             ActView b, const float* w, const float* bias, int rows);
  void norm_backward(float* dinp, float* dw, float* db, const float* dout, ActView inp,
                     const float* w, const float* mean, const float* rstd, int rows);
  void qkv_forward(BlockActs& a, BufferView w, const float* bias);
  void qkv_backward(const BlockActs& a, BufferView w, BufferView gw, float* gbias);
  void mlp_up_forward(BlockActs& a, BufferView w, const float* bias);
  void mlp_up_backward(const BlockActs& a, BufferView w, BufferView gw, float* gbias);
  // moe's MLP: from ln2_full to y [N,C] fp32 (the experts' outputs combined; with `recomputing`
  // only up to eout), and its backward from dy [N,C] to partial.
  void moe_forward(BlockActs& a, BufferView p, float* y, bool recomputing);
  void moe_backward(const BlockActs& a, BufferView p, BufferView g, const float* dy,
                    float grad_scale);
  // The dispatch plan of a's routing choices, made on the host (MoeDispatch): its device arrays and
  // its expert segments in a; returns the choices dropped.
  std::int64_t plan_dispatch(BlockActs& a);
  // Each whole sequence's routing choices per expert from this rank's choices experts[N,k] (host)
  // and, at cp > 1, those ahead of each of its chunks: every cp rank's counts all-gathered.
  MoeSequenceChoices sequence_choices(const std::vector<std::int32_t>& experts);
  // Expert parallelism (model_passes.cpp): the block's exchange, and its two all_to_allv trips.
  void plan_exchange(BlockActs& a);
  void dispatch_rows(const BlockActs& a, ActView from, ActView staging, ActView to);
  void combine_rows(const BlockActs& a, float* from, float* staging, float* to);
  float* sublayer_output(ActView x);
  // Context parallelism: `rows` rows of Ca columns of `from` permuted into cp_a by permutation
  // `send`, all-to-all over the cp group into cp_b, permuted into `to` by `recv` (from and to of
  // one dtype; either may be cp_b, or the other).
  void cp_exchange(ActView from, ActView to, CpPerm send, CpPerm recv);
  ContextParallelComm& context_comm() const;  // the cp group's (throws if none was set)
  // The attention on a block's q | k | v (BlockActs::qkv), its output in atty (with cp > 1: over
  // whole sequences into atty_full, exchanged back into atty).
  void attention_forward(BlockActs& a);
  // Ring attention (Dims::ring): the attention of a's queries over every rank's key-value block,
  // passed around the cp group, into `out` [N, Cl] (a's atty, or scratch when recomputing) and
  // a.att's log-sum-exps; its backward from d(out) into dqkv [N, 3Cl] (zeroed).
  void ring_attention_forward(const BlockActs& a, ActView out);
  void ring_steps(const BlockActs& a, const std::function<void(int step, ActView block)>& attend,
                  const std::function<void(int step)>& then = {});
  void ring_attention_backward(const BlockActs& a, const float* dout, float* dqkv);
  // GPT-2's position rows of the rank's tokens (cp > 1: gathered into Scratch::positions) and
  // their gradients' return into gwpe's rows.
  BufferView token_positions(BufferView wpe);
  void token_positions_backward(BufferView gwpe);
  void vocab_parallel_xent(SlotActs& s, const std::int32_t* targets, TensorParallelComm* tp);
  void head_xent_bf16(SlotActs& s, const std::int32_t* targets, BufferView lm_head,
                      TensorParallelComm* tp);

  ModelSpec spec_;
  Partition part_;
  Recompute recompute_;
  DType param_dtype_;
  bool split_backward_ = false;
  SlotActs* deferring_ = nullptr;  // the slot whose block backward defers its weight gradients
  std::size_t dout_capacity_ = 0;  // split backward: elements of a slot's store (SlotActs::douts)
  Dims alloc_, run_;
  MemoryLedger& memory_;
  std::size_t block_off_[kBlockTensors] = {};
  ExpertParallelComm* ep_ = nullptr;
  ContextParallelComm* cp_ = nullptr;
  Buffer<float> scratch_memory_;
  Scratch g_;
  // bf16 tp comm only (else empty): [N,C] for an all-reduce or a gather's full rows, then with
  // sequence parallelism [Nl,C] for a reduce-scatter's output (not in place: MPI's is not).
  Buffer<bf16> comm_;
  Kernels& k_;
};

}  // namespace strata
