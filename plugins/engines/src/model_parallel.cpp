// Model-parallel engine (see model_parallel.hpp): the rank's plan and the step (its StepPlan is
// mp_plan.cpp's).
#include "strata/engines/model_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "rank_plan.hpp"
#include "strata/data_parallel.hpp"
#include "strata/engines/sharded.hpp"

namespace strata::mp {
namespace {

// Message tags on the pp group: activations forward, gradients backward, the tied-wte exchange.
constexpr int kTagActivation = 1, kTagGradient = 2, kTagTied = 3;
// Comm streams: activations sent on, gradients sent back (in a V, chunk 1's on 3 and 4), the rest.
constexpr int kStreamNext = 1, kStreamPrev = 2;
constexpr int kStreamContext = 5;  // ring attention's passes

// The tp collectives of a run's StageModels: the config's own, or one blocking call each.
std::unique_ptr<TensorParallelComm> make_tp_comm(const MpConfig& cfg, Context& ctx) {
  if (ctx.mesh().tp == 1) return nullptr;
  return cfg.make_tp_comm ? cfg.make_tp_comm(ctx.group(Axis::tp))
                          : std::make_unique<SyncTensorParallelComm>(ctx.group(Axis::tp));
}

// The context-parallel exchanges of a run's StageModels (cp > 1): Ulysses' all-to-alls blocking,
// ring attention's passes on a comm stream of their own (overlapped with each block's attention).
std::unique_ptr<ContextParallelComm> make_cp_comm(const MpConfig& cfg, Context& ctx) {
  if (context_parallel_size(cfg, ctx.mesh()) == 1) return nullptr;
  CommStream* ring =
      cfg.context_attention == ContextAttention::ring ? &ctx.comm_stream(kStreamContext) : nullptr;
  return std::make_unique<SyncContextParallelComm>(ctx.group(Axis::cp), ring,
                                                   [&ctx] { return ctx.compute_event(); });
}

// A partition's expert- and context-parallel place: the experts split over the mesh's ep with
// expert parallelism, the sequences over its cp with context parallelism.
void place_on_ep_and_cp(Partition& part, const MeshSpec& mesh, const MeshCoord& coord,
                        const MpConfig& cfg) {
  part.ep_size = cfg.expert_parallel ? mesh.ep : 1;
  part.ep_rank = cfg.expert_parallel ? coord.ep : 0;
  part.cp_size = context_parallel_size(cfg, mesh);
  part.cp_rank = part.cp_size > 1 ? coord.cp : 0;
  part.cp_attention = cfg.context_attention;
}

}  // namespace

Plan make_plan(const MeshSpec& mesh, const MeshCoord& coord, const ModelSpec& model,
               const TrainSpec& t, const MpConfig& cfg) {
  Plan p;
  p.P = mesh.pp;
  p.stage = coord.pp;
  p.tied = model.tied();
  p.v = cfg.virtual_stages;
  p.placement = pp::chunk_placement(cfg.schedule);
  p.K = p.P * p.v;
  p.m = t.micro_steps(mesh);
  const auto units = chunk_units(model, p.K, cfg.stage_layers);
  for (int c = 0; c < p.v; ++c) {
    const int k = pp::global_chunk(p.placement, p.P, p.stage, c);
    Partition part;
    part.first_unit = units[k].first;
    part.last_unit = units[k].second;
    part.tp_size = mesh.tp;
    part.tp_rank = coord.tp;
    part.sequence_parallel = cfg.sequence_parallel;
    place_on_ep_and_cp(part, mesh, coord, cfg);
    p.parts.push_back(part);
    p.global.push_back(k);
  }
  p.actions = pp::pipeline_schedule(cfg.schedule, p.P, p.stage, p.m, p.v);
  return p;
}

DpSchedule dp_schedule_of(const Plan& plan, const std::vector<sharded::ShardGroup>& groups,
                          const MpConfig& cfg, const ModelSpec& model) {
  return dp_schedule(plan.actions, plan.parts, groups, dp_axis_config(cfg), plan.tied_exchange(),
                     model.layers + 1);
}

bool on_sharded_engine(const MpConfig& cfg, const MeshSpec& mesh) {
  return (cfg.dp == DpMode::zero2 || cfg.dp == DpMode::fsdp) && mesh.replicas() > 1 && mesh.pp == 1;
}

int context_parallel_size(const MpConfig& cfg, const MeshSpec& mesh) {
  return cfg.context_parallel ? mesh.cp : 1;
}

Partition sharded_partition(const MeshSpec& mesh, const MeshCoord& coord, const ModelSpec& model,
                            const MpConfig& cfg) {
  Partition part = sharded::tp_partition(model, mesh.tp, coord.tp, cfg.sequence_parallel);
  place_on_ep_and_cp(part, mesh, coord, cfg);
  return part;
}

sharded::EngineConfig dp_axis_config(const MpConfig& cfg) {
  sharded::EngineConfig c;
  c.replicate = cfg.dp == DpMode::allreduce;
  c.shard_grads = cfg.dp == DpMode::zero2 || cfg.dp == DpMode::fsdp;
  c.shard_params = cfg.dp == DpMode::fsdp;
  c.units_per_group = 1;  // fsdp: one unit per group
  // zero2: every unit a bucket of its own; allreduce and zero1: a chunk's gradients in one.
  c.bucket_mb = c.shard_grads ? 0 : std::numeric_limits<double>::infinity();
  c.forward_prefetch = c.backward_prefetch = cfg.prefetch;
  c.offload_optimizer = cfg.offload_optimizer;
  return c;
}

OptionSpec dp_option() {
  return {"dp",
          OptionType::choice,
          "allreduce",
          "data parallelism: allreduce (every dp rank holds all optimizer state); zero1 "
          "(reduce-scatter gradients, optimizer state for 1/dp of the local parameters, "
          "all-gather the update: Megatron's distributed optimizer); zero2 (also gradients: "
          "reduce-scattered per unit as backward produces them, every micro-batch); fsdp (also "
          "parameters: all-gathered per unit before its forward and backward, freed after). Under "
          "a pipeline, as torchtitan runs FSDP with PP: parameters gathered once per step, "
          "gradients reduce-scattered once per step, at each chunk's last micro-batch",
          {"allreduce", "zero1", "zero2", "fsdp"}};
}

std::vector<OptionSpec> tensor_parallel_options() {
  return {{"sp",
           OptionType::choice,
           "off",
           "sequence parallelism: all-gather / reduce-scatter instead of all-reduce, LayerNorm on "
           "token-row shards",
           {"on", "off"}},
          dp_option(),
          {"prefetch",
           OptionType::integer,
           "1",
           "dp=fsdp: units all-gathered ahead of the one computing, overlapped with compute",
           {}},
          {"offload",
           OptionType::choice,
           "none",
           "dp=zero1|zero2|fsdp: optimizer: AdamW state (m, v, bf16's fp32 master) in host "
           "memory, the update on the CPU",
           {"none", "optimizer"}}};
}

MpConfig tensor_parallel_config(const std::string& name, const Options& o) {
  MpConfig c;
  c.strategy = name;
  c.pipeline = false;
  c.sequence_parallel = o.get("sp") == "on";
  c.dp = dp_mode(o.get("dp"));
  c.prefetch = int(o.get_int("prefetch"));
  c.offload_optimizer = o.get("offload") == "optimizer";
  return c;
}

DpMode dp_mode(const std::string& option) {
  return option == "zero1"   ? DpMode::zero1
         : option == "zero2" ? DpMode::zero2
         : option == "fsdp"  ? DpMode::fsdp
                             : DpMode::allreduce;
}

const char* dp_mode_name(DpMode mode) {
  switch (mode) {
    case DpMode::zero1:
      return "zero1";
    case DpMode::zero2:
      return "zero2";
    case DpMode::fsdp:
      return "fsdp";
    default:
      return "allreduce";
  }
}

std::vector<std::pair<int, int>> chunk_units(const ModelSpec& model, int chunks,
                                             const std::vector<int>& stage_layers) {
  const int L = model.layers;
  std::vector<std::pair<int, int>> r;
  r.reserve(std::size_t(chunks));
  int next = 1;  // first block unit
  for (int k = 0; k < chunks; ++k) {
    const int first = k == 0 ? 0 : next;
    next +=
        stage_layers.empty() ? L / chunks + (k < L % chunks ? 1 : 0) : stage_layers[std::size_t(k)];
    const int last = k == chunks - 1 ? L + 1 : next - 1;
    r.emplace_back(first, last);
  }
  return r;
}

namespace {

// Expert parallelism over the mesh's ep group: a moe whose experts ep divides (every dp mode: the
// sharded ones shard the experts' runs over ep_dp, sharded::make_groups).
void validate_expert_axis(const MeshSpec& mesh, const ModelSpec& model, const MpConfig& cfg) {
  const std::string who = "--plugin " + cfg.strategy;
  if (model.arch != Arch::moe)
    throw ConfigError(who + ": expert parallelism needs a mixture of experts (--arch moe)");
  if (model.experts % mesh.ep != 0)
    throw ConfigError(who + ": --mesh ep=" + std::to_string(mesh.ep) +
                      " must divide the experts (" + std::to_string(model.experts) +
                      "): each ep rank holds experts / ep of them");
}

}  // namespace

void validate(const MeshSpec& mesh, const TrainSpec& t, const ModelSpec& model,
              const MpConfig& cfg) {
  const std::string who = cfg.strategy;
  validate_tensor_parallel(model, t.micro_batch, mesh.tp, cfg.sequence_parallel);
  if (mesh.cp > 1 && !cfg.context_parallel)
    throw ConfigError("--mesh cp=" + std::to_string(mesh.cp) + ": " + who +
                      " does not split sequences; use --plugin cp (which takes tp too) or a "
                      "pipeline");
  validate_context_parallel(model, mesh.tp, mesh.cp, cfg.context_attention);
  // The ep plugin is expert parallelism whatever its ep; a pipeline is from ep 2.
  if (cfg.expert_parallel && (!cfg.pipeline || mesh.ep > 1)) validate_expert_axis(mesh, model, cfg);
  // prefetch is the sharded engine's (dp=zero2|fsdp); offload needs an optimizer sharded over dp.
  if (cfg.prefetch < 0) throw ConfigError("--plugin-opt prefetch: must be >= 0");
  if (cfg.offload_optimizer && cfg.dp == DpMode::allreduce)
    throw ConfigError(
        "--plugin-opt offload=optimizer: needs dp=zero1, zero2 or fsdp (got "
        "dp=allreduce), as ZeRO-Offload and Megatron's optimizer offload need the "
        "distributed optimizer");
  if (!cfg.pipeline) {
    if (mesh.pp != 1)
      throw ConfigError("--mesh pp=" + std::to_string(mesh.pp) + ": " + who +
                        " has no pipeline; use gpipe, 1f1b or interleaved (which take tp too)");
    return;
  }
  const int P = mesh.pp, v = cfg.virtual_stages, K = P * v, m = t.micro_steps(mesh);
  if (v < 1)
    throw ConfigError("--plugin-opt virtual_stages=" + std::to_string(v) + ": must be >= 1");
  const int chunks = cfg.schedule == pp::PipeSchedule::zb_v ? 2 : 1;  // zb-v: its V's two
  if (cfg.schedule != pp::PipeSchedule::interleaved && v != chunks)
    throw ConfigError("--plugin-opt virtual_stages=" + std::to_string(v) + ": only interleaved " +
                      "has virtual stages (" + who + " needs " + std::to_string(chunks) + ")");
  if (cfg.schedule == pp::PipeSchedule::zb_v && P < 2)
    throw ConfigError("--mesh pp=1: zb-v needs pp >= 2");
  if (pp::splits_backward(cfg.schedule)) validate_split_backward(t.recompute);
  if (cfg.schedule == pp::PipeSchedule::interleaved) {
    if (P < 2) throw ConfigError("--mesh pp=1: interleaved needs pp >= 2");
    if (m % P != 0)
      throw ConfigError("interleaved: micro-batches per step (" + std::to_string(m) +
                        " = --global-batch / (--micro-batch x dp)) must be a multiple of pp (" +
                        std::to_string(P) + ")");
  }
  if (model.layers < K)
    throw ConfigError("--mesh pp=" + std::to_string(P) +
                      (chunks == 2 ? " x zb-v's 2 chunks"
                       : v > 1     ? " x virtual_stages=" + std::to_string(v)
                                   : "") +
                      ": the model has " + std::to_string(model.layers) +
                      " layers, fewer than the " + std::to_string(K) + " pipeline chunks");
  if (!cfg.stage_layers.empty()) {
    int sum = 0;
    for (int n : cfg.stage_layers) sum += n;
    if (int(cfg.stage_layers.size()) != K || sum != model.layers)
      throw ConfigError("--plugin-opt stage_layers: needs " + std::to_string(K) +
                        " entries (pp x virtual_stages) summing to the " +
                        std::to_string(model.layers) + " layers");
  }
  if (cfg.microbatches != 0 && cfg.microbatches != m) {
    // In 64 bits: the advice must not wrap into a negative batch.
    const long long batch = 1LL * cfg.microbatches * t.micro_batch * mesh.dp;
    throw ConfigError(
        "--plugin-opt microbatches=" + std::to_string(cfg.microbatches) + ": the batch gives " +
        std::to_string(m) + " (--global-batch / (--micro-batch x dp)); " +
        (cfg.microbatches > 0 && batch <= 2147483647LL
             ? "set --global-batch " + std::to_string(batch)
             : std::string("no --global-batch gives that many (at most 2147483647)")));
  }
}

// ---------------------------------------------------------------------------------------------

namespace {

// What crosses a stage boundary (one micro-batch's boundary_count() elements: the residual stream
// forward, in the parameters' dtype, its fp32 gradient backward), moved in the tp comm dtype
// (MixedPrecision::tp_comm; the run's precision by default, as Megatron-LM sends them). A tensor
// kept in that dtype (a bf16 run's activations) is sent and received into as it is; another (its
// gradients, or activations under --tp-comm-dtype fp32) is cast into its slot's send buffer,
// which the send reads until it completes, or received into the one receive buffer and cast into
// place on the compute thread. All MemTag::comm_buffers; a slot's send buffer is made at its
// first cast, so there is one per slot in flight of a chunk that casts what it sends, and a
// receive buffer where a chunk casts what it receives (boundary_casts: what plan_setup counts).
class BoundaryBuffers {
 public:
  BoundaryBuffers(MemoryLedger& memory, DType wire, std::size_t count, std::size_t chunks,
                  bool receives_cast)
      : memory_(memory), wire_(wire), count_(count), send_(chunks) {
    if (receives_cast) recv_ = DeviceBuffer(memory_, MemTag::comm_buffers, wire_, count_);
  }
  bool casts(const BufferView& v) const { return v.dtype != wire_; }
  // The view a send of `src` reads: src itself, or src cast into the slot's send buffer (whose
  // previous send must have completed: the caller waits for the slot's sends first).
  BufferView outgoing(DeviceOps& ops, int chunk, int slot, const BufferView& src) {
    if (!casts(src)) return src;
    std::vector<DeviceBuffer>& bufs = send_[std::size_t(chunk)];
    while (int(bufs.size()) <= slot)
      bufs.emplace_back(memory_, MemTag::comm_buffers, wire_, count_);
    ops.cast(bufs[std::size_t(slot)].view(), src);
    return bufs[std::size_t(slot)].view();
  }
  // The view a receive for `dst` fills; then arrived(dst) puts it in place.
  BufferView incoming(const BufferView& dst) { return casts(dst) ? recv_.view() : dst; }
  void arrived(DeviceOps& ops, const BufferView& dst) {
    if (casts(dst)) ops.cast(dst, recv_.view());
  }
  // A gradient (fp32) where it is kept.
  BufferView fp32(const float* p) const {
    return {const_cast<float*>(p), count_, DType::f32, memory_.device()};
  }

