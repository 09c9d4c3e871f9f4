// strata SDK: the standard workload, a decoder-only transformer of the GPT-2 or the Llama family,
// or a Llama with a mixture of experts for its MLP.
//
// Parameters live per *unit*: unit 0 is the embedding (wte, and GPT-2's wpe), units 1..L are the
// transformer blocks, unit L+1 is the head (the final norm; GPT-2's LM head is tied to wte, a
// llama's is its own lm_head). All units sit in one flat parameter index space with an offset
// table, so sharding a unit is slicing its range.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/export.hpp"
#include "strata/memory.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// The model family (--arch): the block the units hold.
//   gpt2   LayerNorm, GELU MLP (biases everywhere), learned positions (wpe), full multi-head
//          attention, the LM head tied to wte.
//   llama  RMSNorm, SwiGLU MLP on a fused gate | up projection, rotary positions, grouped-query
//          attention (kv_heads K/V heads), no biases, an untied LM head (Meta's Llama 3,
//          torchtitan's model).
//   moe    the llama block with its MLP replaced by `experts` SwiGLU experts of size ffn and a
//          top-k softmax router (Mixtral's): each token's output is the gate-weighted sum of its
//          top_k experts' outputs; capacity_factor > 0 caps each expert's tokens per sequence
//          (the rest dropped and counted), 0 routes dropless; a sequence-wise load-balancing loss
//          (aux_loss_coef) is added to the objective; shared_experts always-active experts
//          (DeepSeekMoE's) beside them.
enum class Arch { gpt2, llama, moe };
// "gpt2", "llama", "moe".
const char* arch_name(Arch a);
// Parses one of the names above into *out; false (and *out untouched) for another.
bool parse_arch(const std::string& name, Arch* out);

struct ModelSpec {
  std::string preset = "custom";
  int layers = 2;   // L
  int hidden = 64;  // C
  int heads = 4;    // NH
  int seq = 64;     // T (also the number of learned positions)
  int vocab = 256;  // V
  Arch arch = Arch::gpt2;
  int kv_heads = 0;             // llama: K/V heads (grouped-query attention); 0: as many as heads
  int ffn = 0;                  // the MLP's hidden size F; 0: 4 C (GPT-2's)
  double rope_theta = 10000;    // llama, moe: the rotary base (Llama 3: 500000)
  int experts = 0;              // moe: routed experts E
  int top_k = 0;                // moe: experts per token k
  double capacity_factor = 0;   // moe: tokens per expert and sequence / (k T / E); 0: dropless
  double aux_loss_coef = 0.01;  // moe: the load-balancing loss's coefficient (alpha)
  // moe: experts every token goes through beside its top_k (DeepSeekMoE's shared experts), as
  // one SwiGLU MLP of shared_experts x ffn
  int shared_experts = 0;

  bool operator==(const ModelSpec&) const = default;
  int head_dim() const { return hidden / heads; }
  bool llama_block() const { return arch != Arch::gpt2; }  // RMSNorm, SwiGLU, rope, GQA
  int kv_head_count() const { return llama_block() && kv_heads > 0 ? kv_heads : heads; }
  int expert_count() const { return arch == Arch::moe ? experts : 0; }
  int ffn_hidden() const { return ffn > 0 ? ffn : 4 * hidden; }
  bool tied() const { return arch == Arch::gpt2; }  // the LM head reuses wte
  // Rows of the fused q | k | v projection and of the FC layer (gate | up for llama, one
  // expert's for moe).
  std::int64_t qkv_rows() const { return std::int64_t(heads + 2 * kv_head_count()) * head_dim(); }
  std::int64_t fc_rows() const { return (llama_block() ? 2LL : 1LL) * ffn_hidden(); }
  // The weights of a block's linear layers (qkv, projection, FC, FC projection; moe: the router
  // and every expert's FC and FC projection, and the shared experts').
  std::int64_t block_linear_params() const { return block_linear_params(expert_count()); }
  // The same with `experts` experts (moe; the MLP once otherwise): a token's active weights with
  // top_k.
  std::int64_t block_linear_params(int experts_counted) const {
    const std::int64_t mlp = std::int64_t(hidden) * (fc_rows() + ffn_hidden());
    const std::int64_t attention = std::int64_t(hidden) * (qkv_rows() + hidden);
    if (arch != Arch::moe) return attention + mlp;
    return attention + std::int64_t(experts) * hidden +  // the router
           (std::int64_t(experts_counted) + shared_experts) * mlp;
  }
  // Norm weights and biases of a block: GPT-2 two LayerNorms (weight, bias) and the four biases,
  // llama two RMSNorm weights.
  std::int64_t block_small_params() const {
    if (llama_block()) return 2LL * hidden;
    return 4LL * hidden + qkv_rows() + hidden + fc_rows() + hidden;
  }
  std::int64_t block_params() const { return block_linear_params() + block_small_params(); }
  // A block's parameters one token computes with: moe's top_k experts of its experts.
  std::int64_t block_active_linear_params() const {
    return block_linear_params(arch == Arch::moe ? top_k : 0);
  }
  std::int64_t block_active_params() const {
    return block_active_linear_params() + block_small_params();
  }
  // The final norm's parameters: LayerNorm weight and bias, or the RMSNorm's weight.
  std::int64_t final_norm_params() const { return (llama_block() ? 1LL : 2LL) * hidden; }
  std::int64_t total_params() const { return params_with(block_params()); }
  // The parameters one token computes with (moe's active parameters; total_params otherwise).
  std::int64_t active_params() const { return params_with(block_active_params()); }
  // N of the FLOP formula: non-embedding active parameters plus the LM-head matmul (tied or not;
  // the embedding's lookup is not a matmul).
  std::int64_t flop_params() const {
    return layers * block_active_params() + final_norm_params() + std::int64_t(vocab) * hidden;
  }
  // Training FLOPs per token = 6N + 12*L*h*s (forward + backward, attention scores included; with
  // grouped-query attention every query head still scores every position; moe: N active, the
  // router's E h included, capacity drops not subtracted).
  double flops_per_token() const {
    return 6.0 * double(flop_params()) + 12.0 * layers * double(hidden) * seq;
  }
  // Of a block's backward FLOPs, its weight gradients' share: dW = dout^T inp of each linear does
  // as many as the forward's GEMMs, 2 x the active linear parameters per token, of a backward's
  // 2 x (those + the attention's 4 h s). What a split backward defers (zero-bubble pipelines).
  double block_weight_grad_share() const {
    const double linear = 2.0 * double(block_active_linear_params());
    return linear / (2.0 * (linear + 4.0 * double(hidden) * seq));
  }

