// The one implementation of the workload's passes (see model_passes.hpp; the activation plan:
// model_plan.cpp), Megatron-LM style tensor parallelism included:
//   QKV, FC1   column-parallel (this rank's heads / rows of the 4h MLP)
//   proj, FC2  row-parallel; the partial outputs are all-reduced (reduce-scattered with sp)
//   wte        vocab-parallel embedding and LM head, vocab-parallel cross-entropy
// At tp 1 every pass is the plain kernel sequence (biases inside the GEMM calls, the fused
// softmax cross-entropy), so a pipeline of tp 1 stages is bitwise equal to the whole model.
#include "model/model_passes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/backend.hpp"
#include "backends/cpu/layers.hpp"
#include "model/moe_dispatch.hpp"
#include "strata/stage_model.hpp"
#include "strata/types.hpp"

namespace strata {
namespace {

// Tokens on a GPU are device memory the host must not read: there they were checked where they
// were made (the data source, check_token_file) and the kernels trust them.
void check_tokens(Device device, const std::int32_t* tok, std::size_t n, int V, const char* what) {
  if (device != Device::cpu) return;
  for (std::size_t i = 0; i < n; ++i)
    if (tok[i] < 0 || tok[i] >= V)
      throw Error(std::string("model: ") + what + " token " + std::to_string(tok[i]) +
                  " out of range [0, " + std::to_string(V) + ")");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ModelPasses (the plan they run on, Dims and the carves: model_plan.cpp)

ModelPasses::ModelPasses(const ModelSpec& spec, int B, const Partition& part, Recompute r,
                         DType param_dtype, DType tp_comm_dtype, MemoryLedger& memory,
                         bool split_backward)
    : spec_(spec),
      part_(part),
      recompute_(r),
      param_dtype_(param_dtype),
      split_backward_(split_backward),
      alloc_((validate_partition(spec, B, part, r, param_dtype, memory.device()),
              split_backward ? validate_split_backward(r) : void(),
              Dims(spec, B, part, memory.device()))),
      run_(alloc_),
      memory_(memory),
      k_(device_kernels(memory.device())) {
  const ParamLayout layout(spec);
  const int first = layout.units()[1].first_tensor;
  const std::vector<int>& kinds = block_tensors(spec);
  std::size_t at = 0;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    block_off_[kinds[i]] = at;
    const std::size_t n = layout.tensors()[first + int(i)].count;
    const ShardKind shard = block_shard(spec.arch, kinds[i]);
    at += shard == ShardKind::replicated ? n
          : shard == ShardKind::experts  ? n / part.ep_size
                                         : n / part.tp_size;
  }
  if (split_backward) dout_capacity_ = deferred_dout_count(alloc_);  // each slot's store
  Carver count;
  g_.carve(alloc_, r, param_dtype, count);
  scratch_memory_ = Buffer<float>(memory, MemTag::activations, count.used);
  Carver c{scratch_memory_.data(), 0};
  g_.carve(alloc_, r, param_dtype, c);
  if (g_.rope) {  // the same table on every backend: made on the host in double, then copied
    const std::size_t hs = alloc_.hs;
    std::vector<float> table(std::size_t(alloc_.Ta) * hs), local(std::size_t(alloc_.T) * hs);
    cpu::rope_table(table.data(), alloc_.Ta, int(hs), spec.rope_theta);
    const TokenPositions at = cp_tokens(alloc_, alloc_.cp_rank);  // the rank's positions' rows
    for (int t = 0; t < alloc_.T; ++t)
      std::copy_n(table.data() + std::size_t(at(t)) * hs, hs, local.data() + std::size_t(t) * hs);
    copy_bytes(memory.device(), g_.rope, local.data(), local.size() * sizeof(float));
  }
  if (g_.cp_perm) {  // context parallelism: Ulysses' row permutations or the ring's row maps
    const std::vector<std::int32_t> perm =
        alloc_.ring ? ring_indices(alloc_) : cp_permutations(alloc_);
    copy_bytes(memory.device(), g_.cp_perm, perm.data(), perm.size() * sizeof(std::int32_t));
  }
  if (tp_comm_dtype != DType::f32 && tp_comm_dtype != DType::bf16)
    throw ConfigError(std::string("model: tensor-parallel comm in ") + dtype_name(tp_comm_dtype) +
                      "; fp32 or bf16 are allowed");
  comm_ = Buffer<bf16>(memory, MemTag::comm_buffers, tp_comm_buffer_count(alloc_, tp_comm_dtype));
}

std::unique_ptr<ModelPasses::Slot> ModelPasses::make_slot() {
  auto s = std::make_unique<Slot>();
  Carver count;
  s->acts.carve(alloc_, recompute_, param_dtype_, g_, count, split_backward_);
  s->memory = Buffer<float>(memory_, MemTag::activations, count.used);
  Carver c{s->memory.data(), 0};
  s->acts.carve(alloc_, recompute_, param_dtype_, g_, c, split_backward_);
  return s;
}

void ModelPasses::set_batch(int batch) {
  const bool exact = alloc_.tp > 1 || alloc_.cp > 1;  // their exchanges are planned for B
  if (batch <= 0 || batch > alloc_.B || (exact && batch != alloc_.B))
    throw Error("model: micro-batch of " + std::to_string(batch) + " sequences, built for " +
                std::to_string(alloc_.B) + (exact ? " (exactly, with tp or cp)" : " at most"));
  if (batch != run_.B) run_ = Dims(spec_, batch, part_, memory_.device());
}

double ModelPasses::loss_sum(const SlotActs& s, std::size_t rows) const {
  return k_.sum(s.losses, rows);
}

double ModelPasses::aux_loss_sum(const SlotActs& s) const {
  return s.aux ? k_.sum(s.aux, std::size_t(run_.blocks) * run_.B) : 0.0;
}

// --- tensor-parallel communication (never called at tp 1). Activations and their gradients move
// in the tp comm dtype (MixedPrecision::tp_comm); with bf16, the fp32 tensor is rounded into the
// comm buffer, the collective sums bf16 (every transport reduces bf16, as for --reduce-dtype bf16)
// and the result is widened back, so the passes around it stay fp32.

void ModelPasses::all_reduce_activation(TensorParallelComm* tp, float* data, std::size_t n) {
  if (comm_.size() == 0) return tp->all_reduce_sum(view(data, n));
  k_.round_to_bf16(comm_.data(), data, n);
  tp->all_reduce_sum(view(comm_.data(), n));
  k_.widen_bf16(data, comm_.data(), n);
}

void ModelPasses::gather(TensorParallelComm* tp, const float* shard,
                         float* full) {  // [Nl,C] -> [N,C]
  const std::size_t nl = run_.Nl * run_.C, n = run_.N * run_.C;
  if (comm_.size() == 0) return tp->all_gather(view(const_cast<float*>(shard), nl), view(full, n));
  bf16* mine = comm_.data() + std::size_t(part_.tp_rank) * nl;  // in place: the rank's own slot
  k_.round_to_bf16(mine, shard, nl);
  tp->all_gather(view(mine, nl), view(comm_.data(), n));
  k_.widen_bf16(full, comm_.data(), n);
}

void ModelPasses::gather(TensorParallelComm* tp, ActView shard, ActView full) {
  if (!shard.is_bf16()) return gather(tp, shard.f32(), full.f32());
  const std::size_t nl = run_.Nl * run_.C, n = run_.N * run_.C;
  if (comm_.size() != 0) return tp->all_gather(view(shard.half(), nl), view(full.half(), n));
  k_.widen_bf16(g_.shard, shard.half(), nl);
  tp->all_gather(view(g_.shard, nl), view(g_.partial, n));
  k_.round_to_bf16(full.half(), g_.partial, n);
}

void ModelPasses::scatter(TensorParallelComm* tp, float* full,
                          float* shard) {  // [N,C] partial -> [Nl,C]
  const std::size_t nl = run_.Nl * run_.C, n = run_.N * run_.C;
  if (comm_.size() == 0) return tp->reduce_scatter(view(full, n), view(shard, nl));
  k_.round_to_bf16(comm_.data(), full, n);
  tp->reduce_scatter(view(comm_.data(), n), view(comm_.data() + n, nl));
  k_.widen_bf16(shard, comm_.data() + n, nl);
}

// --- dtype-aware pieces: the GEMMs and a unit's small tensors

const bf16* ModelPasses::gemm_input(ActView inp, std::size_t n) {
  if (inp.is_bf16()) return inp.half();
  k_.round_to_bf16(g_.op_in, inp.f32(), n);
  return g_.op_in;
}

// With bf16 outputs a backend that rounds apart from the GEMM computes the fp32 values in a, free
// in every forward (a block's backward scratch) and large enough for the FC layer's [N, 4Cl] and
// the QKV layer's [N, 3Cl].
void ModelPasses::matmul_forward(ActView out, ActView inp, BufferView w, const float* bias, int N,
                                 int C, int OC, ActView gelu_out) {
  if (w.dtype == DType::f32) {
    k_.matmul_forward(out.f32(), inp.f32(), static_cast<const float*>(w.data), bias, N, C, OC);
    if (gelu_out.data) k_.gelu_forward(gelu_out, out, std::int64_t(N) * OC);
    return;
  }
  k_.matmul_bf16_forward(out, gelu_out, gemm_input(inp, std::size_t(N) * C),
                         static_cast<const bf16*>(w.data), bias, N, C, OC, g_.gemm_pad,
                         g_.gemm_pad_bytes, g_.a);
}

void ModelPasses::matmul_backward(float* dinp, BufferView dw, float* dbias, const float* dout,
                                  ActView inp, BufferView w, int N, int C, int OC) {
  if (w.dtype == DType::f32 && dw.dtype == DType::f32) {
    k_.zero(dinp, std::size_t(N) * C);  // the fp32 kernel accumulates
    float* dweight = static_cast<float*>(dw.data);
    if (deferring_) {  // d(input) and the bias now, the weight gradient in the weight pass
      defer_weight_grad(dw, dout, inp, N, C, OC);
      dweight = nullptr;
    }
    k_.matmul_backward(dinp, dweight, dbias, dout, inp.f32(), static_cast<const float*>(w.data), N,
                       C, OC);
    return;
  }
  if (dbias)  // one pass over dout for the operand and the bias gradient
    k_.round_to_bf16_bias_grad(g_.op_out, dbias, dout, std::size_t(N), OC);
  else
    k_.round_to_bf16(g_.op_out, dout, std::size_t(N) * OC);
  matmul_backward_bf16(dinp, dw, g_.op_out, inp, w, N, C, OC);
}

void ModelPasses::matmul_backward_bf16(float* dinp, BufferView dw, const bf16* dout, ActView inp,
                                       BufferView w, int N, int C, int OC) {
  k_.gemm_bf16(false, false, N, C, OC, dout, static_cast<const bf16*>(w.data), dinp, DType::f32,
               false, g_.gemm_pad, g_.gemm_pad_bytes);  // dout@W
  if (deferring_) return defer_weight_grad(dw, dout, inp, N, C, OC);
  k_.gemm_bf16(true, false, OC, C, N, dout, gemm_input(inp, std::size_t(N) * C), dw.data, dw.dtype,
               true, g_.gemm_pad, g_.gemm_pad_bytes);  // dout^T @ inp
}

void ModelPasses::defer_weight_grad(BufferView dw, const void* dout, ActView inp, int N, int C,
                                    int OC) {
  SlotActs& s = *deferring_;
  const std::size_t n = std::size_t(N) * OC, at = s.douts_used;
  if (at + n > dout_capacity_)
    throw Error("model: the split backward's store holds " + std::to_string(dout_capacity_) +
                " elements, " + std::to_string(at + n) + " needed");
  const std::size_t size = dtype_size(param_dtype_);
  copy_bytes(memory_.device(), static_cast<char*>(s.douts.data) + at * size, dout, n * size);
  s.deferred.push_back({dw, at, inp, N, C, OC});
  s.douts_used = (at + n + 15) / 16 * 16;
}

void ModelPasses::backward_weights(SlotActs& s) {
  const std::size_t size = dtype_size(param_dtype_);
  for (const DeferredGemm& g : s.deferred) {
    const void* dout = static_cast<const char*>(s.douts.data) + g.dout * size;
    if (param_dtype_ == DType::f32)
      k_.matmul_backward(nullptr, static_cast<float*>(g.dw.data), nullptr,
                         static_cast<const float*>(dout), g.inp.f32(), nullptr, g.N, g.C, g.OC);
    else
      k_.gemm_bf16(true, false, g.OC, g.C, g.N, static_cast<const bf16*>(dout),
                   gemm_input(g.inp, std::size_t(g.N) * g.C), g.dw.data, g.dw.dtype, true,
                   g_.gemm_pad, g_.gemm_pad_bytes);  // dout^T @ inp
  }
  s.deferred.clear();
  s.douts_used = 0;
}

void ModelPasses::gelu_matmul_backward(float* dinp, BufferView dw, float* dbias, const float* dgelu,
                                       ActView pre_gelu, ActView inp, BufferView w, int N, int C,
                                       int OC) {
  const std::size_t n = std::size_t(N) * OC;
  if (w.dtype == DType::f32 && dw.dtype == DType::f32) {
    k_.zero(g_.b, n);
    k_.gelu_backward(g_.b, pre_gelu.f32(), dgelu, std::int64_t(n));
    matmul_backward(dinp, dw, dbias, g_.b, inp, w, N, C, OC);
    return;
  }
  k_.gelu_backward_bf16_bias_grad(g_.op_out, dbias, g_.b, pre_gelu, dgelu, std::size_t(N), OC);
  matmul_backward_bf16(dinp, dw, g_.op_out, inp, w, N, C, OC);
}

const float* SmallTensors::param(std::size_t offset, std::size_t count) {
  if (unit_.dtype == DType::f32) return static_cast<const float*>(unit_.data) + offset;
  float* out = scratch_ + used_;
  used_ += count;
  k_.widen_bf16(out, static_cast<const bf16*>(unit_.data) + offset, count);
  return out;
}

float* SmallTensors::grad(std::size_t offset, std::size_t count) {
  if (unit_.dtype == DType::f32) return static_cast<float*>(unit_.data) + offset;
  float* out = scratch_ + used_;
  used_ += count;
  k_.zero(out, count);
  grads_.emplace_back(offset, count);
  return out;
}

void SmallTensors::flush() {
  const float* src = scratch_;
  for (auto [offset, count] : grads_) {
    k_.add_into_bf16(static_cast<bf16*>(unit_.data) + offset, src, count);
    src += count;
  }
  grads_.clear();
  used_ = 0;
}

// Where a sub-block's fp32 output [Nl,C] (the attention's or the MLP's projection, the embedding's
// rows) is formed before it is added to the residual stream `x`: in x itself when fp32, else in
// the scratch's shard, free in every forward from the row-parallel matmul to the residual add
// (the rank's rows after a reduce-scatter; = partial without sequence parallelism).
float* ModelPasses::sublayer_output(ActView x) { return x.is_bf16() ? g_.shard : x.f32(); }

// Row-parallel matmul (proj, FC2): out[Nl,C] = reduce(inp[N,ICl] @ W[C,ICl]^T) + bias. At tp 1
// the bias goes into the GEMM call.
void ModelPasses::row_parallel(TensorParallelComm* tp, float* out, ActView inp, BufferView w,
                               const float* bias, int icl) {
  const Dims& d = run_;
  if (d.tp == 1) {
    matmul_forward(out, inp, w, bias, int(d.N), icl, d.C);
    return;
  }
  if (d.sp) {
    matmul_forward(g_.partial, inp, w, nullptr, int(d.N), icl, d.C);
    scatter(tp, g_.partial, out);
  } else {
    matmul_forward(out, inp, w, nullptr, int(d.N), icl, d.C);
    all_reduce_activation(tp, out, d.N * d.C);
  }
  if (bias) k_.add_bias(out, bias, d.Nl, d.C);
}

// d(input of a column-parallel matmul): partial [N,C] in g_.partial -> the rank's rows, summed.
float* ModelPasses::reduce_input_grad(TensorParallelComm* tp) {
  if (run_.tp == 1) return g_.partial;
  if (run_.sp) {
    scatter(tp, g_.partial, g_.shard);
    return g_.shard;
  }
  all_reduce_activation(tp, g_.partial, run_.N * run_.C);
  return g_.partial;
}

namespace {
// Unit view from element `offset` on (a GEMM weight or its gradient).
BufferView at(BufferView unit, std::size_t offset) {
  return slice(unit, offset, unit.count - offset);
}
}  // namespace

namespace {
// A scratch buffer as an activation of `dtype`.
ActView as_act(float* p, DType dtype) {
  return dtype == DType::bf16 ? ActView(reinterpret_cast<bf16*>(p)) : ActView(p);
}
}  // namespace

// The norms: GPT-2's LayerNorm (mean, bias) or a llama's RMSNorm (neither: mean and bias null).
void ModelPasses::norm_forward(ActView out, float* mean, float* rstd, ActView inp, const float* w,
                               const float* b, int rows) {
  if (run_.llama) return k_.rmsnorm_forward(out, rstd, inp, w, rows, run_.C);
  k_.layernorm_forward(out, mean, rstd, inp, w, b, rows, run_.C);
}

// sum = a + b (the residual add), then the norm of the sum as stored (fused for LayerNorm).
void ModelPasses::residual_norm_forward(ActView sum, ActView out, float* mean, float* rstd,
                                        const float* a, ActView b, const float* w,
                                        const float* bias, int rows) {
  if (!run_.llama)
    return k_.residual_layernorm_forward(sum, out, mean, rstd, a, b, w, bias, rows, run_.C);
  k_.residual_forward(sum, a, b, std::int64_t(rows) * run_.C);
  k_.rmsnorm_forward(out, rstd, sum, w, rows, run_.C);
}

void ModelPasses::norm_backward(float* dinp, float* dw, float* db, const float* dout, ActView inp,
                                const float* w, const float* mean, const float* rstd, int rows) {
  if (run_.llama) return k_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, rows, run_.C);
  k_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, rows, run_.C);
}

