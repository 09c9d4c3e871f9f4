// StageModel: a unit range of the GPT-2 workload split across a tensor-parallel group (see
// strata/stage_model.hpp): its tensor table, sliced initialisation and activation slots, on the
// passes in model_passes.cpp (the same code Model runs, so tp 1 stages are bitwise equal to it).
#include "strata/stage_model.hpp"

#include <algorithm>

#include "backends/backend.hpp"
#include "model/model_passes.hpp"
#include "strata/device.hpp"
#include "strata/types.hpp"

namespace strata {

struct StageModel::Impl {
  ModelSpec spec;
  std::shared_ptr<const ParamLayout> layout_of_spec;
  const ParamLayout& layout;
  Partition part;
  Dims d;
  std::vector<LocalTensor> tensors;  // empty where built without the table (unit_ranges)
  bool table = true;                 // whether `tensors` is built (else only the offsets below)
  std::size_t count = 0;
  std::vector<std::size_t> block_start;  // local offset of each block's first element
  std::vector<std::size_t> unit_start;   // local offset of each local unit's first element
  // lm_head_off: the untied LM head's (a llama's); a tied one is wte
  std::size_t wte_off = 0, wpe_off = 0, lnf_off = 0, lm_head_off = 0;
  bool have_wte = false;
  std::unique_ptr<ModelPasses> passes;
  MemoryLedger* memory = nullptr;
  struct Slot {
    std::unique_ptr<ModelPasses::Slot> acts;
    Buffer<std::int32_t> tokens;  // inputs [N] | targets [N]
    bool busy = false;
  };
  std::vector<std::unique_ptr<Slot>> slots;

  // memory = null builds only the tensor table (for predictions); tensor_table = false only the
  // offsets (unit_ranges, which the advisor asks for every stage of every candidate: the table's
  // allocations there were a seventh of a 175B search, a third of it under ASan).
  Impl(const ModelSpec& s, int B, const Partition& p, MemoryLedger* m, Recompute r, DType dt,
       DType tp_comm = DType::f32, bool split_backward = false, bool tensor_table = true)
      : spec(s),
        layout_of_spec(ParamLayout::of(s)),
        layout(*layout_of_spec),
        part(p),
        d((validate_partition(s, B, p, r, dt, m ? m->device() : Device::cpu),
           Dims(s, B, p, m ? m->device() : Device::cpu))),
        table(tensor_table),
        memory(m) {
    build_tensors();
    if (m) passes = std::make_unique<ModelPasses>(s, B, p, r, dt, tp_comm, *m, split_backward);
  }

  std::size_t local_count(const TensorInfo& t, ShardKind k) const {
    if (k == ShardKind::experts) return t.count / part.ep_size;
    return k == ShardKind::replicated ? t.count : t.count / part.tp_size;
  }

  // The next local tensor: its elements counted, and its entry in the table when one is built.
  void add(int global, ShardKind shard, bool tied_copy = false, int block_kind = -1) {
    const TensorInfo& t = layout.tensors()[global];
    const std::size_t n = local_count(t, shard);
    if (table) {
      LocalTensor lt;
      lt.global = global;
      lt.offset = count;
      lt.shard = shard;
      lt.count = n;
      lt.decay = t.decay;
      lt.tied_copy = tied_copy;
      if (block_kind >= 0) lt.stacked = block_stacked_rows(spec, block_kind);
      tensors.push_back(std::move(lt));
    }
    count += n;
  }

  void build_tensors() {
    const int L = spec.layers;
    const std::size_t units = std::size_t(part.last_unit - part.first_unit + 1);
    unit_start.reserve(units);
    block_start.reserve(units);
    if (table) tensors.reserve(units * block_tensors(spec).size());
    for (int u = part.first_unit; u <= part.last_unit; ++u) {
      const UnitInfo& unit = layout.units()[u];
      unit_start.push_back(count);
      if (u == 0) {
        wte_off = count;
        have_wte = true;
        add(unit.first_tensor, ShardKind::rows);
        wpe_off = count;
        if (spec.arch == Arch::gpt2) add(unit.first_tensor + 1, ShardKind::replicated);
      } else if (u <= L) {
        block_start.push_back(count);
        const std::vector<int>& kinds = block_tensors(spec);
        for (std::size_t i = 0; i < kinds.size(); ++i)
          add(unit.first_tensor + int(i), block_shard(spec.arch, kinds[i]), false, kinds[i]);
      } else {
        if (spec.tied() && !have_wte) {  // the LM head's own copy of the tied embedding
          wte_off = count;
          have_wte = true;
          add(layout.units()[0].first_tensor, ShardKind::rows, true);
        }
        lnf_off = count;
        add(unit.first_tensor, ShardKind::replicated);  // the final norm's weight (| bias)
        if (spec.arch == Arch::gpt2) add(unit.first_tensor + 1, ShardKind::replicated);
        lm_head_off = count;
        if (!spec.tied()) add(unit.first_tensor + 1, ShardKind::rows);
      }
    }
  }