 private:
  std::int64_t params_with(std::int64_t per_block) const {
    const std::int64_t embedding = std::int64_t(vocab) * hidden;
    if (llama_block())  // wte, the blocks, the final norm, the untied LM head
      return 2 * embedding + layers * per_block + final_norm_params();
    return embedding + std::int64_t(seq) * hidden + layers * per_block + final_norm_params();
  }
};

// Throws ConfigError, one line naming the option, for sizes no model can be built from: a size not
// positive, heads not dividing hidden, K/V heads not dividing heads (or given for gpt2), an odd
// head size for rotary embeddings; for moe fewer than 2 experts, top_k not in [1, experts], a
// negative capacity factor, auxiliary coefficient or shared expert count (and any of them given
// for another family).
void validate_model_spec(const ModelSpec& spec);

// "N params", or for moe "N params, A active" (ModelSpec::active_params): what a run prints.
std::string params_text(const ModelSpec& spec);

// A named model size and the constant AdamW learning rate it trains with unless --lr is given.
struct ModelPreset {
  ModelSpec spec;  // spec.preset is the name
  double lr = 0;
};
// The model presets, smallest first: the one table behind --model, its help, the default learning
// rates, tests and benchmarks. GPT-2 family (layers, hidden, heads, seq, vocab, lr): "tiny" (2,
// 64, 4, 64, 256, 3e-3), "small" (4, 256, 4, 128, 4096, 1e-3), "gpt2-124m" (12, 768, 12, 1024,
// 50304, 6e-4; GPT-2's vocabulary padded to a multiple of 64), "gpt3-6.7b" (32, 4096, 32, 2048,
// 50304, 1.2e-4), "gpt3-175b" (96, 12288, 96, 2048, 50304, 0.6e-4). Llama family (the same, then
// kv heads, ffn, rope theta): "tiny-llama" (2, 64, 4, 64, 256, 2, 192, 1e4, 3e-3), "llama3-8b"
// (32, 4096, 32, 8192, 128256, 8, 14336, 5e5, 3e-4: 8.03B parameters), "llama3-70b" (80, 8192,
// 64, 8192, 128256, 8, 28672, 5e5, 1.5e-4: 70.6B), Meta's published shapes and learning rates.
// Mixture of experts (the llama columns, then experts, top k, capacity factor, aux coefficient):
// "tiny-moe" (2, 64, 4, 64, 256, 2, 96, 1e4, 4, 2, 0, 0.01, 3e-3), "mixtral-8x7b" (32, 4096, 32,
// 4096, 32000, 8, 14336, 1e6, 8, 2, 0, 0.02, 1e-4: 46.7B, 12.8B active), Mistral's shapes;
// "fine-moe-16b" (28, 2048, 16, 4096, 102400, 16, 1408, 1e4, 64, 6, 0, 0.001, then 2 shared
// experts, 4.2e-4: 16.9B, 2.8B active), DeepSeekMoE 16B's shape with every block a moe.
const std::vector<ModelPreset>& model_presets();
// The preset called `name`, or null.
const ModelPreset* find_model_preset(const std::string& name);
// The preset's sizes; throws ConfigError for another name.
ModelSpec model_preset(const std::string& name);
bool is_model_preset(const std::string& name);