 private:
  MemoryLedger& memory_;
  DType wire_;
  std::size_t count_;
  std::vector<std::vector<DeviceBuffer>> send_;  // [chunk][slot]
  DeviceBuffer recv_;
};

}  // namespace

class Engine {
 public:
  Engine(Context& ctx, const MpConfig& cfg)
      : cfg_(cfg), plan_(make_plan(ctx.mesh(), ctx.coord(), ctx.model_spec(), ctx.train(), cfg)) {
    MemoryLedger& mem = ctx.memory();
    std::vector<const StageModel*> models;
    for (const Partition& part : plan_.parts) {
      chunks_.push_back(std::make_unique<StageModel>(
          ctx.model_spec(), ctx.train().micro_batch, part, mem, ctx.train().recompute,
          ctx.train().precision.param, ctx.train().precision.tp_comm,
          pp::splits_backward(cfg.schedule)));
      models.push_back(chunks_.back().get());
    }
    if (plan_.parts.front().ep_size > 1) {  // the moe blocks' exchanges, on the ep group
      ep_comm_ = std::make_unique<SyncExpertParallelComm>(ctx.group(Axis::ep));
      for (auto& chunk : chunks_) chunk->set_expert_comm(ep_comm_.get());
    }
    cp_comm_ = make_cp_comm(cfg, ctx);
    for (auto& chunk : chunks_) chunk->set_context_comm(cp_comm_.get());
    shards_ = std::make_unique<sharded::Shards>(ctx, dp_axis_config(cfg), models);
    dp_ = dp_schedule_of(plan_, shards_->buckets(), cfg, ctx.model_spec());
    pending_.resize(chunks_.size());
    if (plan_.K > 1)
      boundary_.emplace(mem, ctx.train().precision.tp_comm, chunks_.front()->boundary_count(),
                        chunks_.size(), receives_cast(plan_, ctx.train().precision));
    tp_comm_ = make_tp_comm(cfg, ctx);
    if (plan_.tied_exchange() && !plan_.tied_local())
      tied_recv_ = DeviceBuffer(mem, MemTag::comm_buffers, ctx.train().precision.reduce,
                                tied_chunk().wte_count());
  }

