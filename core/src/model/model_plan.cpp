// The plan side of the one model implementation (model_passes.hpp): how a partition's tensors are
// cut across tensor-parallel ranks, the checks before anything is allocated, the partition's
// sizes, the activation plan (the same carve sizes the buffers and lays them out, so
// predict_activations is exact by construction) and the bytes of the tensor-parallel collectives.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/gemm_bf16.hpp"
#include "model/model_passes.hpp"
#include "model/moe_dispatch.hpp"
#include "strata/types.hpp"

namespace strata {

ShardKind block_shard(Arch arch, int k) {
  if (arch == Arch::moe && (k == kFcW || k == kFcprojW))  // the routed experts: by expert over ep
    return ShardKind::experts;
  if (arch == Arch::moe && k != kQkvW && k != kProjW)  // no tp for moe (validate_tensor_parallel)
    return ShardKind::replicated;
  switch (k) {
    case kQkvW:
    case kQkvB:
      return ShardKind::stacked_rows;
    case kFcW:  // a llama's gate | up: this rank's rows of each
      return arch == Arch::llama ? ShardKind::stacked_rows : ShardKind::rows;
    case kFcB:
      return ShardKind::rows;
    case kProjW:
    case kFcprojW:
      return ShardKind::columns;
    default:
      return ShardKind::replicated;
  }
}

std::vector<std::int64_t> block_stacked_rows(const ModelSpec& s, int k) {
  const std::int64_t hs = s.head_dim(), F = s.ffn_hidden();
  if (k == kQkvW || k == kQkvB)
    return {s.heads * hs, s.kv_head_count() * hs, s.kv_head_count() * hs};
  if (k == kFcW && s.arch == Arch::llama) return {F, F};
  return {};
}

void validate_tensor_parallel(const ModelSpec& s, int micro_batch, int tp, bool sp) {
  auto need = [&](int value, const char* what) {
    if (value % tp != 0)
      throw ConfigError("--mesh tp=" + std::to_string(tp) + ": must divide the model's " + what +
                        " (" + std::to_string(value) + ")");
  };
  if (tp < 1) throw ConfigError("--mesh tp=" + std::to_string(tp) + ": must be >= 1");
  if (tp > 1 && s.arch == Arch::moe)
    throw ConfigError(
        "--mesh tp=" + std::to_string(tp) +
        ": --arch moe's experts are not tensor-parallel; use tp=1 (dp, fsdp, pp, ep)");
  need(s.heads, "heads");
  need(s.kv_head_count(), "K/V heads (--kv-heads)");
  need(s.hidden, "hidden size");
  need(s.ffn_hidden(), "MLP size (--ffn)");
  need(s.vocab, "vocabulary (the embedding is vocab-parallel)");
  if (sp && (micro_batch * s.seq) % tp != 0)
    throw ConfigError("--plugin-opt sp=on: tp=" + std::to_string(tp) +
                      " must divide micro-batch x seq (" + std::to_string(micro_batch * s.seq) +
                      " token rows)");
}

void validate_expert_parallel(const ModelSpec& s, int ep) {
  // The message made only when it is thrown: every partition of every plan passes here.
  auto what = [ep] { return "expert parallelism over " + std::to_string(ep) + " rank(s)"; };
  if (ep < 1) throw ConfigError(what() + ": must be >= 1");
  if (ep == 1) return;
  if (s.arch != Arch::moe) throw ConfigError(what() + ": needs a mixture of experts (--arch moe)");
  if (s.experts % ep != 0)
    throw ConfigError(what() + ": must divide the experts (--experts " + std::to_string(s.experts) +
                      ")");
}

void validate_context_parallel(const ModelSpec& s, int tp, int cp, ContextAttention attention) {
  const std::string what = "--mesh cp=" + std::to_string(cp);
  if (cp < 1) throw ConfigError(what + ": must be >= 1");
  if (cp == 1) return;
  if (s.seq % (2 * cp) != 0)
    throw ConfigError(what + ": 2 x cp must divide the sequence length (--seq " +
                      std::to_string(s.seq) + "; each rank holds 2 of its 2 cp chunks)");
  if (attention == ContextAttention::ulysses && s.heads % (std::int64_t(tp) * cp) != 0)
    throw ConfigError(what + ": tp x cp must divide the attention heads (" +
                      std::to_string(s.heads) + "; Ulysses gives each cp rank whole heads)");
}

void validate_partition(const ModelSpec& s, int B, const Partition& p, Recompute r,
                        DType param_dtype, Device device) {
  validate_model_spec(s);
  if (B <= 0) throw ConfigError("model: micro-batch must be positive, got " + std::to_string(B));
  const int L = s.layers;
  if (p.first_unit < 0 || p.last_unit > L + 1 || p.first_unit > p.last_unit)
    throw Error("model: unit range [" + std::to_string(p.first_unit) + ", " +
                std::to_string(p.last_unit) + "] outside [0, " + std::to_string(L + 1) + "]");
  if (p.tp_rank < 0 || p.tp_rank >= p.tp_size)
    throw Error("model: tp rank " + std::to_string(p.tp_rank) + " of " + std::to_string(p.tp_size));
  validate_tensor_parallel(s, B, p.tp_size, p.sequence_parallel);
  validate_expert_parallel(s, p.ep_size);
  validate_context_parallel(s, p.tp_size, p.cp_size, p.cp_attention);
  // A GPU's ring blocks run the fused attention's tiles (cuda/attention.cu): no other kernel.
  if (device == Device::cuda && p.cp_size > 1 && p.cp_attention == ContextAttention::ring &&
      !cuda_fused_attention(B, s.heads * s.head_dim(), s.heads))
    throw ConfigError("--plugin-opt attention=ring on --device cuda: head size " +
                          std::to_string(s.head_dim()) + " (--hidden / --heads) must be at most " +
                          "128, and --micro-batch x --heads at most 65535",
                      "take attention=ulysses, or more heads of at most 128");
  if (p.cp_rank < 0 || p.cp_rank >= p.cp_size)
    throw Error("model: cp rank " + std::to_string(p.cp_rank) + " of " + std::to_string(p.cp_size));
  if (p.ep_rank < 0 || p.ep_rank >= p.ep_size)
    throw Error("model: ep rank " + std::to_string(p.ep_rank) + " of " + std::to_string(p.ep_size));
  if (r != Recompute::none && r != Recompute::full && r != Recompute::selective)
    throw ConfigError("model: recompute must be one of none, full, selective; got value " +
                      std::to_string(int(r)));
  if (param_dtype != DType::f32 && param_dtype != DType::bf16)
    throw ConfigError(std::string("model: parameters in ") + dtype_name(param_dtype) +
                      "; fp32 or bf16 are allowed");
  if (param_dtype == DType::bf16 && device == Device::cpu && !cpu::have_bf16_gemm())
    throw ConfigError("--precision bf16: this build of the CPU backend has no oneDNN",
                      "install libdnnl-dev (scripts/install-deps.sh) and rebuild");
}

Partition whole_model(const ModelSpec& spec) { return {0, spec.layers + 1, 1, 0, false}; }

Dims::Dims(const ModelSpec& s, int micro_batch, const Partition& p, Device device)
    : B(micro_batch),
      T(s.seq / p.cp_size),
      C(s.hidden),
      NH(s.heads),
      V(s.vocab),
      tp(p.tp_size),
      cp(p.cp_size),
      Ta(s.seq) {
  const int L = s.layers;
  blocks = std::max(0, std::min(p.last_unit, L) - std::max(p.first_unit, 1) + 1);
  embedding = p.first_unit == 0;
  head = p.last_unit == L + 1;
  sp = p.sequence_parallel && tp > 1;
  llama = s.llama_block();
  moe = s.arch == Arch::moe;
  N = std::size_t(B) * T;
  Nl = sp ? N / tp : N;
  Cl = std::size_t(C) / tp;
  NHl = std::size_t(NH) / tp;
  KVl = std::size_t(s.kv_head_count()) / tp;
  hs = std::size_t(s.head_dim());
  QKVl = (NHl + 2 * KVl) * hs;
  Fl = std::size_t(s.ffn_hidden()) / tp;
  FCl = (llama ? 2 : 1) * Fl;
  Vl = std::size_t(V) / tp;
  row0 = sp ? Nl * p.tp_rank : 0;
  cp_rank = p.cp_rank;
  ring = cp > 1 && p.cp_attention == ContextAttention::ring;
  NHa = ring ? NHl : NHl / cp;
  Ca = NHa * hs;
  const std::size_t P = std::size_t(cp);
  ulysses_kv = cp > 1 && !ring && KVl != NHl && (KVl % P == 0 || P % KVl == 0);
  kv_copies = ulysses_kv && KVl < P ? P / KVl : 1;
  KVa = ulysses_kv ? KVl * kv_copies / P : 0;
  QKVx = ulysses_kv ? (NHl + 2 * KVl * kv_copies) * hs : 3 * Cl;
  // Ring attention keeps a log-sum-exp per query row and head.
  att = ring ? std::size_t(B) * NHl * T : attention_state_floats(device, B, Ta, int(Ca), int(NHa));
  attention_bf16 = attention_writes_bf16(device, B, int(Ca), int(NHa));
  E = s.expert_count();
  topk = moe ? s.top_k : 0;
  capacity = moe ? moe_capacity(s.capacity_factor, Ta, E, topk) : 0;  // per whole sequence
  R = moe ? std::size_t(moe_max_rows(B, T, E, topk, capacity)) : 0;
  ep = p.ep_size;
  El = moe ? E / ep : 0;
  Rx = moe ? std::size_t(moe_max_rows_received(B, T, E, topk, capacity, ep)) : 0;
  SF = moe ? std::size_t(s.shared_experts) * Fl : 0;
}

TokenPositions cp_tokens(const Dims& d, int rank) {
  if (d.cp == 1) return {0, d.T, d.T};
  const int chunk = d.T / 2;
  return {cp_position(d.Ta, d.cp, rank, 0), cp_position(d.Ta, d.cp, rank, chunk), chunk};
}

std::size_t ring_block_count(const Dims& d) { return 2 * d.N * d.KVl * d.hs; }

std::vector<std::int32_t> ring_indices(const Dims& d) {
  const std::size_t N = d.N, KV = d.KVl, NH = d.NHl, group = NH / KV;
  std::vector<std::int32_t> gather(2 * N * KV), scatter(3 * N * NH, -1);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t s = 0; s < 2; ++s)
      for (std::size_t g = 0; g < KV; ++g) {
        const std::size_t kv_row = (n * 2 + s) * KV + g, qkv_row = (n * 3 + 1 + s) * NH + g * group;
        gather[kv_row] = std::int32_t(qkv_row);
        scatter[qkv_row] = std::int32_t(kv_row);
      }
  gather.insert(gather.end(), scatter.begin(), scatter.end());
  return gather;
}