  // The global elements of one local tensor, in local order, as contiguous runs: f(local offset
  // in the tensor, first global element of t, count).
  template <class F>
  void each_run(const LocalTensor& lt, F&& f) const {
    const TensorInfo& t = layout.tensors()[lt.global];
    const std::size_t r = part.tp_rank, tp = part.tp_size;
    if (lt.shard == ShardKind::replicated) {
      f(0, t.offset, t.count);
    } else if (lt.shard == ShardKind::rows) {  // contiguous
      f(0, t.offset + r * lt.count, lt.count);
    } else if (lt.shard == ShardKind::experts) {  // the ep rank's experts, contiguous
      f(0, t.offset + std::size_t(part.ep_rank) * lt.count, lt.count);
    } else if (lt.shard == ShardKind::stacked_rows) {             // the rank's rows of each block
      const std::size_t row = t.count / std::size_t(t.shape[0]);  // elements per row
      std::size_t global = t.offset, local = 0;
      for (std::int64_t rows : lt.stacked) {
        const std::size_t block = std::size_t(rows) * row, part_n = block / tp;
        f(local, global + r * part_n, part_n);
        global += block, local += part_n;
      }
    } else {  // columns of [OC, IC]: columns r*ICl.. of every row
      const std::size_t oc = t.shape[0], ic = t.shape[1], icl = ic / tp;
      for (std::size_t o = 0; o < oc; ++o) f(o * icl, t.offset + o * ic + r * icl, icl);
    }
  }

  // The local elements [begin, begin + out.count) initialised as the full model's init_params
  // gives them. Each run is initialised in place (init_params of any range equals that range of
  // a full initialisation), so no temporary of a full tensor is needed (gpt2-124m's wte would be
  // 154 MiB outside the ledger).
  void init_range(std::uint64_t seed, std::size_t begin, BufferView out) const {
    const std::size_t end = begin + out.count;
    for (const LocalTensor& lt : tensors) {
      if (lt.offset >= end || lt.offset + lt.count <= begin) continue;
      each_run(lt, [&](std::size_t at, std::size_t global, std::size_t n) {
        const std::size_t lo = std::max(lt.offset + at, begin),
                          hi = std::min(lt.offset + at + n, end);
        if (lo < hi)
          strata::init_params(layout, seed, global + (lo - lt.offset - at),
                              slice(out, lo - begin, hi - lo));
      });
    }
  }

  // The local buffer's view, checked: param_count() elements, parameters in the passes' dtype,
  // gradients also in fp32.
  BufferView local(BufferView v, bool grads) const {
    const DType want = passes->param_dtype();
    const Device device = memory ? memory->device() : Device::cpu;
    if (!v.data || v.count != count || v.device != device ||
        !(v.dtype == want || (grads && v.dtype == DType::f32)))
      throw Error("StageModel: " + std::string(grads ? "gradients" : "parameters") +
                  ": a view of " + std::to_string(v.count) + " " + dtype_name(v.dtype) +
                  " elements on " + device_name(v.device) + ", need " + std::to_string(count) +
                  " " + dtype_name(want) + " on " + device_name(device));
    return v;
  }
  // The local elements [offset, offset + n) inside a unit's view that starts at local `base`.
  BufferView at(BufferView unit, std::size_t base, std::size_t offset, std::size_t n) const {
    return slice(unit, offset - base, n);
  }
  std::size_t lnf_count() const { return std::size_t(spec.final_norm_params()); }
  std::size_t wpe_count() const { return spec.tied() ? std::size_t(d.Ta) * d.C : 0; }
  // The embedding unit's views (its view e starts at local 0): wte, and GPT-2's wpe (else empty).
  BufferView wte(BufferView e) const { return at(e, 0, wte_off, d.Vl * d.C); }
  BufferView wpe(BufferView e) const {
    return spec.tied() ? at(e, 0, wpe_off, wpe_count()) : BufferView{};
  }
  // The head unit's final norm and LM head: its own lm_head, or the tied wte (the embedding's
  // when this partition holds it, else the head's copy). embedding: unit 0's view, if held.
  BufferView lnf(BufferView h, std::size_t hb) const { return at(h, hb, lnf_off, lnf_count()); }
  BufferView lm_head(BufferView h, std::size_t hb, BufferView embedding) const {
    if (!spec.tied()) return at(h, hb, lm_head_off, d.Vl * d.C);
    return d.embedding ? wte(embedding) : at(h, hb, wte_off, d.Vl * d.C);
  }

