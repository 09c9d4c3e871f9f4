// ZeRO-2 and FSDP on the dp axis of the model-parallel engine: see dp_units.hpp.
#include "dp_units.hpp"

#include <algorithm>
#include <cmath>

namespace strata::mp {
using sharded::ShardGroup;

UnitGroups unit_groups(const ModelSpec& model, const Partition& part, int dp) {
  UnitGroups u;
  u.first_unit = part.first_unit;
  for (const auto& [offset, count] : StageModel::unit_ranges(model, part)) {
    ShardGroup g;
    g.offset = offset;
    g.count = count;
    g.shards = dp;
    g.chunk = (count + dp - 1) / dp;
    u.base.push_back(u.padded);
    u.own.push_back(u.chunks);
    u.padded += g.padded();
    u.chunks += g.chunk;
    u.groups.push_back(g);
  }
  return u;
}

namespace {
// Calls f(g, lo, hi) for each group g whose owned elements meet local range [begin, end).
template <class F>
void each_owned(const UnitGroups& u, int shard, std::size_t begin, std::size_t end, F&& f) {
  for (std::size_t g = 0; g < u.groups.size(); ++g) {
    const ShardGroup& grp = u.groups[g];
    const std::size_t own = grp.offset + std::size_t(shard) * grp.chunk;
    const std::size_t lo = std::max(begin, own), hi = std::min(end, own + grp.valid(shard));
    if (lo < hi) f(g, lo, hi, u.own[g] + (lo - own));
  }
}
}  // namespace

std::vector<OwnedSlice> owned_partials(const ModelSpec& model, const Partition& part,
                                       const UnitGroups& u, int shard) {
  std::vector<OwnedSlice> r;
  if (!part.sequence_parallel || part.tp_size == 1) return r;
  for (const LocalTensor& t : StageModel::local_tensors(model, part)) {
    if (t.shard != ShardKind::replicated) continue;
    each_owned(u, shard, t.offset, t.offset + t.count,
               [&](std::size_t, std::size_t lo, std::size_t hi, std::size_t at) {
                 r.push_back({lo, at, hi - lo});
               });
  }
  return r;
}

void predict_dp_units(const ModelSpec& model, const Partition& part, int dp, int shard, bool fsdp,
                      const StateBytes& per, Prediction& p) {
  auto mem = [&](MemTag t) -> double& { return p.memory_bytes[static_cast<int>(t)]; };
  const UnitGroups u = unit_groups(model, part, dp);
  // The embedding unit is held through each pass; the others come and go one at a time, in
  // backward (last unit first) beside the previous unit, whose reduce-scatter is in flight.
  const bool held = part.first_unit == 0;
  const std::size_t held_padded = held ? u.groups[0].padded() : 0;
  const std::size_t first_other = held ? 1 : 0, n = u.groups.size();
  std::size_t other_padded = 0, pair_padded = 0, max_chunk = 0, valid = 0;
  double fsdp_backward = 0;  // a gathered unit and the previous one's reduce-scatter output
  for (std::size_t g = 0; g < n; ++g) {
    const ShardGroup& grp = u.groups[g];
    max_chunk = std::max(max_chunk, grp.chunk);
    valid += grp.valid(shard);
    if (g < first_other) continue;
    const bool after = g + 1 < n;  // backward's previous unit, still reducing
    const std::size_t prev_padded = after ? u.groups[g + 1].padded() : 0;
    const std::size_t prev_chunk = after ? u.groups[g + 1].chunk : 0;
    other_padded = std::max(other_padded, grp.padded());
    pair_padded = std::max(pair_padded, grp.padded() + prev_padded);
    fsdp_backward =
        std::max({fsdp_backward, per.params * double(grp.padded()) + per.grads * double(prev_chunk),
                  per.grads * double(grp.chunk)});
  }
  std::size_t partial = 0;
  for (const OwnedSlice& s : owned_partials(model, part, u, shard)) partial += s.count;
  mem(MemTag::params) = per.params * double(fsdp ? u.chunks : u.padded);
  mem(MemTag::grads) = per.grads * double(u.chunks + held_padded + pair_padded);
  mem(MemTag::optimizer) = per.optimizer * double(valid);
  double buffers = per.grads * double(max_chunk);  // zero2: one reduce-scatter output
  if (fsdp)
    buffers = std::max(per.params * double(held_padded + other_padded),  // forward
                       std::max(per.params * double(held_padded) + fsdp_backward,
                                per.grads * double(held ? u.groups[0].chunk : 0)));
  mem(MemTag::comm_buffers) += buffers + per.grads * double(partial);
}

DpUnits::DpUnits(Context& ctx, StageModel& sm, bool fsdp)
    : sm_(&sm),
      fsdp_(fsdp),
      shard_(ctx.coord().dp),
      dp_(&ctx.group(Axis::dp)),
      param_dtype_(ctx.train().precision.param),
      grad_dtype_(ctx.train().precision.reduce),
      u_(unit_groups(ctx.model_spec(), sm.partition(), ctx.mesh().dp)),
      partials_(owned_partials(ctx.model_spec(), sm.partition(), u_, shard_)),
      memory_(&ctx.memory()) {
  MemoryLedger& mem = ctx.memory();
  params_ = DeviceBuffer(mem, MemTag::params, param_dtype_, fsdp ? u_.chunks : u_.padded);
  shard_grads_ = DeviceBuffer(mem, MemTag::grads, grad_dtype_, u_.chunks);
  std::size_t partial = 0;
  for (const OwnedSlice& s : partials_) partial += s.count;
  partial_pack_ = DeviceBuffer(mem, MemTag::comm_buffers, grad_dtype_, partial);
  gathered_.resize(u_.groups.size());
  unit_grads_.resize(u_.groups.size());
  const std::vector<AdamWSegment> segments = sm.adamw_segments();
  for (const ShardGroup& g : u_.groups) {
    // The AdamW segments of this rank's owned elements of the unit.
    std::vector<AdamWSegment> owned;
    std::size_t at = 0;
    const std::size_t begin = g.offset + std::size_t(shard_) * g.chunk,
                      end = begin + g.valid(shard_);
    for (const AdamWSegment& s : segments) {
      const std::size_t lo = std::max(at, begin), hi = std::min(at + s.count, end);
      if (lo < hi) owned.push_back({hi - lo, s.decay});
      at += s.count;
    }
    optimizers_.emplace_back(std::move(owned), adamw_config(ctx), mem, param_dtype_);
  }
  init_params(ctx);
}

BufferView DpUnits::shard_params(int g) {
  const ShardGroup& grp = u_.groups[g];
  return fsdp_ ? params_.view(u_.own[g], grp.valid(shard_))
               : params_.view(u_.base[g] + std::size_t(shard_) * grp.chunk, grp.valid(shard_));
}

// The partition initialised whole in scratch outside the run's ledger (StageModel fills whole
// partitions; freed before the first step), then each unit's part copied in: the padded replica
// (zero2), the owned elements (fsdp), and the fp32 masters of the owned elements (bf16).
void DpUnits::init_params(Context& ctx) {
  MemoryLedger scratch_ledger(ctx.memory().device());
  const std::size_t n = sm_->param_count();
  DeviceOps& ops = ctx.ops();
  ops.fill(params_.view(), 0);
  {
    DeviceBuffer scratch(scratch_ledger, MemTag::workspace, param_dtype_, n);
    sm_->init_params(ctx.train().seed, scratch.view());
    for (std::size_t g = 0; g < u_.groups.size(); ++g) {
      const ShardGroup& grp = u_.groups[g];
      if (!fsdp_)
        ops.copy(params_.view(u_.base[g], grp.count), scratch.view(grp.offset, grp.count));
      else if (grp.valid(shard_) > 0)
        ops.copy(shard_params(int(g)),
                 scratch.view(grp.offset + std::size_t(shard_) * grp.chunk, grp.valid(shard_)));
    }
  }
  if (!ctx.train().precision.mixed()) return;
  DeviceBuffer master(scratch_ledger, MemTag::workspace, DType::f32, n);
  sm_->init_params(ctx.train().seed, master.view());
  for (std::size_t g = 0; g < u_.groups.size(); ++g) {
    const ShardGroup& grp = u_.groups[g];
    if (grp.valid(shard_) == 0) continue;
    ops.copy(optimizers_[g].master(),
             master.view(grp.offset + std::size_t(shard_) * grp.chunk, grp.valid(shard_)));
  }
}

void DpUnits::begin_step(Context& ctx) { ctx.ops().fill(shard_grads_.view(), 0); }

StageModel::UnitAccess DpUnits::params() {
  StageModel::UnitAccess a;
  if (!fsdp_) {
    a.acquire = [this](int unit) {
      const int g = u_.index(unit);
      return params_.view(u_.base[g], u_.groups[g].count);
    };
    a.release = [](int) {};
    return a;
  }
  a.acquire = [this](int unit) {
    const int g = u_.index(unit);
    const ShardGroup& grp = u_.groups[g];
    gathered_[g] = DeviceBuffer(*memory_, MemTag::comm_buffers, param_dtype_, grp.padded());
    dp_->all_gather(params_.view(u_.own[g], grp.chunk), gathered_[g].view());
    return gathered_[g].view(0, grp.count);
  };
  a.release = [this](int unit) { gathered_[u_.index(unit)] = DeviceBuffer(); };
  return a;
}

StageModel::UnitAccess DpUnits::grads(Context& ctx) {
  StageModel::UnitAccess a;
  a.acquire = [this, &ctx](int unit) {
    const int g = u_.index(unit);
    unit_grads_[g] = DeviceBuffer(*memory_, MemTag::grads, grad_dtype_, u_.groups[g].padded());
    ctx.ops().fill(unit_grads_[g].view(), 0);
    return unit_grads_[g].view(0, u_.groups[g].count);
  };
  // The unit's gradient of this micro-batch is final: reduce-scatter it over dp and add the
  // owned part to the shard (DeepSpeed's ZeRO-2 reduce per bucket, FSDP's per unit). The
  // reduce-scatter runs on the comm stream while the next unit's backward computes (overlap_comm);
  // the one before it is finished first, so at most one is in flight. The held embedding unit is
  // released last: nothing is left to overlap, so it is reduced at once.
  a.release = [this, &ctx](int unit) {
    finish_reduce(ctx);
    const int g = u_.index(unit);
    reduced_ = DeviceBuffer(*memory_, MemTag::comm_buffers, grad_dtype_, u_.groups[g].chunk);
    reducing_ = g;
    Group* dp = dp_;
    const BufferView in = unit_grads_[g].view(), out = reduced_.view();
    if (unit == held_unit())
      dp->reduce_scatter(in, out);
    else
      reduce_done_ = ctx.comm_stream().enqueue([dp, in, out] { dp->reduce_scatter(in, out); },
                                               ctx.compute_event());
    if (unit == held_unit()) finish_reduce(ctx);
  };
  return a;
}

void DpUnits::finish_reduce(Context& ctx) {
  if (reducing_ < 0) return;
  if (reduce_done_) reduce_done_->wait();
  reduce_done_.reset();
  const int g = reducing_;
  ctx.ops().axpy(shard_grads_.view(u_.own[g], u_.groups[g].chunk), 1.0, reduced_.view());
  reduced_ = DeviceBuffer();
  unit_grads_[g] = DeviceBuffer();
  reducing_ = -1;
}

int DpUnits::held_unit() const { return u_.first_unit == 0 ? 0 : -1; }

// This rank's share of the squared gradient norm: the owned elements of the tensors StageModel
// counts.
double DpUnits::sum_of_squares() {
  double s = 0;
  for (const LocalTensor& t : sm_->tensors()) {
    if (!sm_->in_grad_norm(t)) continue;
    each_owned(
        u_, shard_, t.offset, t.offset + t.count,
        [&](std::size_t, std::size_t lo, std::size_t hi, std::size_t at) {
          s += device_ops(shard_grads_.device()).sum_of_squares(shard_grads_.view(at, hi - lo));
        });
  }
  return s;
}

void DpUnits::step(Context& ctx, int step, Group* tp) {
  finish_reduce(ctx);  // none is left in flight by a backward; a guard
  DeviceOps& ops = ctx.ops();
  if (!partials_.empty()) {  // sequence parallel: whole replicated gradients, as Megatron's
    std::size_t at = 0;
    for (const OwnedSlice& s : partials_)
      ops.copy(partial_pack_.view(at, s.count), shard_grads_.view(s.at, s.count)), at += s.count;
    tp->all_reduce(partial_pack_.view());
    at = 0;
    for (const OwnedSlice& s : partials_)
      ops.copy(shard_grads_.view(s.at, s.count), partial_pack_.view(at, s.count)), at += s.count;
  }
  double sq = 0;
  {
    PhaseTimer t(ctx, Phase::optimizer);
    sq = sum_of_squares();
    dp_->all_reduce(view(&sq, 1));
    if (tp) tp->all_reduce(view(&sq, 1));
    const float clip = clip_scale(std::sqrt(sq), ctx.train().grad_clip);
    for (std::size_t g = 0; g < u_.groups.size(); ++g) {
      const std::size_t valid = u_.groups[g].valid(shard_);
      if (valid > 0)
        optimizers_[g].step(shard_params(int(g)), shard_grads_.view(u_.own[g], valid), step + 1,
                            clip);
    }
  }
  if (fsdp_) return;
  for (std::size_t g = 0; g < u_.groups.size(); ++g) {  // zero2: everyone gets the update
    const ShardGroup& grp = u_.groups[g];
    dp_->all_gather(params_.view(u_.base[g] + std::size_t(shard_) * grp.chunk, grp.chunk),
                    params_.view(u_.base[g], grp.padded()));
  }
}

}  // namespace strata::mp