std::size_t cp_perm_rows(const Dims& d, int which) {
  if (which == dqkv_local && d.ulysses_kv) return d.N * (d.NHl + 2 * d.KVl) * d.kv_copies;
  if (which < out_send && d.ulysses_kv) return d.N * d.QKVx / d.hs;
  return (which < out_send ? 3 : 1) * d.N * std::size_t(d.cp);
}
std::size_t cp_perm_cols(const Dims& d, int which) {
  return which < out_send && d.ulysses_kv ? d.hs : d.Ca;
}
std::size_t cp_perm_offset(const Dims& d, int which) {
  std::size_t at = 0;
  for (int k = 0; k < which; ++k) at += cp_perm_rows(d, k);
  return at;
}

namespace {

// q | k | v's sub-rows per token and destination rank (W) and the rank's row of sub-row `w` of
// token n for rank j: head groups of Ca columns, the rank's [N, 3, cp] (w: q, k, v); with
// ulysses_kv heads of hs columns, the rank's [N, NHl + 2 KVl] (w: rank j's q heads, then its k
// and its v heads; with kv_copies > 1 rank j's one K/V head is head j / kv_copies).
struct QkvRows {
  std::size_t W;
  const Dims& d;
  std::size_t local(std::size_t j, std::size_t n, std::size_t w) const {
    if (!d.ulysses_kv) return (n * 3 + w) * std::size_t(d.cp) + j;
    const std::size_t NHa = d.NHa, KVa = d.KVa, r = d.kv_copies;
    const std::size_t head = w < NHa         ? j * NHa + w
                             : w < NHa + KVa ? d.NHl + (j * KVa + w - NHa) / r
                                             : d.NHl + d.KVl + (j * KVa + w - NHa - KVa) / r;
    return n * (d.NHl + 2 * d.KVl) + head;
  }
};

}  // namespace