  // Checks a forward's collectives and micro-batch, copies its tokens (if the partition reads
  // them) into the slot; returns the slot.
  Slot& begin_forward(int i, const MicroBatch& mb, TensorParallelComm* tp, bool tokens) {
    if (d.tp > 1 && (!tp || tp->size() != d.tp))
      throw Error("StageModel: needs tensor-parallel collectives over a group of size " +
                  std::to_string(d.tp));
    if (mb.batch != d.B || mb.seq != d.T || (tokens && (!mb.inputs || !mb.targets)))
      throw Error("StageModel: micro-batch " + std::to_string(mb.batch) + "x" +
                  std::to_string(mb.seq) + " does not match " + std::to_string(d.B) + "x" +
                  std::to_string(d.T) + (tokens ? " with tokens" : ""));
    Slot& s = slot(i);
    if (tokens) {  // the micro-batch's tokens are on the run's device (Context::micro_batch)
      const Device dev = memory->device();
      copy_bytes(dev, s.tokens.data(), mb.inputs, d.N * sizeof(std::int32_t));
      copy_bytes(dev, s.tokens.data() + d.N, mb.targets, d.N * sizeof(std::int32_t));
    }
    return s;
  }

  Slot& slot(int i) {
    if (i < 0 || i >= int(slots.size()) || !slots[i]->busy)
      throw Error("StageModel: slot " + std::to_string(i) + " is not acquired");
    return *slots[i];
  }
};

StageModel::StageModel(const ModelSpec& spec, int micro_batch, const Partition& part,
                       MemoryLedger& memory, Recompute recompute, DType param_dtype,
                       DType tp_comm_dtype, bool split_backward)
    : impl_(std::make_unique<Impl>(spec, micro_batch, part, &memory, recompute, param_dtype,
                                   tp_comm_dtype, split_backward)) {}
StageModel::~StageModel() = default;

const Partition& StageModel::partition() const { return impl_->part; }
void StageModel::set_expert_comm(ExpertParallelComm* ep) { impl_->passes->set_expert_comm(ep); }
void StageModel::set_context_comm(ContextParallelComm* cp) { impl_->passes->set_context_comm(cp); }
Recompute StageModel::recompute() const { return impl_->passes->recompute(); }
DType StageModel::param_dtype() const { return impl_->passes->param_dtype(); }
bool StageModel::has_embedding() const { return impl_->d.embedding; }
bool StageModel::has_head() const { return impl_->d.head; }
bool StageModel::needs_tokens() const { return impl_->d.embedding || impl_->d.head; }
const std::vector<LocalTensor>& StageModel::tensors() const { return impl_->tensors; }
std::size_t StageModel::param_count() const { return impl_->count; }
std::size_t StageModel::wte_offset() const { return impl_->wte_off; }
std::size_t StageModel::wte_count() const { return impl_->have_wte ? impl_->d.Vl * impl_->d.C : 0; }
std::size_t StageModel::boundary_count() const { return impl_->d.Nl * impl_->d.C; }
std::size_t StageModel::boundary_count(const ModelSpec& spec, int B, const Partition& part) {
  const Dims d(spec, B, part, Device::cpu);  // the boundary is the same on any device
  return d.Nl * d.C;
}

void StageModel::init_params(std::uint64_t seed, BufferView params) const {
  if (params.count != impl_->count)
    throw Error("StageModel::init_params: " + std::to_string(params.count) + " elements, need " +
                std::to_string(impl_->count));
  impl_->init_range(seed, 0, params);
}

void StageModel::init_params(std::uint64_t seed, std::size_t begin, BufferView params) const {
  if (begin + params.count > impl_->count)
    throw Error("StageModel::init_params: elements [" + std::to_string(begin) + ", " +
                std::to_string(begin + params.count) + ") of " + std::to_string(impl_->count));
  impl_->init_range(seed, begin, params);
}

std::vector<AdamWSegment> StageModel::adamw_segments() const {
  std::vector<AdamWSegment> s;
  for (const LocalTensor& lt : impl_->tensors) s.push_back({lt.count, lt.decay});
  return s;
}

std::vector<const LocalTensor*> StageModel::tp_partial_grads() const {
  std::vector<const LocalTensor*> r;
  if (!impl_->d.sp) return r;
  for (const LocalTensor& lt : impl_->tensors)
    if (lt.shard == ShardKind::replicated) r.push_back(&lt);
  return r;
}

double StageModel::grad_sum_of_squares(BufferView grads) const {
  double s = 0;
  for (const LocalTensor& lt : impl_->tensors)
    if (in_grad_norm(lt))
      s += device_ops(grads.device).sum_of_squares(slice(grads, lt.offset, lt.count));
  return s;
}

bool StageModel::in_grad_norm(const LocalTensor& t) const {
  return !t.tied_copy && !(t.shard == ShardKind::replicated && impl_->part.tp_rank != 0);
}

int StageModel::acquire_slot() {
  Impl& m = *impl_;
  for (std::size_t i = 0; i < m.slots.size(); ++i)
    if (!m.slots[i]->busy) {
      m.slots[i]->busy = true;
      return int(i);
    }
  auto s = std::make_unique<Impl::Slot>();
  s->acts = m.passes->make_slot();
  s->tokens = Buffer<std::int32_t>(*m.memory, MemTag::workspace, 2 * m.d.N);
  s->busy = true;
  m.slots.push_back(std::move(s));
  return int(m.slots.size()) - 1;
}

void StageModel::release_slot(int slot) {
  Impl::Slot& s = impl_->slot(slot);
  if (!s.acts->acts.deferred.empty())
    throw Error("StageModel: slot " + std::to_string(slot) + " released before its weight pass");
  s.busy = false;
}

void StageModel::backward_weights(int slot) {
  impl_->passes->backward_weights(impl_->slot(slot).acts->acts);
}
int StageModel::slots_allocated() const { return int(impl_->slots.size()); }
namespace {
BufferView boundary_view(ActView x, std::size_t count, Device device) {
  return {x.data, count, x.dtype, device};
}
}  // namespace

BufferView StageModel::input(int slot) {
  return boundary_view(impl_->slot(slot).acts->acts.x[0], boundary_count(),
                       impl_->memory->device());
}
BufferView StageModel::output(int slot) const {
  return boundary_view(impl_->slot(slot).acts->acts.x[impl_->d.blocks], boundary_count(),
                       impl_->memory->device());
}
float* StageModel::output_grad() { return impl_->passes->dres(); }
const float* StageModel::input_grad(int slot) const { return impl_->slot(slot).acts->acts.grad_in; }

// The whole local buffer as one view per unit (UnitPtrs, indexed by unit number).
UnitPtrs StageModel::unit_views(BufferView local) const {
  const Impl& m = *impl_;
  UnitPtrs ptrs(std::size_t(m.spec.layers) + 2);
  for (int u = m.part.first_unit; u <= m.part.last_unit; ++u) {
    const auto [offset, count] = unit_range(u);
    ptrs[std::size_t(u)] = slice(local, offset, count);
  }
  return ptrs;
}

void StageModel::forward(int slot, BufferView params, const MicroBatch& mb,
                         TensorParallelComm* tp) {
  const UnitPtrs p = unit_views(impl_->local(params, false));
  for (int u = impl_->part.first_unit; u <= impl_->part.last_unit; ++u) forward(slot, u, p, mb, tp);
}

void StageModel::backward(int slot, BufferView params, BufferView grads, TensorParallelComm* tp,
                          float grad_scale) {
  const UnitPtrs p = unit_views(impl_->local(params, false)),
                 g = unit_views(impl_->local(grads, true));
  for (int u = impl_->part.last_unit; u >= impl_->part.first_unit; --u)
    backward(slot, u, p, g, tp, grad_scale);
}

std::pair<std::size_t, std::size_t> StageModel::unit_range(int unit) const {
  const Impl& m = *impl_;
  const int i = unit - m.part.first_unit;
  if (i < 0 || i >= int(m.unit_start.size()))
    throw Error("StageModel::unit_range: unit " + std::to_string(unit) +
                " is not in the partition");
  const std::size_t end = i + 1 < int(m.unit_start.size()) ? m.unit_start[i + 1] : m.count;
  return {m.unit_start[i], end - m.unit_start[i]};
}

std::vector<std::pair<std::size_t, std::size_t>> StageModel::unit_ranges(const ModelSpec& spec,
                                                                         const Partition& part) {
  Partition p = part;
  p.sequence_parallel = false;
  const Impl m(spec, 1, p, nullptr, Recompute::none, DType::f32, DType::f32, false,
               /*tensor_table=*/false);
  std::vector<std::pair<std::size_t, std::size_t>> r;
  r.reserve(m.unit_start.size());
  for (std::size_t i = 0; i < m.unit_start.size(); ++i) {
    const std::size_t end = i + 1 < m.unit_start.size() ? m.unit_start[i + 1] : m.count;
    r.emplace_back(m.unit_start[i], end - m.unit_start[i]);
  }
  return r;
}

namespace {
// A unit's view, checked: all of its range in the partition's local order, in the dtype the
// passes take (parameters in param_dtype(); gradients in it or fp32), on the model's device.
BufferView unit_view(const StageModel& sm, const UnitPtrs& ptrs, int unit, bool grads,
                     Device device) {
  const BufferView v = unit < int(ptrs.size()) ? ptrs[std::size_t(unit)] : BufferView{};
  const std::size_t n = sm.unit_range(unit).second;
  const DType want = sm.param_dtype();
  const bool dtype_ok = v.dtype == want || (grads && v.dtype == DType::f32);
  if (!v.data || v.count != n || !dtype_ok || v.device != device)
    throw Error(
        "StageModel: unit " + std::to_string(unit) + (grads ? " gradients" : " parameters") +
            ": a view of " + std::to_string(v.count) + " " + dtype_name(v.dtype) + " elements on " +
            device_name(v.device) + ", need " + std::to_string(n) + " " + dtype_name(want) +
            (grads && want != DType::f32 ? " (or fp32)" : "") + " on " + device_name(device),
        "point UnitPtrs at the unit's whole range, in the run's precision");
  return v;
}
}  // namespace

void StageModel::forward(int slot, int unit, const UnitPtrs& params, const MicroBatch& mb,
                         TensorParallelComm* tp) {
  Impl& m = *impl_;
  const Dims& d = m.d;
  const int first = m.part.first_unit;
  const Device dev = m.memory->device();
  Impl::Slot& s = unit == first ? m.begin_forward(slot, mb, tp, needs_tokens()) : m.slot(slot);
  const std::int32_t* inputs = s.tokens.data();
  const std::int32_t* targets = inputs + d.N;
  ModelPasses& passes = *m.passes;
  SlotActs& acts = s.acts->acts;
  if (d.embedding && unit == 0) {
    const BufferView e = unit_view(*this, params, 0, false, dev);
    passes.forward_embedding(acts, m.wte(e), m.wpe(e), inputs, tp);
  } else if (d.head && unit == m.part.last_unit) {
    const BufferView h = unit_view(*this, params, unit, false, dev);
    const std::size_t hb = unit_range(unit).first;
    const BufferView e =
        d.embedding && m.spec.tied() ? unit_view(*this, params, 0, false, dev) : BufferView{};
    passes.forward_head(acts, m.lnf(h, hb), m.lm_head(h, hb, e), targets, tp);
  } else {
    passes.forward_block(unit - (d.embedding ? first + 1 : first), acts,
                         unit_view(*this, params, unit, false, dev), tp);
  }
}

void StageModel::backward(int slot, int unit, const UnitPtrs& params, const UnitPtrs& grads,
                          TensorParallelComm* tp, float grad_scale) {
  Impl& m = *impl_;
  const Dims& d = m.d;
  const int first = m.part.first_unit;
  const Device dev = m.memory->device();
  Impl::Slot& s = m.slot(slot);
  const std::int32_t* inputs = s.tokens.data();
  const std::int32_t* targets = inputs + d.N;
  ModelPasses& passes = *m.passes;
  SlotActs& acts = s.acts->acts;
  if (d.head && unit == m.part.last_unit) {
    const BufferView hp = unit_view(*this, params, unit, false, dev),
                     hg = unit_view(*this, grads, unit, true, dev);
    const std::size_t hb = unit_range(unit).first;
    const bool tied_here = d.embedding && m.spec.tied();
    const BufferView ep = tied_here ? unit_view(*this, params, 0, false, dev) : BufferView{},
                     eg = tied_here ? unit_view(*this, grads, 0, true, dev) : BufferView{};
    passes.backward_head(acts, m.lnf(hp, hb), m.lm_head(hp, hb, ep), m.lnf(hg, hb),
                         m.lm_head(hg, hb, eg), targets, tp, grad_scale);
  } else if (d.embedding && unit == 0) {
    const BufferView eg = unit_view(*this, grads, 0, true, dev);
    passes.backward_embedding(m.wte(eg), m.wpe(eg), inputs, tp);
  } else {
    passes.backward_block(unit - (d.embedding ? first + 1 : first), acts,
                          unit_view(*this, params, unit, false, dev),
                          unit_view(*this, grads, unit, true, dev), tp, grad_scale);
  }
  // A partition without the embedding hands d(input) to the previous stage.
  if (!d.embedding && unit == first)
    copy_bytes(m.memory->device(), acts.grad_in, passes.dres(), d.Nl * d.C * sizeof(float));
}

// Unit at a time through UnitAccess: each unit's view acquired before the first pass that reads
// it and released after the last, in the order the header states (the embedding held throughout).
void StageModel::forward(int slot, const UnitAccess& params, const MicroBatch& mb,
                         TensorParallelComm* tp) {
  const Impl& m = *impl_;
  UnitPtrs p(std::size_t(m.spec.layers) + 2);
  for (int u = m.part.first_unit; u <= m.part.last_unit; ++u) {
    p[std::size_t(u)] = params.acquire(u);
    forward(slot, u, p, mb, tp);
    if (u != 0) params.release(u), p[std::size_t(u)] = BufferView{};
  }
  if (m.d.embedding) params.release(0);
}

void StageModel::backward(int slot, const UnitAccess& params, const UnitAccess& grads,
                          TensorParallelComm* tp, float grad_scale) {
  const Impl& m = *impl_;
  UnitPtrs p(std::size_t(m.spec.layers) + 2), g(p.size());
  if (m.d.embedding) {  // held from the head's backward (its wte) to its own
    if (m.d.head) p[0] = params.acquire(0);
    g[0] = grads.acquire(0);
  }
  for (int u = m.part.last_unit; u >= m.part.first_unit; --u) {
    if (u != 0) p[std::size_t(u)] = params.acquire(u), g[std::size_t(u)] = grads.acquire(u);
    backward(slot, u, p, g, tp, grad_scale);
    if (u == 0) continue;
    params.release(u), grads.release(u);
    p[std::size_t(u)] = g[std::size_t(u)] = BufferView{};
  }
  if (m.d.embedding) {
    if (m.d.head) params.release(0);
    grads.release(0);
  }
}

double StageModel::loss_sum(int slot) const {
  const Impl::Slot& s = impl_->slot(slot);
  return impl_->d.head ? impl_->passes->loss_sum(s.acts->acts, impl_->d.N) : 0.0;
}

double StageModel::aux_loss_sum(int slot) const {
  return impl_->passes->aux_loss_sum(impl_->slot(slot).acts->acts);
}

std::uint64_t StageModel::slot_token_bytes(const ModelSpec& spec, int B, const Partition& part) {
  return 2ull * B * (spec.seq / part.cp_size) * sizeof(std::int32_t);
}

std::vector<LocalTensor> StageModel::local_tensors(const ModelSpec& spec, const Partition& part) {
  Partition p = part;
  p.sequence_parallel = false;  // the tensor table does not depend on it (or on the batch)
  return Impl(spec, 1, p, nullptr, Recompute::none, DType::f32).tensors;
}

}  // namespace strata