  // The schedule's actions, the stages' sends drained, the tied gradient exchanged; then the
  // data-parallel axis reduces, clips and updates (Shards::update).
  void train_step(Context& ctx, int step) {
    shards_->zero_grads(ctx);
    Group& pp = ctx.group(Axis::pp);
    slot_of_.assign(chunks_.size(), std::vector<int>(plan_.m, -1));
    for (std::size_t i = 0; i < plan_.actions.size(); ++i) {
      const pp::PipeAction& a = plan_.actions[i];
      if (a.forward())
        slot_of_[a.chunk][a.micro] = forward_action(ctx, step, a, dp_.passes(i), pp);
      else if (a.pass == pp::PipePass::backward)
        backward_action(ctx, a, slot_of_[a.chunk][a.micro], dp_.passes(i), pp);
      else
        weight_action(ctx, a, slot_of_[a.chunk][a.micro], dp_.passes(i));
    }
    {
      // The stage's own sends, then the end-of-step meeting with the other stages: both are the
      // pipeline draining (the last stage waits here for the first to finish its backward).
      std::optional<PhaseTimer> idle;
      if (plan_.P > 1) idle.emplace(ctx, Phase::bubble);
      for (std::size_t c = 0; c < chunks_.size(); ++c)
        for (std::size_t s = 0; s < pending_[c].size(); ++s) wait_sends(ctx, int(c), int(s));
      exchange_tied_grads(ctx, pp);
    }
    for (const sharded::Action& x : dp_.end) shards_->run(ctx, x);
    shards_->update(ctx, step);
    // The tied copies stay equal: same initial values, same summed gradient, same update.
  }