// The rank's q | k | v (QkvRows), what it sends [cp, N, W] (block j to rank j), what arrives
// [cp, N, W] (block i: rank i's tokens), whole sequences [B, Ta, W] (rank i's token t at its
// cp_position); the attention's output in rows of Ca columns likewise.
std::vector<std::int32_t> cp_permutations(const Dims& d) {
  const std::size_t N = d.N, T = std::size_t(d.T), Ta = std::size_t(d.Ta), P = std::size_t(d.cp);
  const QkvRows qkv{d.ulysses_kv ? d.NHa + 2 * d.KVa : 3, d};
  std::vector<std::int32_t> perm(cp_perm_offset(d, kCpPerms));
  auto entry = [&](CpPerm which, std::size_t row) -> std::int32_t& {
    return perm[cp_perm_offset(d, which) + row];
  };
  auto link = [&](CpPerm forward, CpPerm inverse, std::size_t out, std::size_t in) {
    entry(forward, out) = std::int32_t(in);
    entry(inverse, in) = std::int32_t(out);
  };
  // A local row sent kv_copies times gathers its gradient's copies back in its kv_copies slots.
  const std::size_t copies = d.kv_copies;  // 1 without ulysses_kv
  std::vector<std::size_t> filled(cp_perm_rows(d, dqkv_local) / copies, 0);
  std::fill_n(perm.begin() + std::ptrdiff_t(cp_perm_offset(d, dqkv_local)),
              cp_perm_rows(d, dqkv_local), -1);
  for (std::size_t j = 0; j < P; ++j)
    for (std::size_t n = 0; n < N; ++n) {
      // token n of rank j, in its sequence
      const std::size_t whole = (n / T) * Ta + std::size_t(cp_tokens(d, int(j))(int(n % T)));
      for (std::size_t w = 0; w < qkv.W; ++w) {
        const std::size_t sent = (j * N + n) * qkv.W + w, local = qkv.local(j, n, w);
        entry(qkv_send, sent) = std::int32_t(local);
        entry(dqkv_local, local * copies + filled[local]++) = std::int32_t(sent);
        link(qkv_full, dqkv_send, whole * qkv.W + w, sent);
      }
      link(out_send, dout_full, j * N + n, whole);
      link(out_local, dout_send, n * P + j, j * N + n);
    }
  return perm;
}