// q | k | v as the attention reads them (BlockActs::qkv): the projection; a llama's then turns q
// and k by the rotary embedding (their NHl + KVl heads are adjacent from column 0) and, with
// grouped-query attention, repeats K/V to every query head from the projection's output in b.
// With context parallelism they are formed for the rank's tokens (at their positions: the rotary
// table's rows are the rank's); Ulysses' in cp_b, exchanged into a.qkv's whole sequences, or
// with ulysses_kv exchanged in b before the repeat (K/V heads sent once).
void ModelPasses::qkv_forward(BlockActs& a, BufferView w, const float* bias) {
  const Dims& d = run_;
  const bool gqa = d.KVl != d.NHl;
  const bool ulysses = d.cp > 1 && !d.ring;
  if (d.ulysses_kv) {
    const ActView out = as_act(g_.b, a.qkv.dtype);
    matmul_forward(out, a.ln1_full, w, bias, int(d.N), d.C, int(d.QKVl));
    k_.rope_forward(out, g_.rope, int(d.N), d.T, 0, int(d.NHl + d.KVl), int(d.hs), int(d.QKVl));
    cp_exchange(out, out, qkv_send, qkv_full);  // [B, Ta, NHa + 2 KVa] heads
    k_.repeat_kv_forward(a.qkv, out, d.B * d.Ta, int(d.NHa), int(d.KVa), int(d.hs));
    return;
  }
  const ActView qkv = ulysses ? as_act(g_.cp_b, a.qkv.dtype) : a.qkv;
  const ActView out = gqa ? as_act(g_.b, a.qkv.dtype) : qkv;
  matmul_forward(out, a.ln1_full, w, bias, int(d.N), d.C, int(d.QKVl));
  if (d.llama) {
    k_.rope_forward(out, g_.rope, int(d.N), d.T, 0, int(d.NHl + d.KVl), int(d.hs), int(d.QKVl));
    if (gqa) k_.repeat_kv_forward(qkv, out, int(d.N), int(d.NHl), int(d.KVl), int(d.hs));
  }
  if (ulysses) cp_exchange(qkv, a.qkv, qkv_send, qkv_full);
}