 private:
  std::vector<Event>& pending(int chunk, int slot) {
    auto& p = pending_[chunk];
    if (int(p.size()) <= slot) p.resize(slot + 1);
    return p[slot];
  }

  // In a V, chunk 1's activations go to the previous stage and its gradients to the next, each on
  // a stream of its own: every stream carries one kind of message to one peer, in the order that
  // peer receives them (its own order of micro-batches through the chunk).
  int send_stream(int stream, int chunk) const {
    return plan_.placement == pp::ChunkPlacement::v_shape ? stream + 2 * chunk : stream;
  }

  // Before a slot's buffers are reused, the sends reading them must have completed.
  void wait_sends(Context& ctx, int chunk, int slot) {
    std::vector<Event>& events = pending(chunk, slot);
    if (events.empty()) return;
    PhaseTimer idle(ctx, Phase::bubble);
    for (const Event& e : events) e.wait();
    events.clear();
  }

  StageModel& tied_chunk() { return *chunks_[std::size_t(plan_.tied_chunk())]; }
  BufferView tied_grads(int chunk) {
    const StageModel& sm = *chunks_[std::size_t(chunk)];
    return shards_->local_grads(chunk, sm.wte_offset(), sm.wte_count());
  }

  // The first and the last chunk hold the tied wte (embedding / LM head): each holder sends its
  // gradient to the other and adds what it receives, so both copies see the same sum (a + b ==
  // b + a exactly). In a V both are stage 0's: the embedding's copy adds the head's, which takes
  // the sum.
  void exchange_tied_grads(Context& ctx, Group& pp) {
    if (!plan_.tied_exchange()) return;
    const BufferView g = tied_grads(plan_.tied_chunk());
    if (plan_.tied_local()) {
      const BufferView head = tied_grads(plan_.local_chunk(plan_.K - 1));
      ctx.ops().axpy(g, 1.0, head);
      ctx.ops().copy(head, g);
      return;
    }
    const int peer = plan_.tied_peer();
    Event sent = ctx.comm_stream(kStreamNext)
                     .enqueue([&pp, g, peer] { pp.send(g, peer, kTagTied); }, ctx.compute_event());
    pp.recv(tied_recv_.view(), peer, kTagTied);
    sent.wait();
    ctx.ops().axpy(g, 1.0, tied_recv_.view());
  }