std::size_t head_chunk_rows(const Dims& d) {
  const std::size_t row_bytes = std::max<std::size_t>(d.Vl, 1) * sizeof(float);
  return std::clamp<std::size_t>(kHeadLogitsBudget / row_bytes, 1, std::max<std::size_t>(d.N, 1));
}

// ---------------------------------------------------------------------------------------------
// The activation plan: the same carve sizes the buffers (null base) and lays them out.

void BlockActs::carve(const Dims& d, bool with_att, DType gemm_in, Carver& c) {
  const std::size_t N = d.N, Nl = d.Nl, C = d.C;
  const DType att_dtype = d.attention_bf16 ? gemm_in : DType::f32;
  ln1 = c.take(Nl * C, gemm_in);
  ln1_mean = d.llama ? nullptr : c.take(Nl);  // RMSNorm keeps no mean
  ln1_rstd = c.take(Nl);
  ln1_full = d.sp ? c.take(N * C, gemm_in) : ln1;
  qkv = c.take(3 * N * d.Cl, att_dtype);  // with cp > 1: [B*Ta, 3Ca], as many elements
  atty = c.take(N * d.Cl, att_dtype);
  atty_full = d.cp > 1 && !d.ring ? c.take(N * d.Cl, att_dtype) : atty;
  att = with_att ? c.take(d.att) : nullptr;
  xmid = c.take(Nl * C, gemm_in);
  ln2 = c.take(Nl * C, gemm_in);
  ln2_mean = d.llama ? nullptr : c.take(Nl);
  ln2_rstd = c.take(Nl);
  ln2_full = d.sp ? c.take(N * C, gemm_in) : ln2;
  const std::size_t rows = d.moe ? d.Rx : N;  // the MLP's rows: moe's experts take Rx at most
  if (d.moe) {
    probs = c.take(N * d.E);
    experts = c.take_i32(N * d.topk);
    sequence_choices = c.take_i32(std::size_t(d.B) * d.E);
    gates = c.take(N * d.topk);
    row_of = c.take_i32(N * d.topk);
    token_of = c.take_i32(d.R);
    xe = c.take(d.R * C, gemm_in);
    eout = c.take(d.R * C);
    xg = xe;
    if (d.ep > 1) {
      xg = c.take(d.Rx * C, gemm_in);
      ep_order = c.take_i32(d.Rx);
      ep_inverse = c.take_i32(d.Rx);
    }
    if (d.SF > 0) {
      sfch = c.take(N * 2 * d.SF, gemm_in);
      sfch_act = c.take(N * d.SF, gemm_in);
    }
  }
  fch = c.take(rows * d.FCl, gemm_in);
  fch_act = c.take(rows * d.Fl, gemm_in);
}