ContextParallelComm& ModelPasses::context_comm() const {
  if (!cp_)
    throw Error("model: a context-parallel partition (cp " + std::to_string(run_.cp) +
                ") was run without StageModel::set_context_comm");
  return *cp_;
}

void ModelPasses::cp_exchange(ActView from, ActView to, CpPerm send, CpPerm recv) {
  const Dims& d = run_;
  ContextParallelComm& comm = context_comm();
  const std::size_t rows = cp_perm_rows(d, send), cols = cp_perm_cols(d, send), n = rows * cols;
  const ActView out = as_act(g_.cp_a, from.dtype), in = as_act(g_.cp_b, from.dtype);
  k_.moe_gather(out, from, g_.cp_perm + cp_perm_offset(d, send), int(rows), int(cols));
  const Device device = memory_.device();
  comm.all_to_all({out.data, n, from.dtype, device}, {in.data, n, from.dtype, device});
  const std::int32_t* back = g_.cp_perm + cp_perm_offset(d, recv);
  if (recv == dqkv_local && d.kv_copies > 1) {  // the K/V copies' gradients summed
    const std::size_t local = cp_perm_rows(d, recv) / d.kv_copies;
    k_.zero(to.f32(), local * cols);
    return k_.moe_gather_backward(to.f32(), in.f32(), back, int(local), int(d.kv_copies),
                                  int(cols));
  }
  k_.moe_gather(to, in, back, int(rows), int(cols));
}

void ModelPasses::attention_forward(BlockActs& a) {
  const Dims& d = run_;
  if (d.ring) return ring_attention_forward(a, a.atty);
  k_.attention_forward(a.atty_full, a.att, a.qkv, d.B, d.Ta, int(d.Ca), int(d.NHa));
  if (d.cp > 1) cp_exchange(a.atty_full, a.atty, out_send, out_local);
}