  // One micro-batch forward through one local chunk: receive its input (the bubble when it is
  // late), compute, send the output on. Returns the activation slot it holds until backward.
  // Unit u's pass with the data-parallel axis's actions around it.
  template <typename Pass>
  void unit_pass(Context& ctx, const UnitPassActions& dp, Pass&& pass) {
    for (const sharded::Action& x : dp.before) shards_->run(ctx, x);
    pass();
    for (const sharded::Action& x : dp.after) shards_->run(ctx, x);
  }

  // A chunk's unit passes in pass order (backward: last unit first), each with its data-parallel
  // actions. When nothing runs between them (no such action, no tp collective) they go through
  // Context::run_graphed: what --cuda-graphs captures.
  template <typename Pass>
  void chunk_passes(Context& ctx, const StageModel& sm, int slot, const MicroBatch& mb,
                    bool backward, std::span<const UnitPassActions> dp, Pass&& pass) {
    const Partition& part = sm.partition();
    auto run = [&] {
      for (int i = 0; i <= part.last_unit - part.first_unit; ++i)
        unit_pass(ctx, dp[std::size_t(i)],
                  [&] { pass(backward ? part.last_unit - i : part.first_unit + i); });
    };
    // A split backward records its deferred GEMMs on the host, which a graph's replay would skip.
    const bool split = backward && pp::splits_backward(cfg_.schedule);
    const bool compute_only =
        !tp_comm_ && !ep_comm_ && !split && std::all_of(dp.begin(), dp.end(), [](const auto& d) {
          return d.before.empty() && d.after.empty();
        });
    if (!compute_only) return run();
    ctx.run_graphed(passes_identity(sm, slot, backward, mb, shards_->params(), shards_->grads()),
                    run);
  }