// The largest scratchpad of the bf16 GEMMs a partition issues: for each matmul (inputs IC ->
// outputs OC over N token rows) the forward, d(input) and d(weight) (f32 or bf16 gradients).
// Asking creates the GEMMs' primitives, so a model sized before a run compiles nothing later.
std::size_t bf16_gemm_scratchpad(const Dims& d) {
  std::vector<std::pair<std::size_t, std::size_t>> matmuls;  // (IC, OC)
  const std::size_t C = d.C, Cl = d.Cl;
  if (d.blocks > 0) matmuls = {{C, d.QKVl}, {Cl, C}, {C, d.FCl}, {d.Fl, C}};
  if (d.blocks > 0 && d.moe) matmuls.emplace_back(C, std::size_t(d.E));  // the router
  if (d.blocks > 0 && d.SF > 0) matmuls.insert(matmuls.end(), {{C, 2 * d.SF}, {d.SF, C}});
  const int N = int(d.N);
  std::size_t most = 0;
  // moe's experts: their rows vary with the routing; sized here at the balanced load and at all
  // Rx rows (a GEMM that asks more takes the backend's own per-thread scratchpad).
  if (d.blocks > 0 && d.moe)
    for (int M : {int(d.Rx), int((d.Rx + d.El - 1) / d.El)})
      for (auto [ic, oc] : {std::pair{C, d.FCl}, std::pair{d.Fl, C}})
        for (bool bf16_grad : {false, true})
          most = std::max(
              {most,
               cpu::gemm_bf16_scratchpad_bytes(false, true, M, int(oc), int(ic), DType::f32, false),
               cpu::gemm_bf16_scratchpad_bytes(false, false, M, int(ic), int(oc), DType::f32,
                                               false),
               cpu::gemm_bf16_scratchpad_bytes(true, false, int(oc), int(ic), M,
                                               bf16_grad ? DType::bf16 : DType::f32, true)});
  if (d.head) {  // the forward a chunk of rows at a time (head_xent_bf16); the backward over N
    const int Vl = int(d.Vl), IC = int(C);
    most = std::max({most,
                     cpu::gemm_bf16_scratchpad_bytes(false, true, int(head_chunk_rows(d)), Vl, IC,
                                                     DType::bf16, false),
                     cpu::gemm_bf16_scratchpad_bytes(false, false, N, IC, Vl, DType::f32, false),
                     cpu::gemm_bf16_scratchpad_bytes(true, false, Vl, IC, N, DType::f32, true),
                     cpu::gemm_bf16_scratchpad_bytes(true, false, Vl, IC, N, DType::bf16, true)});
  }
  for (auto [ic, oc] : matmuls) {
    const int IC = int(ic), OC = int(oc);
    for (std::size_t bytes :
         {cpu::gemm_bf16_scratchpad_bytes(false, true, N, OC, IC, DType::f32, false),
          cpu::gemm_bf16_scratchpad_bytes(false, false, N, IC, OC, DType::f32, false),
          cpu::gemm_bf16_scratchpad_bytes(true, false, OC, IC, N, DType::f32, true),
          cpu::gemm_bf16_scratchpad_bytes(true, false, OC, IC, N, DType::bf16, true)})
      most = std::max(most, bytes);
  }
  return most;
}

namespace {
// n bf16 elements from a float carve (rounded up to whole floats).
bf16* take_bf16(Carver& c, std::size_t n) { return reinterpret_cast<bf16*>(c.take((n + 1) / 2)); }
}  // namespace