// Ring attention. Step s attends the rank's queries to the key-value block of cp rank
// (rank - s) mod cp, which arrived in the previous step, while the comm passes it on to the next
// rank. The kv blocks are the rank's K/V heads of q | k | v gathered once (ring_indices). `then`
// (if given) runs at the end of each step, once the block has passed.
void ModelPasses::ring_steps(const BlockActs& a,
                             const std::function<void(int step, ActView block)>& attend,
                             const std::function<void(int step)>& then) {
  const Dims& d = run_;
  ContextParallelComm& comm = context_comm();
  const Device device = memory_.device();
  const ActView kv[2] = {as_act(g_.cp_a, a.qkv.dtype), as_act(g_.cp_b, a.qkv.dtype)};
  const std::size_t n = ring_block_count(d);
  k_.moe_gather(kv[0], a.qkv, g_.cp_perm, int(2 * d.N * d.KVl), int(d.hs));
  for (int s = 0; s < d.cp; ++s) {
    const ActView in_hand = kv[s % 2], arriving = kv[(s + 1) % 2];
    if (s + 1 < d.cp)
      comm.ring_start({in_hand.data, n, in_hand.dtype, device},
                      {arriving.data, n, arriving.dtype, device});
    attend(s, in_hand);
    if (s + 1 < d.cp) comm.ring_wait();
    if (then) then(s);
  }
}

void ModelPasses::ring_attention_forward(const BlockActs& a, ActView out) {
  const Dims& d = run_;
  const int cp = d.cp, r = d.cp_rank;
  float* o = out.is_bf16() ? g_.ring_out : out.f32();
  ring_steps(a, [&](int s, ActView block) {
    k_.attention_block_forward(o, a.att, a.qkv, int(3 * d.Cl), block, d.B, d.T, d.T, int(d.NHl),
                               int(d.KVl), int(d.hs), cp_tokens(d, r),
                               cp_tokens(d, (r - s + cp) % cp), s == 0);
  });
  if (out.is_bf16()) k_.round_to_bf16(out.half(), o, d.N * d.Cl);
}

// Its backward: the blocks pass again; each block's gradient travels with it, gathering every
// rank's share, and one more pass brings it home, where it joins d(q) in dqkv's K/V heads.
void ModelPasses::ring_attention_backward(const BlockActs& a, const float* dout, float* dqkv) {
  const Dims& d = run_;
  const int cp = d.cp, r = d.cp_rank;
  const std::size_t n = ring_block_count(d);
  const Device device = memory_.device();
  k_.zero(g_.ring_dkv[0], n);
  ring_steps(
      a,
      [&](int s, ActView block) {
        k_.attention_block_backward(dqkv, int(3 * d.Cl), g_.ring_dkv[s % 2], dout, a.atty_full,
                                    a.att, a.qkv, int(3 * d.Cl), block, d.B, d.T, d.T, int(d.NHl),
                                    int(d.KVl), int(d.hs), cp_tokens(d, r),
                                    cp_tokens(d, (r - s + cp) % cp));
      },
      [&](int s) {  // the block's d(k | v) on with it
        ContextParallelComm& comm = context_comm();
        comm.ring_start({g_.ring_dkv[s % 2], n, DType::f32, device},
                        {g_.ring_dkv[(s + 1) % 2], n, DType::f32, device});
        comm.ring_wait();
      });
  k_.moe_gather_backward(dqkv, g_.ring_dkv[cp % 2], g_.cp_perm + 2 * d.N * d.KVl,
                         int(3 * d.N * d.NHl), 1, int(d.hs));
}

// Its backward from d(q | k | v) [N,3Cl] in a: the repeat's sums (into b), the rotation back,
// then the projection's backward into partial.
void ModelPasses::qkv_backward(const BlockActs& a, BufferView w, BufferView gw, float* gbias) {
  const Dims& d = run_;
  float* dqkv = d.ulysses_kv ? g_.b : g_.a;  // ulysses_kv: K/V's already summed, exchanged
  if (d.KVl != d.NHl && !d.ulysses_kv) {
    k_.repeat_kv_backward(g_.b, g_.a, int(d.N), int(d.NHl), int(d.KVl), int(d.hs));
    dqkv = g_.b;
  }
  if (d.llama)
    k_.rope_backward(dqkv, g_.rope, int(d.N), d.T, 0, int(d.NHl + d.KVl), int(d.hs), int(d.QKVl));
  matmul_backward(g_.partial, gw, gbias, dqkv, a.ln1_full, w, int(d.N), d.C, int(d.QKVl));
}

// The MLP up to its activation's output: FC with GELU in its epilogue (GPT-2), or gate | up
// then SwiGLU (llama).
void ModelPasses::mlp_up_forward(BlockActs& a, BufferView w, const float* bias) {
  const Dims& d = run_;
  if (!d.llama)
    return matmul_forward(a.fch, a.ln2_full, w, bias, int(d.N), d.C, int(d.FCl), a.fch_act);
  matmul_forward(a.fch, a.ln2_full, w, nullptr, int(d.N), d.C, int(d.FCl));
  k_.swiglu_forward(a.fch_act, a.fch, int(d.N), int(d.Fl));
}

// Its backward from d(fch_act) in a into partial (d(fch) formed in b).
void ModelPasses::mlp_up_backward(const BlockActs& a, BufferView w, BufferView gw, float* gbias) {
  const Dims& d = run_;
  const int N = int(d.N), C = d.C, FC = int(d.FCl);
  if (!d.llama)
    return gelu_matmul_backward(g_.partial, gw, gbias, g_.a, a.fch, a.ln2_full, w, N, C, FC);
  k_.zero(g_.b, d.N * d.FCl);
  k_.swiglu_backward(g_.b, a.fch, g_.a, N, int(d.Fl));
  matmul_backward(g_.partial, gw, nullptr, g_.b, a.ln2_full, w, N, C, FC);
}

// moe's dispatch plan: the routing choices read back to the host (a synchronisation on a GPU, as
// in Megatron-LM's dropless token counts), the plan made there and its rows sent back.
std::int64_t ModelPasses::plan_dispatch(BlockActs& a) {
  const Dims& d = run_;
  const Device device = memory_.device();
  const std::size_t choices = d.N * std::size_t(d.topk);
  std::vector<std::int32_t> experts(choices);
  copy_bytes(device, experts.data(), a.experts, choices * sizeof(std::int32_t));
  const MoeSequenceChoices sequences = sequence_choices(experts);
  copy_bytes(device, a.sequence_choices, sequences.sequence.data(),
             sequences.sequence.size() * sizeof(std::int32_t));
  MoeDispatch plan =
      moe_dispatch(experts.data(), d.B, d.T, d.E, d.topk, d.capacity, sequences.split);
  copy_bytes(device, a.row_of, plan.row_of.data(), choices * sizeof(std::int32_t));
  copy_bytes(device, a.token_of, plan.token_of.data(), plan.token_of.size() * sizeof(std::int32_t));
  a.expert_offset = std::move(plan.offset);
  a.expert_rows = std::move(plan.count);
  a.rows = plan.rows();
  return plan.dropped;
}

