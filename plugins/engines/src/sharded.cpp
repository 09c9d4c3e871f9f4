// The sharded engine at run time: executes the schedule with real collectives on a comm stream.
#include "strata/engines/sharded.hpp"

#include <algorithm>

namespace strata::sharded {

Shards::Shards(Context& ctx, const EngineConfig& c, std::vector<const StageModel*> models)
    : config_(c),
      models_(std::move(models)),
      param_dtype_(ctx.train().precision.param),
      grad_dtype_(ctx.train().precision.reduce),
      memory_(&ctx.memory()) {
  const MeshCoord& me = ctx.coord();
  at_ = placement(ctx.mesh(), me.rank, c);
  const Placement& at = at_;
  if (at.shards > 1) shard_group_ = &ctx.group(at.shard_axis);
  if (at.replicas > 1) replica_group_ = &ctx.group(at.replica_axis);
  if (ctx.mesh().tp > 1) tp_group_ = &ctx.group(Axis::tp);
  if (ctx.mesh().pp > 1) pp_group_ = &ctx.group(Axis::pp);
  std::vector<Partition> parts;
  std::vector<std::vector<LocalTensor>> tensors;
  for (const StageModel* m : models_)
    parts.push_back(m->partition()), tensors.push_back(m->tensors());
  groups_ = make_groups(ctx.model_spec(), parts, at.shards, c);
  buckets_ = bucket_groups(groups_);
  const int G = int(groups_.size()), B = int(buckets_.size());
  runs_.resize(std::size_t(B));
  for (int g = 0; g < G; ++g) runs_[std::size_t(groups_[g].bucket)].push_back(g);
  for (int b = 0; b < B; ++b) spans_.push_back(bucket_span(groups_, b));
  param_ptrs_.assign(std::size_t(ctx.model_spec().layers) + 2, BufferView{});
  grad_ptrs_.assign(param_ptrs_.size(), BufferView{});
  gathered_.resize(B);
  group_grads_.resize(B);
  reduced_.resize(G);
  gather_done_.resize(B);
  reduce_done_.resize(B);
  allocate_state(ctx);
  // in_grad_norm depends on the tp rank only, which every partition shares. Expert parallelism:
  // the routed experts differ across the ep group and are replicated over ep_dp (the other ep
  // groups), the rest is replicated over dp.
  const bool ep = parts[0].ep_size > 1;
  auto expert = [](const LocalTensor& t) { return t.shard == ShardKind::experts; };
  norm_slices_ = owned_slices(tensors, groups_, at, [&](const LocalTensor& t) {
    return models_[0]->in_grad_norm(t) && !(ep && expert(t));
  });
  if (ep) {
    if (c.replicate) {
      ep_group_ = &ctx.group(Axis::ep);
      if (ctx.group(Axis::ep_dp).size() > 1) expert_replica_group_ = &ctx.group(Axis::ep_dp);
      dense_slices_ =
          owned_slices(tensors, groups_, at, [&](const LocalTensor& t) { return !expert(t); });
      expert_slices_ = owned_slices(tensors, groups_, at, expert);
    } else if (at.expert_shards > 1) {
      expert_shard_group_ = &ctx.group(Axis::ep_dp);
    }
    expert_norm_slices_ = owned_slices(tensors, groups_, at, [&](const LocalTensor& t) {
      return expert(t) && models_[0]->in_grad_norm(t);
    });
  }
  if (tp_group_ && parts[0].sequence_parallel) {
    partial_slices_ = owned_slices(tensors, groups_, at, [](const LocalTensor& t) {
      return t.shard == ShardKind::replicated;
    });
    std::size_t partial = 0;
    for (const ShardSlice& p : partial_slices_) partial += p.count;
    partial_pack_ = DeviceBuffer(ctx.memory(), MemTag::comm_buffers, grad_dtype_, partial);
  }
}

Shards::~Shards() = default;

void Shards::allocate_state(Context& ctx) {
  const EngineConfig& c = config_;
  const int G = int(groups_.size());
  replica_ = replica_layout(groups_);
  const std::vector<std::size_t>& base = replica_.base;
  MemoryLedger& mem = ctx.memory();
  const std::uint64_t seed = ctx.train().seed;
  auto first = [&](int g) { return std::size_t(at_.index_of(groups_[g])) * groups_[g].chunk; };
  auto valid = [&](int g) { return groups_[g].valid(at_.index_of(groups_[g])); };
  if (!c.shard_params) {
    // A full replica (replica_layout): each group's shards all-gathered in it.
    replica_params_ = DeviceBuffer(mem, MemTag::params, param_dtype_, replica_.size);
    for (int g = 0; g < G; ++g) {
      model_of(g).init_params(seed, groups_[g].offset,
                              replica_params_.view(base[g], groups_[g].count));
      point_units(g, replica_params_.view(base[g], groups_[g].padded()), param_ptrs_);
    }
  } else {
    for (int g = 0; g < G; ++g) {
      shard_params_.emplace_back(mem, MemTag::params, param_dtype_, groups_[g].chunk);
      model_of(g).init_params(seed, groups_[g].offset + first(g),
                              shard_params_.back().view(0, valid(g)));
    }
  }
  if (!c.shard_grads) {
    replica_grads_ = DeviceBuffer(mem, MemTag::grads, grad_dtype_, replica_.size);
    for (int g = 0; g < G; ++g)
      point_units(g, replica_grads_.view(base[g], groups_[g].padded()), grad_ptrs_);
  }
  // A group's reduced shard; one shard of replicated gradients is the replica itself.
  for (const ShardGroup& g : groups_)
    shard_grads_.push_back(c.shard_grads || g.shards > 1
                               ? DeviceBuffer(mem, MemTag::grads, grad_dtype_, g.chunk)
                               : DeviceBuffer());
  const MemTag state_tag = c.offload_optimizer ? MemTag::offload : MemTag::optimizer;
  for (int g = 0; g < G; ++g)
    optimizers_.push_back(
        make_optimizer(ctx, g, groups_[g].offset + first(g), valid(g), state_tag));
  if (c.offload_optimizer) {  // the host side of the copies, kept for the run like DeepSpeed's
    std::vector<std::size_t> counts;
    for (int g = 0; g < G; ++g) counts.push_back(valid(g));
    host_.emplace(mem, grad_dtype_, param_dtype_, counts);
  }
}

// Units that begin in group g (in the contiguous layout a unit split over groups starts in its
// first one and its view runs on through the next).
void Shards::point_units(int g, BufferView group, UnitPtrs& ptrs) const {
  for (int u = groups_[g].first_unit; u <= groups_[g].last_unit; ++u) {
    const auto [offset, count] = model_of(g).unit_range(u);
    if (offset >= groups_[g].offset)
      ptrs[std::size_t(u)] = slice(group, offset - groups_[g].offset, count);
  }
}

AdamW Shards::make_optimizer(Context& ctx, int g, std::size_t begin, std::size_t count,
                             MemTag state_tag) const {
  const StageModel& model = model_of(g);
  AdamW opt(slice_segments(model.adamw_segments(), begin, count), adamw_config(ctx), ctx.memory(),
            param_dtype_, state_tag);
  if (opt.master().data) model.init_params(ctx.train().seed, begin, opt.master());
  return opt;
}

BufferView Shards::local_grads(int part, std::size_t offset, std::size_t count) {
  for (int g = 0; g < int(groups_.size()); ++g) {
    const ShardGroup& grp = groups_[g];
    if (grp.part != part || offset < grp.offset || offset + count > grp.offset + grp.count)
      continue;
    const int b = grp.bucket;
    if (group_grads_[b].size()) return group_grads_[b].view(offset - buckets_[b].offset, count);
    if (replica_grads_.size())
      return replica_grads_.view(replica_.base[g] + offset - grp.offset, count);
  }
  throw Error("Shards::local_grads: the range is not inside one group's unsharded gradients");
}

void Shards::point_bucket(int b, BufferView buffer, UnitPtrs& ptrs) const {
  for (int g : runs_[b]) {
    const ShardGroup& grp = groups_[g];
    point_units(g, slice(buffer, grp.offset - buckets_[b].offset, grp.padded()), ptrs);
  }
}

namespace {

// One run's collective of a bucket action: over `group` from `in` to `out`; without a group (one
// shard) a copy.
struct RunCollective {
  Group* group;
  BufferView in, out;
};

// `work` on the comm stream behind the compute when any run communicates (its event), else at once.
std::optional<Event> issue(Context& ctx, const std::vector<RunCollective>& runs, bool replicas,
                           std::function<void()> work) {
  const bool comm = replicas || std::any_of(runs.begin(), runs.end(),
                                            [](const RunCollective& r) { return r.group; });
  if (comm) return ctx.comm_stream().enqueue(std::move(work), ctx.compute_event());
  work();
  return std::nullopt;
}

}  // namespace

// Each run's shards all-gathered into its place in the bucket's buffer, one after another on the
// comm stream (a run's padding lands where the next run is gathered after it).
void Shards::issue_gather(Context& ctx, int b) {
  gathered_[b] = DeviceBuffer(*memory_, MemTag::comm_buffers, param_dtype_, spans_[b]);
  const BufferView full = gathered_[b].view();
  std::vector<RunCollective> runs;
  for (int g : runs_[b]) {
    const ShardGroup& grp = groups_[g];
    runs.push_back({shard_group_of(g), shard_params_[g].view(),
                    slice(full, grp.offset - buckets_[b].offset, grp.padded())});
  }
  DeviceOps* ops = &ctx.ops();
  gather_done_[b] = issue(ctx, runs, false, [runs, ops] {
    for (const RunCollective& r : runs)
      if (r.group)
        r.group->all_gather(r.in, r.out);
      else
        ops->copy(slice(r.out, 0, r.in.count), r.in);
  });
  point_bucket(b, full, param_ptrs_);
}

// Each run's gradients reduce-scattered over its own shard group into a buffer of its chunk
// (then all-reduced over the replicas with hybrid), one after another on the comm stream.
void Shards::reduce_grads(Context& ctx, int b) {
  std::vector<RunCollective> runs;
  for (int g : runs_[b]) {
    const ShardGroup& grp = groups_[g];
    reduced_[g] = DeviceBuffer(*memory_, MemTag::comm_buffers, grad_dtype_, grp.chunk);
    runs.push_back({shard_group_of(g),
                    slice(group_grads_[b].view(), grp.offset - buckets_[b].offset, grp.padded()),
                    reduced_[g].view()});
  }
  Group* rg = replica_group_;
  DeviceOps* ops = &ctx.ops();
  reduce_done_[b] = issue(ctx, runs, rg, [runs, rg, ops] {
    for (const RunCollective& r : runs) {
      if (r.group)
        r.group->reduce_scatter(r.in, r.out);
      else
        ops->copy(r.out, slice(r.in, 0, r.out.count));
      if (rg) rg->all_reduce(r.out);  // hybrid: replicas across nodes
    }
  });
}

void Shards::finish_grads(Context& ctx, int b) {
  if (reduce_done_[b]) reduce_done_[b]->wait();
  reduce_done_[b].reset();
  for (int g : runs_[b]) {
    ctx.ops().axpy(shard_grads_[g].view(), 1.0, reduced_[g].view());
    reduced_[g] = DeviceBuffer();
  }
  group_grads_[b] = DeviceBuffer();
}

void Shards::zero_grads(Context& ctx) {
  for (auto& b : shard_grads_)
    if (b.size()) ctx.ops().fill(b.view(), 0);
  if (replica_grads_.size()) ctx.ops().fill(replica_grads_.view(), 0);
}

void Shards::run(Context& ctx, const Action& a) {
  const int b = a.index;
  switch (a.act) {
    case Act::gather:
      return issue_gather(ctx, b);
    case Act::wait_gather:
      if (gather_done_[b]) gather_done_[b]->wait();
      gather_done_[b].reset();
      return;
    case Act::free_params:
      gathered_[b] = DeviceBuffer();
      for (int u = buckets_[b].first_unit; u <= buckets_[b].last_unit; ++u)
        param_ptrs_[u] = BufferView{};
      return;
    case Act::alloc_grads:
      group_grads_[b] = DeviceBuffer(*memory_, MemTag::grads, grad_dtype_, spans_[b]);
      point_bucket(b, group_grads_[b].view(), grad_ptrs_);
      return;
    case Act::reduce_grads:
      return reduce_grads(ctx, b);
    case Act::finish_grads:
      return finish_grads(ctx, b);
    case Act::forward:
    case Act::backward:
      throw Error("Shards::run: the passes are the caller's");
  }
}

// zero1 and allreduce after the micro-batches: each group's replicated gradients reduce-scattered
// straight into its shard, or with one shard all-reduced in place over the replicas.
void Shards::reduce_replicated_grads(Context& ctx) {
  std::vector<Event> done;
  if (ep_group_) {  // expert parallelism: the dense slices over dp, the experts' over their
                    // replicas
    auto all_reduce = [&](Group* over, const std::vector<ShardSlice>& slices) {
      if (over)
        for (const ShardSlice& s : slices)
          done.push_back(ctx.comm_stream().all_reduce(
              *over, slice(grads_of(s.group), s.at, s.count), ctx.compute_event()));
    };
    all_reduce(replica_group_, dense_slices_);
    all_reduce(expert_replica_group_, expert_slices_);
    for (Event& e : done) e.wait();
    return;
  }
  for (int g = 0; g < int(groups_.size()); ++g) {
    const BufferView full = replica_grads_.view(replica_.base[g], groups_[g].padded());
    if (Group* sg = shard_group_of(g))
      done.push_back(
          ctx.comm_stream().reduce_scatter(*sg, full, shard_grads_[g].view(), ctx.compute_event()));
    if (replica_group_)  // behind the shard's reduce-scatter, if any (one stream, in order)
      done.push_back(
          ctx.comm_stream().all_reduce(*replica_group_, grads_of(g), ctx.compute_event()));
  }
  for (Event& e : done) e.wait();
}

void Shards::update(Context& ctx, int step) {
  const int G = int(groups_.size());
  if (!config_.shard_grads) reduce_replicated_grads(ctx);
  reduce_partial_grads(ctx);
  double sumsq = 0;
  {
    PhaseTimer timer(ctx, Phase::optimizer);
    sumsq = shard_sum_of_squares(ctx);
  }
  if (pp_group_ && ctx.train().grad_clip > 0) {  // waits for the slowest stage: the bubble
    PhaseTimer idle(ctx, Phase::bubble);
    pp_group_->all_reduce({&sumsq, 1, DType::f64});
  }
  PhaseTimer timer(ctx, Phase::optimizer);
  const float clip = clip_scale(std::sqrt(sumsq), ctx.train().grad_clip);
  if (host_) {
    std::vector<HostUpdate::Shard> shards;
    for (int g = 0; g < G; ++g) shards.push_back({&optimizers_[g], params_of(g), grads_of(g)});
    host_->step(ctx, step, clip, shards);
  } else
    for (int g = 0; g < G; ++g) optimizers_[g].step(params_of(g), grads_of(g), step + 1, clip);
  if (!config_.shard_params && shard_group_) gather_updated_shards(ctx);
}

// zero1/2: everyone gets the updated shards. In a contiguous replica a group's padded range runs
// into the next group's, so its all-gather goes into a comm buffer (two, alternating: one
// gathering while the other is copied in) and only its own elements are copied into the replica.
void Shards::gather_updated_shards(Context& ctx) {
  const int G = int(groups_.size());
  auto mine = [&](int g) {
    return replica_params_.view(
        replica_.base[g] + std::size_t(at_.index_of(groups_[g])) * groups_[g].chunk,
        groups_[g].chunk);
  };
  if (!replica_.contiguous) {
    std::vector<Event> done;
    for (int g = 0; g < G; ++g)
      done.push_back(ctx.comm_stream().all_gather(
          *shard_group_, mine(g), replica_params_.view(replica_.base[g], groups_[g].padded()),
          ctx.compute_event()));
    for (Event& e : done) e.wait();
    return;
  }
  std::vector<int> gathered;
  std::size_t most = 0;
  for (int g = 0; g < G; ++g)
    if (shard_group_of(g)) gathered.push_back(g), most = std::max(most, groups_[g].padded());
  DeviceBuffer buffers[2];
  for (std::size_t k = 0; k < std::min<std::size_t>(2, gathered.size()); ++k)
    buffers[k] = DeviceBuffer(*memory_, MemTag::comm_buffers, param_dtype_, most);
  std::optional<Event> previous;
  auto copy_in = [&](std::size_t k) {  // gathered[k] arrived in buffers[k % 2]
    previous->wait();
    const int g = gathered[k];
    ctx.ops().copy(replica_params_.view(replica_.base[g], groups_[g].count),
                   buffers[k % 2].view(0, groups_[g].count));
  };
  for (std::size_t k = 0; k < gathered.size(); ++k) {
    const int g = gathered[k];
    Event e = ctx.comm_stream().all_gather(*shard_group_of(g), mine(g),
                                           buffers[k % 2].view(0, groups_[g].padded()),
                                           ctx.compute_event());
    if (k > 0) copy_in(k - 1);
    previous = std::move(e);
  }
  if (!gathered.empty()) copy_in(gathered.size() - 1);
}

void Shards::reduce_partial_grads(Context& ctx) {
  if (partial_slices_.empty()) return;
  DeviceOps& ops = ctx.ops();
  auto each = [&](auto&& f) {
    std::size_t at = 0;
    for (const ShardSlice& p : partial_slices_) {
      f(slice(grads_of(p.group), p.at, p.count), partial_pack_.view(at, p.count));
      at += p.count;
    }
  };
  each([&](BufferView g, BufferView pack) { ops.copy(pack, g); });
  tp_group_->all_reduce(partial_pack_.view());
  each([&](BufferView g, BufferView pack) { ops.copy(g, pack); });
}

// Only with clipping on does the norm cross ranks: its shards' squares over the shard group (the
// replicas hold equal shards), then over tp (and over pp in update()).
// Expert parallelism under allreduce: the experts' squares added over the ep group (each rank
// holds its own); under zero1 the experts' shards, one per rank of dp, with the others'.
double Shards::shard_sum_of_squares(Context& ctx) {
  auto squares = [&](const std::vector<ShardSlice>& slices) {
    double sum = 0;
    for (const ShardSlice& s : slices)
      sum += ctx.ops().sum_of_squares(slice(grads_of(s.group), s.at, s.count));
    return sum;
  };
  double sumsq = squares(norm_slices_), experts = squares(expert_norm_slices_);
  if (ctx.train().grad_clip <= 0) return sumsq + experts;
  // Sharded, each expert shard is on one rank of dp, as every other shard.
  if (!ep_group_) sumsq += experts, experts = 0;
  if (shard_group_) shard_group_->all_reduce({&sumsq, 1, DType::f64});
  if (tp_group_) tp_group_->all_reduce({&sumsq, 1, DType::f64});
  if (ep_group_) ep_group_->all_reduce({&experts, 1, DType::f64});
  return sumsq + experts;
}

BufferView Shards::params_of(int g) {
  const int index = at_.index_of(groups_[g]);
  const std::size_t valid = groups_[g].valid(index);  // the real elements only
  return config_.shard_params
             ? shard_params_[g].view(0, valid)
             : replica_params_.view(replica_.base[g] + std::size_t(index) * groups_[g].chunk,
                                    valid);
}

BufferView Shards::grads_of(int g) {
  const std::size_t valid = groups_[g].valid(at_.index_of(groups_[g]));
  return shard_grads_[g].size() ? shard_grads_[g].view(0, valid)
                                : replica_grads_.view(replica_.base[g], valid);
}

Engine::Engine(Context& ctx, const EngineConfig& c)
    : Engine(ctx, c, whole_model(ctx.model_spec()), nullptr) {}

Engine::Engine(Context& ctx, const EngineConfig& c, const Partition& partition,
               TensorParallelComm* tp, ContextParallelComm* cp, ExpertParallelComm* ep)
    : model_(std::make_unique<StageModel>(
          ctx.model_spec(), ctx.train().micro_batch, partition, ctx.memory(), ctx.train().recompute,
          ctx.train().precision.param, ctx.train().precision.tp_comm)),
      tp_(partition.tp_size > 1 ? tp : nullptr),
      shards_(std::make_unique<Shards>(ctx, c, std::vector<const StageModel*>{model_.get()})) {
  model_->set_context_comm(cp);
  if (partition.ep_size > 1) model_->set_expert_comm(ep);
  const Partition& part = model_->partition();
  schedule_ = micro_batch_schedule(shards_->buckets(), part.last_unit - part.first_unit + 1, c,
                                   ctx.model_spec().tied());
  passes_only_ = std::all_of(schedule_.begin(), schedule_.end(), [](const Action& a) {
    return a.act == Act::forward || a.act == Act::backward;
  });
}

Engine::~Engine() = default;

// A schedule of passes alone (zero1, and the all-reduce mode) runs through forward_backward()
// with --cuda-graphs, which captures its forward and its backward.
void Engine::run_micro_batch(Context& ctx, const MicroBatch& mb) {
  StageModel& model = *model_;
  const int head = model.partition().last_unit;
  const float scale = float(grad_scale(ctx));
  const int slot = model.acquire_slot();
  if (ctx.train().cuda_graphs && passes_only_ && !tp_) {
    forward_backward(ctx, model, slot, shards_->params(), shards_->grads(), mb);
    model.release_slot(slot);
    return;
  }
  for (const Action& a : schedule_) {
    if (a.act == Act::forward) {
      PhaseTimer t(ctx, Phase::forward);  // one interval per unit: the --trace timeline
      model.forward(slot, a.index, shards_->params(), mb, tp_);
      if (a.index == head) ctx.report_loss(model.loss_sum(slot), double(mb.batch) * mb.seq);
    } else if (a.act == Act::backward) {
      PhaseTimer t(ctx, Phase::backward);
      model.backward(slot, a.index, shards_->params(), shards_->grads(), tp_, scale);
    } else {
      shards_->run(ctx, a);
    }
  }
  model.release_slot(slot);
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
  shards_->zero_grads(ctx);
  const int micro_steps = ctx.train().micro_steps(ctx.mesh());
  for (int m = 0; m < micro_steps; ++m) run_micro_batch(ctx, ctx.micro_batch(step, m));
  shards_->update(ctx, step);
}

}  // namespace strata::sharded