void Scratch::carve(const Dims& d, Recompute r, DType param_dtype, Carver& c) {
  const std::size_t N = d.N, C = d.C;
  op_in = op_out = nullptr;
  small_params = small_grads = gemm_pad = nullptr;
  gemm_pad_bytes = 0;
  const bool bf16_params = param_dtype == DType::bf16;
  if (bf16_params) {
    // The one fp32 input of a bf16 GEMM: the attention's output [N,Cl] where the device's
    // attention writes fp32 (attention_writes_bf16; every other GEMM input is written in bf16).
    const std::size_t widest =
        std::max({std::size_t(C), d.FCl, d.QKVl, std::size_t(d.E), 2 * d.SF});
    const std::size_t mlp_rows = std::max({N, d.R, d.Rx});  // moe's experts round Rx at most
    op_in = d.blocks > 0 && !d.attention_bf16 ? take_bf16(c, N * d.Cl) : nullptr;
    // The head's d(logits) is the slot's bf16 dlogits: op_out serves the blocks' matmuls only.
    op_out = d.blocks > 0 ? take_bf16(c, mlp_rows * widest) : nullptr;
    // A block's norm weights (and GPT-2's norm and linear biases); the head's final norm.
    const std::size_t block_small = d.llama ? 2 * C : 6 * C + d.QKVl + d.FCl;
    const std::size_t small = d.blocks > 0 ? block_small : (d.llama ? 1 : 2) * C;
    small_params = c.take(small);
    small_grads = c.take(small);
    gemm_pad_bytes = bf16_gemm_scratchpad(d);
    gemm_pad = c.take((gemm_pad_bytes + sizeof(float) - 1) / sizeof(float));
  }
  dres = c.take(d.Nl * C);
  partial = c.take(N * C);
  full = d.sp ? c.take(N * C) : dres;
  shard = d.sp ? c.take(d.Nl * C) : partial;
  rope = d.llama && d.blocks > 0 ? c.take(std::size_t(d.T) * d.hs) : nullptr;
  const bool cp = d.cp > 1 && d.blocks > 0;
  const std::size_t indices = d.ring ? 2 * N * d.KVl + 3 * N * d.NHl : cp_perm_offset(d, kCpPerms);
  cp_perm = cp ? c.take_i32(indices) : nullptr;
  // GPT-2's learned positions of the rank's tokens (two chunks of wpe) and their gradients.
  positions = d.cp > 1 && d.embedding && !d.llama ? c.take(std::size_t(d.T) * C) : nullptr;
  Carver head{c.base, c.used}, block{c.base, c.used};
  logits = ce = a = b = moe_rows = moe_router = ep_a = ep_b = cp_a = cp_b = nullptr;
  ring_dkv[0] = ring_dkv[1] = ring_out = nullptr;
  ep_counts = cp_counts = nullptr;
  shared = BlockActs{};
  if (d.head) {  // fp32: all of d(logits) (backward); bf16: the logits are the slot's dlogits
    const std::size_t rows = bf16_params ? head_chunk_rows(d) : N;
    if (!bf16_params) logits = head.take(rows * d.Vl);
    if (d.tp > 1) ce = head.take(3 * rows);
  }
  if (d.blocks > 0) {
    // a: d(the activation's output) [N,Fl], then d(q | k | v) [N,3Cl]; in forward the fp32 GEMM
    // outputs of a bf16 run [N,QKVl] or [N,FCl]. b: d(fch) [N,FCl], the attention's backward
    // scratch, then grouped-query attention's d(q | k | v) [N,QKVl]; in forward its q | k | v.
    // moe: R rows of an expert's gate | up, or N of the shared experts'
    const std::size_t mlp = std::max({N * d.FCl, d.Rx * d.FCl, N * 2 * d.SF});
    a = block.take(std::max(mlp, 3 * N * d.Cl));
    // moe: the router's logits; ulysses_kv: the exchanged q | k | v
    b = block.take(std::max({mlp, d.att, N * d.QKVl, d.ulysses_kv ? N * d.QKVx : 0, N * d.E}));
    if (d.moe) {
      moe_rows = block.take(std::max(d.R, N) * C);
      moe_router = block.take(N * (2 * d.E + d.topk) + std::size_t(d.B) * d.E);
      if (d.ep > 1) {
        ep_a = block.take(d.Rx * C);
        ep_b = block.take(d.Rx * C);
        ep_counts = block.take_i32(std::size_t(d.ep + 1) * d.E);
      }
      if (cp) cp_counts = block.take_i32(std::size_t(d.cp + 1) * d.B * 2 * d.E);
    }
    if (cp && !d.ring) {
      cp_a = block.take(3 * N * d.Cl);
      cp_b = block.take(3 * N * d.Cl);
    }
    if (cp && d.ring) {  // the key-value blocks in hand and arriving, their gradients, the output
      const std::size_t kv = ring_block_count(d);
      cp_a = block.take(kv), cp_b = block.take(kv);
      ring_dkv[0] = block.take(kv), ring_dkv[1] = block.take(kv);
      ring_out = d.attention_bf16 && bf16_params ? block.take(N * d.Cl) : nullptr;
    }
    if (r == Recompute::full) shared.carve(d, true, param_dtype, block);
    if (r == Recompute::selective) shared.att = block.take(d.att);
  }
  c.used = std::max(head.used, block.used);
}

// Per block: q | k | v [N,QKVl], the attention's projection [N,C], the MLP's up [N,FCl] and down
// [N,C] (moe: the router [N,E], its experts' rows [Rx, FCl + C] and the shared experts'
// [N, 2SF + C]); each GEMM's copy starts on a 16-element boundary (the GEMMs' alignment).
std::size_t deferred_dout_count(const Dims& d) {
  const std::size_t N = d.N, C = d.C, align = 16;
  std::size_t block = N * (d.QKVl + C), gemms = 2;
  if (d.moe) {
    block += N * std::size_t(d.E) + d.Rx * (d.FCl + C);
    gemms += 1 + 2 * std::size_t(d.El);
    if (d.SF > 0) block += N * (2 * d.SF + C), gemms += 2;
  } else {
    block += N * (d.FCl + C), gemms += 2;
  }
  return std::size_t(d.blocks) * (block + gemms * (align - 1));
}