namespace {
// Host counts `mine` all-gathered over a group (ep's or cp's comm): staged through `staging` in
// the device's memory ([size + 1] x mine: this rank's, then every rank's, which a GPU transport
// moves), every rank's returned rank after rank.
template <class Comm>
std::vector<std::int32_t> all_gather_counts(Comm& comm, const std::vector<std::int32_t>& mine,
                                            std::int32_t* staging, Device device) {
  const std::size_t n = mine.size(), every = n * std::size_t(comm.size());
  std::vector<std::int32_t> all(every);
  copy_bytes(device, staging, mine.data(), n * sizeof(std::int32_t));
  comm.all_gather({staging, n, DType::i32, device}, {staging + n, every, DType::i32, device});
  copy_bytes(device, all.data(), staging + n, every * sizeof(std::int32_t));
  return all;
}
}  // namespace

MoeSequenceChoices ModelPasses::sequence_choices(const std::vector<std::int32_t>& experts) {
  const Dims& d = run_;
  std::vector<std::int32_t> mine =
      moe_chunk_choices(experts.data(), d.B, d.T, d.E, d.topk, d.cp > 1 ? 2 : 1);
  if (d.cp == 1) return moe_sequence_choices(mine, 1, 0, d.B, d.E);
  if (!cp_)
    throw Error("model: a context-parallel moe partition (cp " + std::to_string(d.cp) +
                ") was run without StageModel::set_context_comm");
  return moe_sequence_choices(all_gather_counts(*cp_, mine, g_.cp_counts, memory_.device()), d.cp,
                              d.cp_rank, d.B, d.E);
}

namespace {
// Element `offset` on of an activation.
ActView act_at(ActView v, std::size_t offset) {
  return v.is_bf16() ? ActView(v.half() + offset) : ActView(v.f32() + offset);
}
// f(local expert e, its first row r0 of xg, rows) for each of this rank's experts with rows: the
// dispatch plan's segments, or at ep > 1 the regrouped received rows'.
template <class F>
void each_expert_rows(const BlockActs& a, F&& f) {
  const bool ep = !a.ex.recv_rows.empty();  // an exchange was planned: ep > 1
  const std::vector<std::int32_t>& rows = ep ? a.ex.expert_rows : a.expert_rows;
  const std::vector<std::int32_t>& offset = ep ? a.ex.expert_offset : a.expert_offset;
  for (std::size_t e = 0; e < rows.size(); ++e)
    if (rows[e] > 0) f(e, std::size_t(offset[e]), rows[e]);
}
// Elements of `rows` rows of C.
std::vector<std::size_t> row_elements(const std::vector<std::int64_t>& rows, int C) {
  std::vector<std::size_t> n;
  for (std::int64_t r : rows) n.push_back(std::size_t(r) * std::size_t(C));
  return n;
}
BufferView rows_view(ActView v, std::size_t rows, int C, Device device) {
  return {v.data, rows * std::size_t(C), v.dtype, device};
}
}  // namespace

// Expert parallelism: every rank's rows per expert all-gathered over ep, this block's exchange
// (MoeExchange), and the regrouping's permutation and its inverse copied to the device.
void ModelPasses::plan_exchange(BlockActs& a) {
  const Dims& d = run_;
  if (!ep_)
    throw Error("model: an expert-parallel partition (ep " + std::to_string(d.ep) +
                ") was run without StageModel::set_expert_comm");
  const Device device = memory_.device();
  a.ex = moe_exchange(all_gather_counts(*ep_, a.expert_rows, g_.ep_counts, device), part_.ep_rank,
                      d.ep, d.E);
  const std::size_t n = a.ex.order.size();
  std::vector<std::int32_t> inverse(n);
  for (std::size_t i = 0; i < n; ++i) inverse[std::size_t(a.ex.order[i])] = std::int32_t(i);
  copy_bytes(device, a.ep_order, a.ex.order.data(), n * sizeof(std::int32_t));
  copy_bytes(device, a.ep_inverse, inverse.data(), n * sizeof(std::int32_t));
}

// Rows [rows, C] of this rank's plan (in expert order, so rank by rank) to the ranks holding their
// experts; the rows from every rank arrive in `staging`, source by source, and are regrouped by
// local expert into `to` [Rx, C].
void ModelPasses::dispatch_rows(const BlockActs& a, ActView from, ActView staging, ActView to) {
  const int C = run_.C;
  const std::size_t n = a.ex.order.size();
  const Device device = memory_.device();
  ep_->all_to_allv(rows_view(from, std::size_t(a.rows), C, device), row_elements(a.ex.send_rows, C),
                   rows_view(staging, n, C, device), row_elements(a.ex.recv_rows, C));
  k_.moe_gather(to, staging, a.ep_order, int(n), C);
}

// The inverse: rows regrouped by local expert (`from` [Rx, C], fp32) back to the ranks whose
// tokens they are, into `to` [rows, C] in this rank's plan order.
void ModelPasses::combine_rows(const BlockActs& a, float* from, float* staging, float* to) {
  const int C = run_.C;
  const std::size_t n = a.ex.order.size();
  const Device device = memory_.device();
  k_.moe_gather(staging, from, a.ep_inverse, int(n), C);
  ep_->all_to_allv(rows_view(staging, n, C, device), row_elements(a.ex.recv_rows, C),
                   rows_view(to, std::size_t(a.rows), C, device), row_elements(a.ex.send_rows, C));
}

// The router (its logits in b, fp32), top-k, the plan; then each expert's gate | up, SwiGLU and
// down on its rows of xe (ln2's rows gathered), and the gate-weighted sum of each token's experts,
// plus the shared experts' MLP of every token (formed in moe_rows).
void ModelPasses::moe_forward(BlockActs& a, BufferView p, float* y, bool recomputing) {
  const Dims& d = run_;
  const int N = int(d.N), C = d.C, E = d.E, k = d.topk, F = int(d.Fl), FC = int(d.FCl);
  const std::size_t* o = block_off_;
  matmul_forward(g_.b, a.ln2_full, at(p, o[kRouterW]), nullptr, N, C, E);
  k_.router_topk_forward(a.probs, a.experts, a.gates, g_.b, N, E, k);
  const std::int64_t dropped = plan_dispatch(a);
  if (!recomputing) add_moe_routing(std::int64_t(N) * k, dropped);
  k_.moe_gather(a.xe, a.ln2_full, a.token_of, int(a.rows), C);
  if (d.ep > 1) {  // the rows to the experts' ranks, xg the rows of this rank's experts
    plan_exchange(a);
    const ActView staging =
        a.xg.is_bf16() ? ActView(reinterpret_cast<bf16*>(g_.ep_a)) : ActView(g_.ep_a);
    dispatch_rows(a, a.xe, staging, a.xg);
  }
  const int SF = int(d.SF);
  if (SF > 0) {  // the shared experts: one SwiGLU MLP every token goes through
    matmul_forward(a.sfch, a.ln2_full, at(p, o[kSharedFcW]), nullptr, N, C, 2 * SF);
    k_.swiglu_forward(a.sfch_act, a.sfch, N, SF);
  }
  float* out = d.ep > 1 ? g_.ep_b : a.eout;  // the local experts' outputs, xg's rows
  each_expert_rows(a, [&](std::size_t e, std::size_t r0, int rows) {
    const ActView fch = act_at(a.fch, r0 * FC), act = act_at(a.fch_act, r0 * F);
    matmul_forward(fch, act_at(a.xg, r0 * C), at(p, o[kFcW] + e * FC * C), nullptr, rows, C, FC);
    k_.swiglu_forward(act, fch, rows, F);
    matmul_forward(out + r0 * C, act, at(p, o[kFcprojW] + e * C * F), nullptr, rows, F, C);
  });
  if (d.ep > 1) combine_rows(a, g_.ep_b, g_.ep_a, a.eout);  // eout: this rank's rows' outputs
  if (recomputing) return;
  k_.moe_combine(y, a.eout, a.row_of, a.gates, N, k, C);
  if (SF == 0) return;
  matmul_forward(g_.moe_rows, a.sfch_act, at(p, o[kSharedFcprojW]), nullptr, N, SF, C);
  k_.residual_forward(y, g_.moe_rows, y, std::int64_t(N) * C);  // y += the shared experts'
}