  int forward_action(Context& ctx, int step, const pp::PipeAction& a,
                     std::span<const UnitPassActions> dp, Group& pp) {
    StageModel& sm = *chunks_[a.chunk];
    const int k = plan_.global[a.chunk], slot = sm.acquire_slot();
    wait_sends(ctx, a.chunk, slot);
    // Middle stages do not read tokens: no data is generated for them.
    const MicroBatch mb = sm.needs_tokens() ? ctx.micro_batch(step, a.micro)
                                            : MicroBatch{nullptr, nullptr, ctx.train().micro_batch,
                                                         ctx.model_spec().seq};
    if (plan_.remote(k, -1)) {
      {
        PhaseTimer idle(ctx, Phase::bubble);
        pp.recv(boundary_->incoming(sm.input(slot)), plan_.holder(k - 1), kTagActivation);
      }
      boundary_->arrived(ctx.ops(), sm.input(slot));
    } else if (k > 0) {  // zb-v's turn: the chunk before is this rank's, its slot still held
      const int before = plan_.local_chunk(k - 1);
      ctx.ops().copy(sm.input(slot), chunks_[before]->output(slot_of_[before][a.micro]));
    }
    {
      PhaseTimer t(ctx, Phase::forward);
      chunk_passes(ctx, sm, slot, mb, false, dp,
                   [&](int u) { sm.forward(slot, u, shards_->params(), mb, tp_comm_.get()); });
    }
    if (sm.has_head())
      // The slot's tokens: seq / cp of each sequence (Context::micro_batch).
      ctx.report_loss(sm.loss_sum(slot),
                      double(ctx.train().micro_batch) * (ctx.model_spec().seq / ctx.mesh().cp));
    if (plan_.remote(k, +1)) {
      const BufferView out = boundary_->outgoing(ctx.ops(), a.chunk, slot, sm.output(slot));
      const int next = plan_.holder(k + 1);
      pending(a.chunk, slot)
          .push_back(ctx.comm_stream(send_stream(kStreamNext, a.chunk))
                         .enqueue([&pp, out, next] { pp.send(out, next, kTagActivation); },
                                  ctx.compute_event()));
    }
    return slot;
  }