enum class UnitKind { embedding, block, head };

struct TensorInfo {
  std::string name;  // e.g. "block3.qkv_w"
  int id = 0;        // global tensor id: the init hash key, independent of sharding
  int unit = 0;
  std::size_t offset = 0;  // in the flat parameter index space
  std::size_t count = 0;
  std::vector<int> shape;
  bool decay = false;     // AdamW weight decay applies (2-D weights only, as in GPT-2)
  float init_std = 0.0f;  // normal(0, init_std) when > 0, otherwise the constant init_value
  float init_value = 0.0f;
};

struct UnitInfo {
  std::string name;
  UnitKind kind;
  int block = -1;          // block index for UnitKind::block
  std::size_t offset = 0;  // first element in the flat parameter index space
  std::size_t count = 0;
  int first_tensor = 0;
  int num_tensors = 0;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelSpec& spec);
  // The layout of `spec`, shared: built once for the model last asked for (thread-safe). What a
  // planner that sizes many stages or candidates of one model holds instead of a copy each.
  static std::shared_ptr<const ParamLayout> of(const ModelSpec& spec);
  const std::vector<UnitInfo>& units() const { return units_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  std::size_t total() const { return total_; }
  int num_units() const { return int(units_.size()); }
  // The tensor holding flat element `index`.
  const TensorInfo& tensor_at(std::size_t index) const;

 private:
  std::vector<UnitInfo> units_;
  std::vector<TensorInfo> tensors_;
  std::size_t total_ = 0;
};

// Fill `out` with elements [begin, begin + out.size()) of the flat parameter index space, exactly
// as a full initialisation would: every element hashes (seed, tensor id, index in tensor).
void init_params(const ParamLayout& layout, std::uint64_t seed, std::size_t begin,
                 std::span<float> out);
// The same into a view of any floating dtype: bf16 elements are the fp32 values rounded to nearest
// even (what a cast of a full fp32 initialisation gives), so a bf16 replica and its fp32 master
// start consistent.
void init_params(const ParamLayout& layout, std::uint64_t seed, std::size_t begin, BufferView out);

// Mixed precision, in PyTorch FSDP's MixedPrecision vocabulary, plugin independent:
//   param   the dtype parameters are stored in for compute (and gathered in): f32, or bf16 with
//           the fp32 master copy and the AdamW state kept by the optimizer (strata/optimizer.hpp)
//   reduce  the dtype gradients are accumulated and reduced in (Megatron-LM keeps them in fp32 by
//           default, accumulate_allreduce_grads_in_fp32): f32, or bf16 (bytes on the wire halve)
//   tp_comm the dtype activations and their gradients cross model-parallel boundaries in: tensor
//           parallelism's all-reduces (row-parallel outputs, column-parallel input gradients, the
//           vocab-parallel embedding) and sequence parallelism's all-gathers / reduce-scatters,
//           and a pipeline's activation and activation-gradient sends. bf16 (Megatron-LM's
//           choice) rounds the fp32 tensor into a bf16 comm buffer, moves it and widens it back:
//           half the bytes. The cross-entropy's row statistics stay fp32 whatever it says.
// Matmuls then take bf16 operands and accumulate in fp32; LayerNorm, softmax, GELU, the residual
// stream and the loss stay fp32. --precision bf16 sets param (and, unless --tp-comm-dtype says
// otherwise, tp_comm) to bf16; --reduce-dtype sets reduce; --tp-comm-dtype sets tp_comm.
struct MixedPrecision {
  DType param = DType::f32;
  DType reduce = DType::f32;
  DType tp_comm = DType::f32;
  bool mixed() const { return param != DType::f32; }
};

// One rank's micro-batch: B sequences of T tokens and their next-token targets, row-major [B, T].
struct MicroBatch {
  const std::int32_t* inputs = nullptr;
  const std::int32_t* targets = nullptr;
  int batch = 0;
  int seq = 0;
};

// Where each unit's parameters (or gradients) live right now: ptrs[u] views unit u's elements
// (UnitInfo::count of them, in the run's param or reduce dtype), laid out as in ParamLayout. A
// strategy that shards points these at gathered buffers.
using UnitPtrs = std::vector<BufferView>;