// Backward from dy [N,C]: the combine's (d(eout) in moe_rows, d(gates)), each expert's down,
// SwiGLU and gate | up (d(xe) over d(eout) in moe_rows), the router's with the load-balancing
// loss's d(probs) (its loss averaged over the global batch's sequences: grad_scale x the sequence
// length) into partial, then the dispatch's sums and the shared experts' d(ln2) into partial.
void ModelPasses::moe_backward(const BlockActs& a, BufferView p, BufferView g, const float* dy,
                               float grad_scale) {
  const Dims& d = run_;
  const int N = int(d.N), C = d.C, E = d.E, k = d.topk, F = int(d.Fl), FC = int(d.FCl);
  const std::size_t* o = block_off_;
  float* drows = g_.moe_rows;
  float *dprobs = g_.moe_router, *dlogits = dprobs + d.N * E, *dgates = dlogits + d.N * E;
  float* aux_scratch = dgates + d.N * k;
  k_.moe_combine_backward(drows, dgates, dy, a.eout, a.row_of, a.gates, N, k, C);
  // The local experts' d(output) rows, d(input) over them: d(eout) itself, or at ep > 1 what the
  // ranks whose tokens they are send back (regrouped, in ep_b)
  float* dexp = drows;
  std::size_t expert_rows = std::size_t(a.rows);
  if (d.ep > 1) {
    dispatch_rows(a, drows, g_.ep_a, g_.ep_b);
    dexp = g_.ep_b;
    expert_rows = a.ex.order.size();
  }
  each_expert_rows(a, [&](std::size_t e, std::size_t r0, int rows) {  // down: d(act) into a
    const std::size_t w = o[kFcprojW] + e * C * F;
    matmul_backward(g_.a + r0 * F, at(g, w), nullptr, dexp + r0 * C, act_at(a.fch_act, r0 * F),
                    at(p, w), rows, F, C);
  });
  k_.zero(g_.b, expert_rows * FC);
  k_.swiglu_backward(g_.b, a.fch, g_.a, int(expert_rows), F);
  each_expert_rows(a, [&](std::size_t e, std::size_t r0, int rows) {  // gate | up: d(xg) / d(out)
    const std::size_t w = o[kFcW] + e * FC * C;
    matmul_backward(dexp + r0 * C, at(g, w), nullptr, g_.b + r0 * FC, act_at(a.xg, r0 * C),
                    at(p, w), rows, C, FC);
  });
  if (d.ep > 1) combine_rows(a, g_.ep_b, g_.ep_a, drows);  // d(xe) of this rank's rows
  const float coef = float(spec_.aux_loss_coef);
  if (coef > 0)
    k_.moe_aux_loss_backward(dprobs, aux_scratch, a.sequence_choices, d.B, d.T, d.Ta, E, k,
                             coef * grad_scale * float(d.Ta));
  k_.router_topk_backward(dlogits, a.probs, a.experts, a.gates, dgates, coef > 0 ? dprobs : nullptr,
                          N, E, k);
  matmul_backward(g_.partial, at(g, o[kRouterW]), nullptr, dlogits, a.ln2_full, at(p, o[kRouterW]),
                  N, C, E);
  k_.moe_gather_backward(g_.partial, drows, a.row_of, N, k, C);
  const int SF = int(d.SF);
  if (SF == 0) return;
  // The shared experts: d(act) in a, d(gate | up) in b, d(ln2) in moe_rows, added to partial.
  matmul_backward(g_.a, at(g, o[kSharedFcprojW]), nullptr, dy, a.sfch_act, at(p, o[kSharedFcprojW]),
                  N, SF, C);
  k_.zero(g_.b, d.N * 2 * SF);
  k_.swiglu_backward(g_.b, a.sfch, g_.a, N, SF);
  matmul_backward(drows, at(g, o[kSharedFcW]), nullptr, g_.b, a.ln2_full, at(p, o[kSharedFcW]), N,
                  C, 2 * SF);
  k_.residual_forward(g_.partial, drows, g_.partial, std::int64_t(N) * C);
}

// recomputing: Recompute::full's rerun in backward, which stops at fch_act: the block's output
// (FC2, its reduction and the second residual) is not needed by the backward, x[l+1] is kept
// (moe's stops at its experts' outputs, which the combine's backward reads).
void ModelPasses::forward_block(int l, SlotActs& s, BufferView p, TensorParallelComm* tp,
                                bool recomputing) {
  const Dims& d = run_;
  const std::size_t* o = block_off_;
  BlockActs& a = s.block[l];
  const int Nl = int(d.Nl), C = d.C, Cl = int(d.Cl);
  SmallTensors small(k_, p, g_.small_params);
  auto bias = [&](int k, std::size_t n) { return d.llama ? nullptr : small.param(o[k], n); };
  const ActView x_in = s.x[l];
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, small.param(o[kLn1W], C), bias(kLn1B, C), Nl);
  if (d.sp) gather(tp, a.ln1, a.ln1_full);
  qkv_forward(a, at(p, o[kQkvW]), bias(kQkvB, d.QKVl));
  attention_forward(a);
  float* proj = sublayer_output(a.xmid);
  row_parallel(tp, proj, a.atty, at(p, o[kProjW]), bias(kProjB, C), Cl);
  residual_norm_forward(a.xmid, a.ln2, a.ln2_mean, a.ln2_rstd, proj, x_in, small.param(o[kLn2W], C),
                        bias(kLn2B, C), Nl);
  if (d.sp) gather(tp, a.ln2, a.ln2_full);
  const ActView x_out = s.x[l + 1];
  float* mlp = sublayer_output(x_out);
  if (d.moe) {
    moe_forward(a, p, mlp, recomputing);
    if (!recomputing) {  // the scratch's moe_router is free in a forward
      k_.moe_aux_loss_forward(s.aux + std::size_t(l) * d.B, g_.moe_router, a.probs,
                              a.sequence_choices, d.B, d.T, d.Ta, d.E, d.topk,
                              float(spec_.aux_loss_coef));
      // The run's per-step term: every block's at once, after the partition's last one.
      if (l == d.blocks - 1) add_moe_aux_loss(aux_loss_sum(s));
    }
  } else {
    mlp_up_forward(a, at(p, o[kFcW]), bias(kFcB, d.FCl));
    if (!recomputing)
      row_parallel(tp, mlp, a.fch_act, at(p, o[kFcprojW]), bias(kFcprojB, C), int(d.Fl));
  }
  if (recomputing) return;
  k_.residual_forward(x_out, mlp, a.xmid, std::int64_t(Nl) * C);
}