  // Its backward: receive d(output), compute, send d(input) back, free the slot.
  void backward_action(Context& ctx, const pp::PipeAction& a, int slot,
                       std::span<const UnitPassActions> dp, Group& pp) {
    StageModel& sm = *chunks_[a.chunk];
    const int k = plan_.global[a.chunk];
    const BufferView output_grad = boundary_ ? boundary_->fp32(sm.output_grad()) : BufferView{};
    if (plan_.remote(k, +1)) {
      {
        PhaseTimer idle(ctx, Phase::bubble);
        pp.recv(boundary_->incoming(output_grad), plan_.holder(k + 1), kTagGradient);
      }
      boundary_->arrived(ctx.ops(), output_grad);
    }  // else at zb-v's turn the chunk after has left d(output) there (below)
    {
      PhaseTimer t(ctx, Phase::backward);
      const float scale = float(grad_scale(ctx));
      chunk_passes(ctx, sm, slot, MicroBatch{}, true, dp, [&](int u) {
        sm.backward(slot, u, shards_->params(), shards_->grads(), tp_comm_.get(), scale);
      });
    }
    if (plan_.remote(k, -1)) {
      // The slot's send buffer may have carried its activation (cast): that send is done (the
      // next stage received it before sending this gradient), and waiting makes it so on every
      // transport.
      const BufferView grad = boundary_->fp32(sm.input_grad(slot));
      if (boundary_->casts(grad)) wait_sends(ctx, a.chunk, slot);
      const BufferView din = boundary_->outgoing(ctx.ops(), a.chunk, slot, grad);
      const int prev = plan_.holder(k - 1);
      pending(a.chunk, slot)
          .push_back(ctx.comm_stream(send_stream(kStreamPrev, a.chunk))
                         .enqueue([&pp, din, prev] { pp.send(din, prev, kTagGradient); },
                                  ctx.compute_event()));
    } else if (k > 0) {
      // zb-v's turn: d(input) into the chunk before's d(output), which its next pass through
      // backward reads (the schedule runs no other backward or weight pass of it in between).
      StageModel& before = *chunks_[std::size_t(plan_.local_chunk(k - 1))];
      ctx.ops().copy(boundary_->fp32(before.output_grad()), boundary_->fp32(sm.input_grad(slot)));
    }
    if (!pp::splits_backward(cfg_.schedule)) sm.release_slot(slot);
  }