// Activation recomputation (Megatron-LM's definitions), chosen when the model is built. Under
// tensor parallelism each rank recomputes its own slice; with sequence parallelism a block's kept
// input is the rank's token-row shard, and a full recompute repeats the block's forward
// collectives (through the same tp group, so the comm ledger counts them).
//   none       every activation of every block is kept from forward to backward.
//   full       only each block's input (the residual stream entering it) is kept; backward of
//              block l first recomputes block l's forward from that input into one set of block
//              buffers shared by all blocks, then runs its backward.
//   selective  everything is kept except the attention probabilities att[B,NH,T,T] (the term
//              quadratic in T); backward of block l recomputes them from block l's saved qkv into
//              one shared buffer, then runs the attention backward.
// Losses and gradients are the same in every mode (the same kernels run on the same inputs).
enum class Recompute { none, full, selective };
// "none", "full", "selective".
const char* recompute_name(Recompute r);
// Parses one of the names above (exact, lower case) into *out; false (and *out untouched) if the
// name is not one of them.
bool parse_recompute(const std::string& name, Recompute* out);

// How a context-parallel attention sees the whole sequence (context_parallel.hpp): ulysses, an
// all-to-all from sequence to head sharding and back (DeepSpeed-Ulysses); ring, each rank's keys
// and values passed around the cp group while every rank attends its own queries to each block
// (ring attention, Megatron-Core's cp_comm_type p2p).
enum class ContextAttention { ulysses, ring };
// "ulysses", "ring".
const char* context_attention_name(ContextAttention a);

// The sequence position of token t of a context-parallel rank's slice. Each sequence is cut into
// 2 cp chunks of seq / (2 cp) tokens and rank r holds chunks r and 2 cp - 1 - r, in that order
// (Megatron-Core's load-balanced layout: under the causal mask every rank attends as many
// query-key pairs). cp = 1: the position is t.
inline int cp_position(int seq, int cp, int cp_rank, int t) {
  if (cp == 1) return t;
  const int chunk = seq / (2 * cp);
  return t < chunk ? cp_rank * chunk + t : (2 * cp - 1 - cp_rank) * chunk + t - chunk;
}

// Which part of the model one rank computes: a contiguous unit range (a pipeline stage or chunk,
// or the whole model) with every tensor split across a tensor-parallel group of tp_size ranks
// (strata/stage_model.hpp says how), optionally with sequence parallelism; for --arch moe, its
// routed experts split across an expert-parallel group of ep_size ranks (E / ep_size experts on
// each, expert e on rank e / (E / ep_size); strata/expert_parallel.hpp).
struct Partition {
  int first_unit = 0;  // units [first_unit, last_unit]: 0 embedding, 1..L blocks, L+1 head
  int last_unit = 0;
  int tp_size = 1;
  int tp_rank = 0;
  bool sequence_parallel = false;
  int ep_size = 1;
  int ep_rank = 0;
  // Context parallelism: each sequence split over cp_size ranks, this rank (cp_rank) holding
  // seq / cp_size of its tokens (cp_position says which), its attention by cp_attention
  // (context_parallel.hpp).
  int cp_size = 1;
  int cp_rank = 0;
  ContextAttention cp_attention = ContextAttention::ulysses;
};
// All units at tp 1: the whole model (Context::model()).
Partition whole_model(const ModelSpec& spec);

// Activation bytes (MemTag::activations) of a partition for one micro-batch size and recompute
// mode: `slot` for each micro-batch in flight (what its forward keeps for its backward) and
// `scratch` once (gradients and recompute buffers, live only inside one pass). The one
// activation prediction: StageModel allocates exactly this, by running the same carve.
struct ActivationBytes {
  std::uint64_t slot = 0, scratch = 0;
  std::uint64_t total(int slots) const { return std::uint64_t(slots) * slot + scratch; }
};
// Throws ConfigError for a spec, micro-batch, partition or recompute mode that cannot be built.
// With bf16 parameters the scratch also holds the matmuls' bf16 operands and fp32 copies of a
// unit's small tensors (LayerNorm weights, biases) and of their gradients, and a slot keeps the
// head's d(logits) in bf16 instead of fp32 probabilities (the bf16 logits are written there and
// the gradient over them: no fp32 logits exist). On a device whose
// attention is fused (CUDA) the attention keeps a log-sum-exp per row, not the T x T
// probabilities. split_backward (StageModel's, for zero-bubble pipelines): a slot also keeps its
// blocks' GEMMs' d(output)s from the backward to the weight pass.
ActivationBytes predict_activations(const ModelSpec& spec, int micro_batch, const Partition& part,
                                    Recompute recompute, DType param_dtype = DType::f32,
                                    Device device = Device::cpu, bool split_backward = false);

// Throws ConfigError (one line, naming the option) if a backward cannot be split into the input's
// and the weights' passes under this recompute mode (full: the blocks' activations are not kept).
void validate_split_backward(Recompute recompute);

}  // namespace strata
STRATA_EXPORT_END