void ModelPasses::backward_block(int l, SlotActs& s, BufferView p, BufferView gr,
                                 TensorParallelComm* tp, float grad_scale) {
  const Dims& d = run_;
  const std::size_t* o = block_off_;
  // Full recompute: rebuild this block's activations from its kept input x[l] into the shared
  // buffers (disjoint from a, b and partial, which are free until the backward below starts).
  if (recompute_ == Recompute::full) forward_block(l, s, p, tp, true);
  // A split backward defers this block's GEMMs' weight gradients (backward_weights).
  struct Deferring {
    SlotActs*& at;
    ~Deferring() { at = nullptr; }
  } deferring{deferring_ = split_backward_ ? &s : nullptr};
  const BlockActs& a = s.block[l];
  const int N = int(d.N), Nl = int(d.Nl), C = d.C, Cl = int(d.Cl);
  const bool tp1 = d.tp == 1;
  SmallTensors small(k_, p, g_.small_params), gsmall(k_, gr, g_.small_grads);
  auto gbias = [&](int k, std::size_t n) { return d.llama ? nullptr : gsmall.grad(o[k], n); };
  // A row-parallel layer's bias gradient: in its GEMM's backward at tp 1, else from the rank's
  // rows of d(output) (null: returned for the GEMM).
  auto row_parallel_bias = [&](float* g) {
    if (!tp1 && g) k_.bias_grad(g, g_.dres, d.Nl, C);
    return tp1 ? g : nullptr;
  };
  // MLP: x_out = xmid + fcproj(act(fc(ln2(xmid)))). d(x_out) is all-gathered with sp.
  if (d.sp) gather(tp, g_.dres, g_.full);
  if (d.moe) {
    moe_backward(a, p, gr, g_.full, grad_scale);
  } else {
    float* g_fcproj_b = row_parallel_bias(gbias(kFcprojB, C));
    matmul_backward(g_.a, at(gr, o[kFcprojW]), g_fcproj_b, g_.full, a.fch_act, at(p, o[kFcprojW]),
                    N, int(d.Fl), C);
    mlp_up_backward(a, at(p, o[kFcW]), at(gr, o[kFcW]), gbias(kFcB, d.FCl));
  }
  const float* dln2 = reduce_input_grad(tp);
  norm_backward(g_.dres, gsmall.grad(o[kLn2W], C), gbias(kLn2B, C), dln2, a.xmid,
                small.param(o[kLn2W], C), a.ln2_mean, a.ln2_rstd, Nl);
  // Attention: xmid = x_in + proj(attention(qkv(ln1(x_in)))); d(atty) goes to partial (free).
  if (d.sp) gather(tp, g_.dres, g_.full);
  float* g_proj_b = row_parallel_bias(gbias(kProjB, C));
  float* datty = g_.partial;
  matmul_backward(datty, at(gr, o[kProjW]), g_proj_b, g_.full, a.atty, at(p, o[kProjW]), N, Cl, C);
  // Ulysses: d(atty) to whole sequences on this rank's heads, in place.
  const bool ulysses = d.cp > 1 && !d.ring;
  if (ulysses) cp_exchange(datty, datty, dout_send, dout_full);
  // Selective recompute: att was not kept; rebuild it from this block's saved qkv into the
  // shared att. The attention output it also produces (atty is kept) goes to a, free until d(qkv).
  const int Ca = int(d.Ca), NHa = int(d.NHa);
  if (recompute_ == Recompute::selective && d.ring) ring_attention_forward(a, g_.a);
  if (recompute_ == Recompute::selective && !d.ring)
    k_.attention_forward(g_.a, a.att, a.qkv, d.B, d.Ta, Ca, NHa);
  k_.zero(g_.a, 3 * d.N * d.Cl);
  if (d.ring)
    ring_attention_backward(a, datty, g_.a);
  else
    k_.attention_backward(g_.a, g_.b, datty, a.qkv, a.att, a.atty_full, d.B, d.Ta, Ca, NHa);
  // ... and d(q | k | v) back to this rank's tokens: in place, or with ulysses_kv each K/V head's
  // gradient summed over its query heads first (into b; qkv_backward takes it from there), and
  // over the ranks it was sent to on the way back (cp_exchange).
  if (d.ulysses_kv) {
    k_.repeat_kv_backward(g_.b, g_.a, d.B * d.Ta, NHa, int(d.KVa), int(d.hs));
    cp_exchange(g_.b, g_.b, dqkv_send, dqkv_local);
  } else if (ulysses) {
    cp_exchange(g_.a, g_.a, dqkv_send, dqkv_local);
  }
  qkv_backward(a, at(p, o[kQkvW]), at(gr, o[kQkvW]), gbias(kQkvB, d.QKVl));
  const float* dln1 = reduce_input_grad(tp);
  norm_backward(g_.dres, gsmall.grad(o[kLn1W], C), gbias(kLn1B, C), dln1, s.x[l],
                small.param(o[kLn1W], C), a.ln1_mean, a.ln1_rstd, Nl);
  gsmall.flush();
}

// Vocab-parallel embedding: each rank looks up the tokens of its vocab rows, the partial rows
// are summed across tp, then wpe is added per token row.
void ModelPasses::forward_embedding(SlotActs& s, BufferView wte, BufferView wpe,
                                    const std::int32_t* tok, TensorParallelComm* tp) {
  const Dims& d = run_;
  const int C = d.C;
  check_tokens(memory_.device(), tok, d.N, d.V, "input");
  const ActView x0 = s.x[0];
  if (d.tp == 1 && d.cp == 1 && wte.dtype == DType::f32 && !d.llama) {  // GPT-2's, fp32
    k_.encoder_forward(x0.f32(), tok, static_cast<const float*>(wte.data),
                       static_cast<const float*>(wpe.data), d.B, d.T, C);
    return;
  }
  float* sum = sublayer_output(x0);  // the token rows, summed over tp
  float* rows = d.sp ? g_.partial : sum;
  k_.embedding_rows(rows, tok, d.N, wte, d.Vl * part_.tp_rank, d.Vl, C);
  if (d.sp)
    scatter(tp, g_.partial, sum);
  else if (d.tp > 1)
    all_reduce_activation(tp, sum, d.N * C);
  if (!d.llama)
    k_.add_positions(x0, sum, token_positions(wpe), d.Nl, d.row0, d.T, C);
  else if (x0.is_bf16())  // rotary positions are the attention's: the rows are the stream
    k_.round_to_bf16(x0.half(), sum, d.Nl * C);
}

// With cp > 1 the rank's tokens sit at two chunks of positions (cp_tokens): their wpe rows are
// gathered into one [T, C] fp32 table (widened where bf16) that the position kernels read as a
// sequence's; their gradients are summed there and added to gwpe's rows chunk by chunk.
BufferView ModelPasses::token_positions(BufferView wpe) {
  const Dims& d = run_;
  if (d.cp == 1) return wpe;
  const TokenPositions at_ = cp_tokens(d, d.cp_rank);
  const std::size_t chunk = std::size_t(at_.chunk), C = std::size_t(d.C);
  for (int c = 0; c < 2; ++c) {
    float* rows = g_.positions + c * chunk * C;
    k_.zero(rows, chunk * C);  // rows = 0 + wpe's chunk: add_positions as a widening copy
    k_.add_positions(rows, rows, at(wpe, std::size_t(at_(int(c * chunk))) * C), chunk, 0,
                     int(chunk), int(C));
  }
  return {g_.positions, std::size_t(d.T) * C, DType::f32, memory_.device()};
}