  // A split backward's weight pass (zb-h1): the chunk's deferred weight gradients, then the
  // data-parallel axis's actions of its units in pass order (zero2, fsdp: in the chunk's last
  // weight pass, its units' reductions); nothing is sent. Then the slot is free.
  void weight_action(Context& ctx, const pp::PipeAction& a, int slot,
                     std::span<const UnitPassActions> dp) {
    StageModel& sm = *chunks_[a.chunk];
    {
      PhaseTimer t(ctx, Phase::backward);
      sm.backward_weights(slot);
    }
    for (const UnitPassActions& unit : dp) unit_pass(ctx, unit, [] {});
    sm.release_slot(slot);
  }

  MpConfig cfg_;
  Plan plan_;
  std::vector<std::unique_ptr<StageModel>> chunks_;
  std::unique_ptr<sharded::Shards> shards_;  // the chunks' parameters, gradients, AdamW state
  DpSchedule dp_;                            // Shards' actions around the unit passes
  DeviceBuffer tied_recv_;                   // the other stage's tied wte gradient
  std::vector<std::vector<std::vector<Event>>> pending_;  // [chunk][slot]: sends in flight
  std::vector<std::vector<int>> slot_of_;                 // [chunk][micro]: the step's slots
  std::unique_ptr<TensorParallelComm> tp_comm_;           // null when tp == 1
  std::unique_ptr<ExpertParallelComm> ep_comm_;           // null without expert parallelism
  std::unique_ptr<ContextParallelComm> cp_comm_;          // null at cp 1
  std::optional<BoundaryBuffers> boundary_;               // pipelines (more than one chunk)
};

MpStrategy::MpStrategy(MpConfig c) : config_(std::move(c)) {}
MpStrategy::~MpStrategy() = default;

void MpStrategy::setup(Context& ctx) {
  if (!on_sharded_engine(config_, ctx.mesh())) {
    engine_ = std::make_unique<Engine>(ctx, config_);
    return;
  }
  tp_comm_ = make_tp_comm(config_, ctx);
  cp_comm_ = make_cp_comm(config_, ctx);
  const Partition part = sharded_partition(ctx.mesh(), ctx.coord(), ctx.model_spec(), config_);
  if (part.ep_size > 1) ep_comm_ = std::make_unique<SyncExpertParallelComm>(ctx.group(Axis::ep));
  sharded_ = std::make_unique<sharded::Engine>(ctx, dp_axis_config(config_), part, tp_comm_.get(),
                                               cp_comm_.get(), ep_comm_.get());
}

void MpStrategy::train_step(Context& ctx, int step) {
  if (sharded_) return sharded_->train_step(ctx, step);
  engine_->train_step(ctx, step);
}

}  // namespace strata::mp
