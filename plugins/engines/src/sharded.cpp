// The sharded engine at run time: executes the schedule with real collectives on a comm stream.
#include "strata/engines/sharded.hpp"

namespace strata::sharded {

Engine::Engine(Context& ctx, const EngineConfig& c)
    : Engine(ctx, c, whole_model(ctx.model_spec()), nullptr) {}

Engine::Engine(Context& ctx, const EngineConfig& c, const Partition& partition,
               TensorParallelComm* tp)
    : config_(c),
      model_(std::make_unique<StageModel>(
          ctx.model_spec(), ctx.train().micro_batch, partition, ctx.memory(), ctx.train().recompute,
          ctx.train().precision.param, ctx.train().precision.tp_comm)),
      tp_(partition.tp_size > 1 ? tp : nullptr),
      tp_group_(partition.tp_size > 1 ? &ctx.group(Axis::tp) : nullptr),
      param_dtype_(ctx.train().precision.param),
      grad_dtype_(ctx.train().precision.reduce),
      memory_(&ctx.memory()) {
  const Partition& part = model_->partition();
  shard_group_ = &ctx.group(c.hybrid ? Axis::dp_intra_node : Axis::dp);
  if (c.hybrid) replica_group_ = &ctx.group(Axis::dp_inter_node);
  shard_index_ = shard_group_->rank();
  groups_ = make_groups(StageModel::unit_ranges(ctx.model_spec(), part), part.first_unit,
                        shard_group_->size(), c);
  const int units = part.last_unit - part.first_unit + 1;
  schedule_ = micro_batch_schedule(groups_, units, c);
  const int G = int(groups_.size());
  for (int g = 0; g < G; ++g)
    for (int u = groups_[g].first_unit; u <= groups_[g].last_unit; ++u) group_of_unit_.push_back(g);

  param_ptrs_.assign(std::size_t(ctx.model_spec().layers) + 2, BufferView{});
  grad_ptrs_.assign(param_ptrs_.size(), BufferView{});
  gathered_.resize(G);
  group_grads_.resize(G);
  reduced_.resize(G);
  gather_done_.resize(G);
  reduce_done_.resize(G);
  std::size_t total_padded = 0;
  for (const ShardGroup& g : groups_) base_.push_back(total_padded), total_padded += g.padded();

  MemoryLedger& mem = ctx.memory();
  const std::uint64_t seed = ctx.train().seed;
  if (!c.shard_params) {
    // A full replica in a padded layout: group g starts at base_[g], so every group's shards can
    // be all-gathered in place.
    replica_params_ = DeviceBuffer(mem, MemTag::params, param_dtype_, total_padded);
    for (int g = 0; g < G; ++g) {
      model_->init_params(seed, groups_[g].offset,
                          replica_params_.view(base_[g], groups_[g].count));
      point_units(g, replica_params_.view(base_[g], groups_[g].padded()), param_ptrs_);
    }
  } else {
    for (const ShardGroup& g : groups_) {
      shard_params_.emplace_back(mem, MemTag::params, param_dtype_, g.chunk);
      model_->init_params(seed, g.offset + std::size_t(shard_index_) * g.chunk,
                          shard_params_.back().view(0, g.valid(shard_index_)));
    }
  }
  for (const ShardGroup& g : groups_)
    shard_grads_.emplace_back(mem, MemTag::grads, grad_dtype_, g.chunk);
  if (!c.shard_grads) {
    replica_grads_ = DeviceBuffer(mem, MemTag::grads, grad_dtype_, total_padded);
    for (int g = 0; g < G; ++g)
      point_units(g, replica_grads_.view(base_[g], groups_[g].padded()), grad_ptrs_);
  }
  const MemTag state_tag = c.offload_optimizer ? MemTag::offload : MemTag::optimizer;
  for (const ShardGroup& g : groups_)
    optimizers_.push_back(make_optimizer(ctx, g.offset + std::size_t(shard_index_) * g.chunk,
                                         g.valid(shard_index_), state_tag));
  if (c.offload_optimizer) {  // the host side of the copies, kept for the run like DeepSpeed's
    std::vector<std::size_t> counts;
    for (const ShardGroup& g : groups_) counts.push_back(g.valid(shard_index_));
    host_.emplace(mem, grad_dtype_, param_dtype_, counts);
  }
  const StageModel& sm = *model_;
  norm_slices_ = owned_slices(sm.tensors(), groups_, shard_index_,
                              [&](const LocalTensor& t) { return sm.in_grad_norm(t); });
  if (tp_group_ && part.sequence_parallel) {
    partial_slices_ = owned_slices(sm.tensors(), groups_, shard_index_, [](const LocalTensor& t) {
      return t.shard == ShardKind::replicated;
    });
    std::size_t partial = 0;
    for (const ShardSlice& p : partial_slices_) partial += p.count;
    partial_pack_ = DeviceBuffer(mem, MemTag::comm_buffers, grad_dtype_, partial);
  }
}

Engine::~Engine() = default;

void Engine::point_units(int g, BufferView group, UnitPtrs& ptrs) const {
  for (int u = groups_[g].first_unit; u <= groups_[g].last_unit; ++u) {
    const auto [offset, count] = model_->unit_range(u);
    ptrs[std::size_t(u)] = slice(group, offset - groups_[g].offset, count);
  }
}

AdamW Engine::make_optimizer(Context& ctx, std::size_t begin, std::size_t count,
                             MemTag state_tag) const {
  AdamW opt(slice_segments(model_->adamw_segments(), begin, count), adamw_config(ctx), ctx.memory(),
            param_dtype_, state_tag);
  if (opt.master().data) model_->init_params(ctx.train().seed, begin, opt.master());
  return opt;
}

void Engine::issue_gather(Context& ctx, int g) {
  const ShardGroup& grp = groups_[g];
  gathered_[g] = DeviceBuffer(*memory_, MemTag::comm_buffers, param_dtype_, grp.padded());
  const BufferView full = gathered_[g].view(), shard = shard_params_[g].view();
  Group* sg = shard_group_;
  if (sg->size() > 1)
    gather_done_[g] = ctx.comm_stream().all_gather(*sg, shard, full, ctx.compute_event());
  else
    ctx.ops().copy(slice(full, 0, grp.chunk), shard);
  point_units(g, full, param_ptrs_);
}

void Engine::reduce_grads(Context& ctx, int g) {
  const ShardGroup& grp = groups_[g];
  reduced_[g] = DeviceBuffer(*memory_, MemTag::comm_buffers, grad_dtype_, grp.chunk);
  const BufferView in = group_grads_[g].view(), out = reduced_[g].view();
  Group* sg = shard_group_;
  Group* rg = replica_group_ && replica_group_->size() > 1 ? replica_group_ : nullptr;
  DeviceOps* ops = &ctx.ops();
  if (sg->size() == 1 && !rg) {
    ops->copy(out, slice(in, 0, grp.chunk));
    return;
  }
  reduce_done_[g] = ctx.comm_stream().enqueue(
      [sg, rg, in, out, grp, ops] {
        if (sg->size() > 1)
          sg->reduce_scatter(in, out);
        else
          ops->copy(out, slice(in, 0, grp.chunk));
        if (rg) rg->all_reduce(out);  // hybrid: replicas across nodes
      },
      ctx.compute_event());
}

void Engine::finish_grads(Context& ctx, int g) {
  if (reduce_done_[g]) reduce_done_[g]->wait();
  reduce_done_[g].reset();
  ctx.ops().axpy(shard_grads_[g].view(), 1.0, reduced_[g].view());
  reduced_[g] = DeviceBuffer();
  group_grads_[g] = DeviceBuffer();
}

void Engine::run_micro_batch(Context& ctx, const MicroBatch& mb) {
  StageModel& model = *model_;
  const int head = model.partition().last_unit;
  const float scale = float(grad_scale(ctx));
  slot_ = model.acquire_slot();
  for (const Action& a : schedule_) {
    const int g = a.index;
    switch (a.act) {
      case Act::gather:
        issue_gather(ctx, g);
        break;
      case Act::wait_gather:
        if (gather_done_[g]) gather_done_[g]->wait();
        gather_done_[g].reset();
        break;
      case Act::forward: {
        PhaseTimer t(ctx, Phase::forward);  // one interval per unit: the --trace timeline
        model.forward(slot_, g, param_ptrs_, mb, tp_);
        if (g == head) ctx.report_loss(model.loss_sum(slot_), double(mb.batch) * mb.seq);
        break;
      }
      case Act::backward: {
        PhaseTimer t(ctx, Phase::backward);
        model.backward(slot_, g, param_ptrs_, grad_ptrs_, tp_, scale);
        break;
      }
      case Act::free_params:
        gathered_[g] = DeviceBuffer();
        for (int u = groups_[g].first_unit; u <= groups_[g].last_unit; ++u)
          param_ptrs_[u] = BufferView{};
        break;
      case Act::alloc_grads:
        group_grads_[g] = DeviceBuffer(*memory_, MemTag::grads, grad_dtype_, groups_[g].padded());
        point_units(g, group_grads_[g].view(), grad_ptrs_);
        break;
      case Act::reduce_grads:
        reduce_grads(ctx, g);
        break;
      case Act::finish_grads:
        finish_grads(ctx, g);
        break;
    }
  }
  model.release_slot(slot_);
}

void Engine::update(Context& ctx, int step) {
  Group& sg = *shard_group_;
  const int G = int(groups_.size());
  const int i = shard_index_;
  if (!config_.shard_grads) {  // zero1: one reduce-scatter per group, straight into the shard
    std::vector<Event> done;
    for (int g = 0; g < G; ++g) {
      const BufferView full = replica_grads_.view(base_[g], groups_[g].padded());
      if (sg.size() > 1)
        done.push_back(ctx.comm_stream().reduce_scatter(sg, full, shard_grads_[g].view(),
                                                        ctx.compute_event()));
      else
        ctx.ops().copy(shard_grads_[g].view(), slice(full, 0, groups_[g].chunk));
    }
    for (Event& e : done) e.wait();
  }
  reduce_partial_grads(ctx);
  PhaseTimer timer(ctx, Phase::optimizer);
  const float clip = clip_scale(std::sqrt(shard_sum_of_squares(ctx)), ctx.train().grad_clip);
  if (host_) {
    std::vector<HostUpdate::Shard> shards;
    for (int g = 0; g < G; ++g) shards.push_back({&optimizers_[g], params_of(g), grads_of(g)});
    host_->step(ctx, step, clip, shards);
  } else
    for (int g = 0; g < G; ++g) optimizers_[g].step(params_of(g), grads_of(g), step + 1, clip);
  if (!config_.shard_params && sg.size() > 1) {  // zero1/2: everyone gets the updated shards
    std::vector<Event> done;
    for (int g = 0; g < G; ++g) {
      const BufferView full = replica_params_.view(base_[g], groups_[g].padded());
      done.push_back(ctx.comm_stream().all_gather(
          sg, slice(full, std::size_t(i) * groups_[g].chunk, groups_[g].chunk), full,
          ctx.compute_event()));
    }
    for (Event& e : done) e.wait();
  }
}

void Engine::reduce_partial_grads(Context& ctx) {
  if (partial_slices_.empty()) return;
  DeviceOps& ops = ctx.ops();
  auto each = [&](auto&& f) {
    std::size_t at = 0;
    for (const ShardSlice& p : partial_slices_) {
      f(shard_grads_[std::size_t(p.group)].view(p.at, p.count), partial_pack_.view(at, p.count));
      at += p.count;
    }
  };
  each([&](BufferView g, BufferView pack) { ops.copy(pack, g); });
  tp_group_->all_reduce(partial_pack_.view());
  each([&](BufferView g, BufferView pack) { ops.copy(g, pack); });
}

// Only with clipping on does the norm cross ranks: its shards' squares over the shard group (the
// replicas of hybrid sharding hold equal shards), then over tp.
double Engine::shard_sum_of_squares(Context& ctx) {
  double sumsq = 0;
  for (const ShardSlice& s : norm_slices_)
    sumsq += ctx.ops().sum_of_squares(shard_grads_[std::size_t(s.group)].view(s.at, s.count));
  if (ctx.train().grad_clip <= 0) return sumsq;
  if (shard_group_->size() > 1) shard_group_->all_reduce({&sumsq, 1, DType::f64});
  if (tp_group_) tp_group_->all_reduce({&sumsq, 1, DType::f64});
  return sumsq;
}

BufferView Engine::params_of(int g) {
  const std::size_t valid = groups_[g].valid(shard_index_);  // the real elements only
  return config_.shard_params
             ? shard_params_[g].view(0, valid)
             : replica_params_.view(base_[g] + std::size_t(shard_index_) * groups_[g].chunk, valid);
}

BufferView Engine::grads_of(int g) {
  return shard_grads_[g].view(0, groups_[g].valid(shard_index_));
}

HostUpdate::HostUpdate(MemoryLedger& memory, DType grad_dtype, DType param_dtype,
                       const std::vector<std::size_t>& counts)
    : param_dtype_(param_dtype) {
  for (std::size_t n : counts) {
    grads_.emplace_back(memory, MemTag::offload, grad_dtype, n);
    params_.emplace_back(memory, MemTag::offload, param_dtype, n);
  }
}

void HostUpdate::step(Context& ctx, int step, float clip, const std::vector<Shard>& shards) {
  // Every shard goes down on the offload stream at once, in order; the host steps shard i as soon
  // as its copy is in, while later ones are still copying down and earlier ones already copying
  // up (ZeRO-Offload's overlap of the transfers with the CPU step). With bf16 parameters AdamW
  // rounds its fp32 master into them, so only fp32 ones are copied down.
  CommStream& copies = ctx.comm_stream(kStream);
  const std::size_t n = shards.size();
  const bool params_down = param_dtype_ == DType::f32;
  std::vector<Event> down(n), up(n);
  for (std::size_t i = 0; i < n; ++i) {
    const BufferView host_g = grads_[i].view(), host_p = params_[i].view();
    const Shard& s = shards[i];
    down[i] = copies.enqueue(
        [&ctx, host_g, host_p, s, params_down] {
          ctx.copy_to_host(host_g, s.grads);
          if (params_down) ctx.copy_to_host(host_p, s.params);
        },
        ctx.compute_event());
  }
  for (std::size_t i = 0; i < n; ++i) {
    down[i].wait();
    shards[i].optimizer->step(params_[i].view(), grads_[i].view(), step + 1, clip);
    const BufferView host_p = params_[i].view(), params = shards[i].params;
    up[i] = copies.enqueue([&ctx, params, host_p] { ctx.copy_to_device(params, host_p); });
  }
  for (Event& e : up) e.wait();  // the parameters are on the device before anyone reads them
}

void EngineStrategy::validate(const MeshSpec& mesh, const TrainSpec&, const ModelSpec&) const {
  require_data_parallel_only(mesh, name_);
  if (config_.forward_prefetch < 0 || config_.backward_prefetch < 0)
    throw ConfigError("--plugin-opt prefetch: must be >= 0");
  if (config_.units_per_group < 1) throw ConfigError("--plugin-opt wrap: must be >= 1 unit");
}

void Engine::train_step(Context& ctx, int step) {
  for (auto& b : shard_grads_) ctx.ops().fill(b.view(), 0);
  if (replica_grads_.size()) ctx.ops().fill(replica_grads_.view(), 0);
  const int micro_steps = ctx.train().micro_steps(ctx.mesh());
  for (int m = 0; m < micro_steps; ++m) run_micro_batch(ctx, ctx.micro_batch(step, m));
  update(ctx, step);
}

}  // namespace strata::sharded