void SlotActs::carve(const Dims& d, Recompute r, DType param_dtype, const Scratch& scratch,
                     Carver& c, bool split_backward) {
  const std::size_t N = d.N, Nl = d.Nl, C = d.C;
  x.resize(d.blocks + 1);
  for (ActView& p : x) p = c.take(Nl * C, param_dtype);
  block.resize(d.blocks);
  for (BlockActs& b : block) {
    if (r == Recompute::full) {
      b = scratch.shared;
      continue;
    }
    b.carve(d, r == Recompute::none, param_dtype, c);
    if (r == Recompute::selective) b.att = scratch.shared.att;
  }
  lnf = lnf_full = ActView{};
  lnf_mean = lnf_rstd = probs = losses = nullptr;
  dlogits = nullptr;
  if (d.head) {
    lnf = c.take(Nl * C, param_dtype);
    lnf_mean = d.llama ? nullptr : c.take(Nl);
    lnf_rstd = c.take(Nl);
    lnf_full = d.sp ? c.take(N * C, param_dtype) : lnf;
    if (param_dtype == DType::bf16)
      dlogits = take_bf16(c, N * d.Vl);
    else
      probs = c.take(N * d.Vl);
    losses = c.take(N);
  }
  grad_in = d.embedding ? nullptr : c.take(Nl * C);
  aux = d.moe && d.blocks > 0 ? c.take(std::size_t(d.blocks) * d.B) : nullptr;
  douts = split_backward ? c.take(deferred_dout_count(d), param_dtype) : ActView{};
}

void validate_split_backward(Recompute r) {
  if (r == Recompute::full)
    throw ConfigError(
        "--recompute full: a split backward (zb-h1, zb-v) needs each block's activations kept "
        "until its "
        "weight pass; none and selective are allowed");
}

ActivationBytes predict_activations(const ModelSpec& spec, int B, const Partition& part,
                                    Recompute r, DType param_dtype, Device device,
                                    bool split_backward) {
  validate_partition(spec, B, part, r, param_dtype, device);
  if (split_backward) validate_split_backward(r);
  const Dims d(spec, B, part, device);
  Carver scratch, slot;
  Scratch g;
  g.carve(d, r, param_dtype, scratch);
  SlotActs().carve(d, r, param_dtype, g, slot, split_backward);
  return {slot.used * sizeof(float), scratch.used * sizeof(float)};
}

// ---------------------------------------------------------------------------------------------

std::size_t tp_comm_buffer_count(const Dims& d, DType tp_comm_dtype) {
  if (d.tp == 1 || tp_comm_dtype == DType::f32) return 0;
  return d.N * d.C + (d.sp ? d.Nl * d.C : 0);
}

std::uint64_t StageModel::tp_comm_buffer_bytes(const ModelSpec& spec, int B, const Partition& part,
                                               DType tp_comm_dtype) {
  const Dims d(spec, B, part, Device::cpu);  // the same on any device
  return tp_comm_buffer_count(d, tp_comm_dtype) * dtype_size(tp_comm_dtype);
}

std::vector<PassCollective> tensor_parallel_collectives(const ModelSpec& spec, int B, int unit,
                                                        bool backward, int tp, bool sp, int cp,
                                                        Recompute r, DType tp_comm_dtype) {
  if (tp == 1) return {};
  // One [N,C] activation in the tp comm dtype (N: the rank's tokens, seq / cp of each sequence);
  // the cross-entropy's statistics are always fp32: the row max, then the (sum of exp, target)
  // pairs.
  const double N = double(B) * (spec.seq / cp);
  const double E = N * spec.hidden * double(dtype_size(tp_comm_dtype));
  const PassCollective ar{CommOp::all_reduce, E}, ag{CommOp::all_gather, E},
      rs{CommOp::reduce_scatter, E}, max{CommOp::all_reduce, N * sizeof(float)},
      sums{CommOp::all_reduce, 2 * N * sizeof(float)};
  const bool embedding = unit == 0, head = unit == spec.layers + 1;
  // Embedding: its output reduced (sp: reduce-scattered) forward, gathered backward under sp.
  if (embedding)
    return backward ? (sp ? std::vector{ag} : std::vector<PassCollective>{})
                    : std::vector{sp ? rs : ar};
  // Head: its input gathered (sp) forward and the cross-entropy's statistics; backward its input
  // gradient reduced (sp: reduce-scattered).
  if (head)
    return backward ? std::vector{sp ? rs : ar}
                    : (sp ? std::vector{ag, max, sums} : std::vector{max, sums});
  // A block: attention and MLP outputs reduced forward and their input gradients backward (sp: an
  // all-gather before and a reduce-scatter after each tp region); a full recompute repeats the
  // forward up to FC1 in backward: the attention's reduction and, under sp, the two gathers.
  const bool again = backward && r == Recompute::full;
  if (!sp) return again ? std::vector{ar, ar, ar} : std::vector{ar, ar};
  std::vector<PassCollective> c{ag, rs, ag, rs};
  if (again) c.insert(c.end(), {ag, rs, ag});
  return c;
}