void ModelPasses::token_positions_backward(BufferView gwpe) {
  const Dims& d = run_;
  if (d.cp == 1) return k_.positions_backward(gwpe, g_.dres, d.Nl, d.row0, d.T, d.C);
  const TokenPositions at_ = cp_tokens(d, d.cp_rank);
  const std::size_t chunk = std::size_t(at_.chunk), C = std::size_t(d.C), n = std::size_t(d.T) * C;
  k_.zero(g_.positions, n);
  k_.positions_backward({g_.positions, n, DType::f32, memory_.device()}, g_.dres, d.Nl, d.row0, d.T,
                        d.C);
  for (int c = 0; c < 2; ++c)
    k_.positions_backward(at(gwpe, std::size_t(at_(int(c * chunk))) * C),
                          g_.positions + c * chunk * C, chunk, 0, int(chunk), d.C);
}

void ModelPasses::backward_embedding(BufferView gwte, BufferView gwpe, const std::int32_t* tok,
                                     TensorParallelComm* tp) {
  const Dims& d = run_;
  const int C = d.C;
  if (d.tp == 1 && d.cp == 1 && gwte.dtype == DType::f32 && !d.llama) {
    k_.encoder_backward(static_cast<float*>(gwte.data), static_cast<float*>(gwpe.data), g_.dres,
                        tok, d.B, d.T, C);
    return;
  }
  if (!d.llama) token_positions_backward(gwpe);
  if (d.sp) gather(tp, g_.dres, g_.full);
  const float* full = d.sp ? g_.full : g_.dres;
  k_.embedding_rows_backward(gwte, full, tok, d.N, d.Vl * part_.tp_rank, d.Vl, C);
}

// Vocab-parallel softmax cross-entropy over logits [N,Vl] (in probs): the row max and the
// (sum of exp, target logit) pairs are all-reduced; the logits never leave the rank. These
// reductions stay fp32 whatever the tp comm dtype: they are row statistics, not activations, a
// bf16 log-sum-exp would put its rounding into every token's loss, and they are 3N floats
// against the blocks' N x C (Megatron-LM keeps them fp32 too).
void ModelPasses::vocab_parallel_xent(SlotActs& s, const std::int32_t* targets,
                                      TensorParallelComm* tp) {
  const std::size_t N = run_.N, Vl = run_.Vl;
  float* mx = g_.ce;         // [N]
  float* sum_t = g_.ce + N;  // [N] sums of exp | [N] target logit - max
  k_.xent_row_max(mx, s.probs, N, Vl);
  tp->all_reduce_max(view(mx, N));
  k_.xent_exp(s.probs, sum_t, sum_t + N, mx, targets, Vl * part_.tp_rank, N, Vl);
  tp->all_reduce_sum(view(sum_t, 2 * N));
  k_.xent_normalise(s.probs, s.losses, sum_t, sum_t + N, N, Vl);
}

// bf16 parameters: the GEMM writes the bf16 logits where their gradient is kept (the slot's
// dlogits), a chunk of rows at a time (head_chunk_rows: the bound of the GEMM's scratchpad and of
// the row statistics); each chunk's cross-entropy leaves its losses and bf16(softmax - onehot)
// over its logits. At tp > 1 the vocab-parallel steps and their all-reduces run per chunk (one
// chunk for small models, so the same collectives as the fp32 path).
void ModelPasses::head_xent_bf16(SlotActs& s, const std::int32_t* targets, BufferView lm_head,
                                 TensorParallelComm* tp) {
  const Dims& d = run_;
  const std::size_t N = d.N, Vl = d.Vl, C = std::size_t(d.C), R = head_chunk_rows(d);
  const std::size_t v0 = Vl * part_.tp_rank;
  for (std::size_t r0 = 0; r0 < N; r0 += R) {
    const std::size_t rows = std::min(R, N - r0);
    bf16* logits = s.dlogits + r0 * Vl;
    k_.gemm_bf16(false, true, int(rows), int(Vl), int(C), s.lnf_full.half() + r0 * C,
                 static_cast<const bf16*>(lm_head.data), logits, DType::bf16, false, g_.gemm_pad,
                 g_.gemm_pad_bytes);
    float* losses = s.losses + r0;
    const std::int32_t* tg = targets + r0;
    if (d.tp == 1) {
      k_.softmax_crossentropy_grad_bf16(logits, losses, tg, rows, Vl);
      continue;
    }
    float* mx = g_.ce;            // [rows]; fp32 statistics, as in vocab_parallel_xent
    float* sum_t = g_.ce + rows;  // [rows] sums of exp | [rows] target logit - max
    k_.xent_row_max(mx, logits, rows, Vl);
    tp->all_reduce_max(view(mx, rows));
    k_.xent_exp(logits, sum_t, sum_t + rows, mx, tg, v0, rows, Vl);
    tp->all_reduce_sum(view(sum_t, 2 * rows));
    k_.xent_normalise_grad_bf16(logits, losses, mx, sum_t, sum_t + rows, tg, v0, rows, Vl);
  }
}

void ModelPasses::forward_head(SlotActs& s, BufferView lnf, BufferView lm_head,
                               const std::int32_t* targets, TensorParallelComm* tp) {
  const Dims& d = run_;
  const int C = d.C;
  check_tokens(memory_.device(), targets, d.N, d.V, "target");
  SmallTensors small(k_, lnf, g_.small_params);
  norm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, s.x[d.blocks], small.param(0, C),
               d.llama ? nullptr : small.param(C, C), int(d.Nl));
  if (d.sp) gather(tp, s.lnf, s.lnf_full);
  if (param_dtype_ == DType::bf16) {
    head_xent_bf16(s, targets, lm_head, tp);
    return;
  }
  matmul_forward(s.probs, s.lnf_full, lm_head, nullptr, int(d.N), C, int(d.Vl));
  if (d.tp == 1)
    k_.softmax_crossentropy_forward(s.probs, s.losses, s.probs, targets, int(d.N), d.V);
  else
    vocab_parallel_xent(s, targets, tp);
}

void ModelPasses::backward_head(SlotActs& s, BufferView lnf, BufferView lm_head, BufferView glnf,
                                BufferView glm_head, const std::int32_t* targets,
                                TensorParallelComm* tp, float scale) {
  const Dims& d = run_;
  const int C = d.C;
  const std::size_t N = d.N, Vl = d.Vl;
  // logits = lnf @ lm_head^T; GPT-2's LM head is lm_head (tied): its gradient lands in the
  // embedding's.
  if (param_dtype_ == DType::bf16) {  // the forward's bf16 (softmax - onehot), scaled in place
    k_.scale_bf16(s.dlogits, scale, N * Vl);
    matmul_backward_bf16(g_.partial, glm_head, s.dlogits, s.lnf_full, lm_head, int(N), C, int(Vl));
  } else {
    k_.zero(g_.logits, N * Vl);
    if (d.tp == 1)
      k_.crossentropy_softmax_backward(g_.logits, s.probs, targets, scale, int(N), d.V);
    else
      k_.xent_backward_shard(g_.logits, s.probs, targets, Vl * part_.tp_rank, scale, N, Vl);
    matmul_backward(g_.partial, glm_head, nullptr, g_.logits, s.lnf_full, lm_head, int(N), C,
                    int(Vl));
  }
  const float* dlnf = reduce_input_grad(tp);
  k_.zero(g_.dres, d.Nl * C);
  SmallTensors small(k_, lnf, g_.small_params), gsmall(k_, glnf, g_.small_grads);
  norm_backward(g_.dres, gsmall.grad(0, C), d.llama ? nullptr : gsmall.grad(C, C), dlnf,
                s.x[d.blocks], small.param(0, C), s.lnf_mean, s.lnf_rstd, int(d.Nl));
  gsmall.flush();
}

}  // namespace strata