std::vector<PassCollective> expert_parallel_collectives(const ModelSpec& spec, int B, int unit,
                                                        bool backward, int ep, int cp, Recompute r,
                                                        DType param_dtype) {
  if (ep == 1 || spec.arch != Arch::moe || unit < 1 || unit > spec.layers) return {};
  // The rows a rank routes: every choice of its N tokens (dropless), C wide; they go out in the
  // GEMMs' dtype and come back, and every gradient goes, in fp32. At a uniform routing a rank
  // receives as many rows as it sends.
  const double rows = double(B) * (spec.seq / cp) * spec.top_k, C = spec.hidden;
  const PassCollective counts{CommOp::all_gather, double(ep) * spec.experts * sizeof(std::int32_t)},
      out{CommOp::all_to_all, rows * C * double(dtype_size(param_dtype))},
      fp32{CommOp::all_to_all, rows * C * sizeof(float)};
  if (!backward) return {counts, out, fp32};
  if (r == Recompute::full) return {counts, out, fp32, fp32, fp32};  // the forward's again
  return {fp32, fp32};
}

namespace {
// The sizes of one block of a cp rank's model (the Dims the model runs on): its tokens, columns,
// K/V heads and the attention's dtype.
Dims context_parallel_dims(const ModelSpec& spec, int B, int tp, int cp, ContextAttention attention,
                           Device device) {
  Partition part = whole_model(spec);
  part.tp_size = tp, part.cp_size = cp, part.cp_attention = attention;
  return Dims(spec, B, part, device);
}

// A moe block's routing choices per chunk of each sequence and expert, [B, 2, E] of int32 from
// every cp rank (moe_sequence_choices), gathered in each forward (a full recompute's too).
void add_moe_sequence_counts(const ModelSpec& spec, int B, bool backward, int cp, Recompute r,
                             std::vector<PassCollective>& out) {
  if (spec.arch != Arch::moe || (backward && r != Recompute::full)) return;
  out.push_back({CommOp::all_gather, double(cp) * B * 2 * spec.experts * sizeof(std::int32_t)});
}

// The attention's exchanges of one block (context_parallel_collectives without moe's counts).
std::vector<PassCollective> context_parallel_attention(const ModelSpec& spec, int B, bool backward,
                                                       int tp, int cp, ContextAttention attention,
                                                       Recompute r, DType param_dtype,
                                                       Device device) {
  const Dims d = context_parallel_dims(spec, B, tp, cp, attention, device);
  const double act = double(dtype_size(d.attention_bf16 ? param_dtype : DType::f32));
  if (d.ring) {
    // The rank's key-value block [N, 2, KVl, hs] passed cp - 1 times forward (and again in a
    // recompute), as many backward, and its fp32 gradient cp times (a send and a receive each).
    const double block = double(ring_block_count(d)) * act;
    const double grad = double(ring_block_count(d)) * sizeof(float);
    std::vector<PassCollective> out;
    auto passes = [&](int times, double bytes) {
      for (int i = 0; i < times; ++i)
        out.insert(out.end(), {{CommOp::send, bytes}, {CommOp::recv, bytes}});
    };
    if (!backward || r != Recompute::none) passes(cp - 1, block);
    if (backward) passes(cp - 1, block), passes(cp, grad);
    return out;
  }
  // Ulysses: the rank's N tokens on its tp rank's Cl columns, q | k | v [N, QKVx] out (3 Cl; with
  // ulysses_kv the projection's heads, each K/V head kv_copies times) and the attention's output
  // [N, Cl] back, in the attention's dtype; backward d(output) and d(q | k | v) in fp32. A full
  // recompute repeats the forward's two; a selective one reruns the attention on the kept,
  // exchanged q | k | v.
  const double N = double(d.N), Cl = double(d.Cl);
  const double qkv_cols = double(d.QKVx);
  const PassCollective qkv{CommOp::all_to_all, N * qkv_cols * act},
      out{CommOp::all_to_all, N * Cl * act}, dout{CommOp::all_to_all, N * Cl * sizeof(float)},
      dqkv{CommOp::all_to_all, N * qkv_cols * sizeof(float)};
  if (!backward) return {qkv, out};
  if (r == Recompute::full) return {qkv, out, dout, dqkv};
  return {dout, dqkv};
}
}  // namespace

std::vector<PassCollective> context_parallel_collectives(const ModelSpec& spec, int B, int unit,
                                                         bool backward, int tp, int cp,
                                                         ContextAttention attention, Recompute r,
                                                         DType param_dtype, Device device) {
  if (cp == 1 || unit < 1 || unit > spec.layers) return {};
  std::vector<PassCollective> out =
      context_parallel_attention(spec, B, backward, tp, cp, attention, r, param_dtype, device);
  add_moe_sequence_counts(spec, B, backward, cp, r, out);
  return out;
}

}  // namespace strata
