// The core's side of the plugin Context: mesh groups, data, the model, the memory ledger, phase
// times and the loss of the current step.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.hpp"
#include "comm/host_copy.hpp"
#include "comm/idle_clock.hpp"
#include "comm/mpi_transport.hpp"
#include "comm/transport.hpp"
#include "run/data.hpp"
#include "run/profiler_ranges.hpp"
#include "runner/run_config.hpp"
#include "strata/context.hpp"

namespace strata {

// The core's side of the plugin Context.
class CoreContext final : public Context {
 public:
  // A run on a GPU opens its backend first (open_backend): the ledger allocates there.
  CoreContext(const RunConfig& config, CommLedger& ledger)
      : config_(config),
        coord_(mesh_coord(config.mesh, mpi::world_rank())),
        ledger_(ledger),
        memory_(config.device_kind()),
        backend_(opened_backend(config.device_kind())) {
    // A split is collective over the world: every rank creates every group, in the same order.
    // The groups of an axis partition the world, so a group's first rank names it.
    const Mesh mesh(config.mesh);
    const int rank = mpi::world_rank();
    for (const auto& [axis, name] : kAxes)
      groups_[axis] = split_group(config.transport, name, mesh.group(axis, rank).front(),
                                  mesh.index_in_group(axis, rank), &ledger);

    data_ = config.data_file.empty()
                ? make_synthetic_source(config.train.seed, config.model.seq, config.model.vocab)
                : make_token_file_source(config.data_file, config.train.seed, config.model.seq,
                                         config.model.vocab);
    const std::size_t tokens = std::size_t(config.train.micro_batch) * config.model.seq;
    tokens_ = Buffer<std::int32_t>(memory_, MemTag::workspace, 2 * tokens);  // inputs | targets
    if (backend_) host_tokens_.resize(2 * tokens);
  }

  const MeshSpec& mesh() const override { return config_.mesh; }
  DeviceOps& ops() override { return backend_ ? backend_->ops() : cpu_ops(); }
  // The CPU's compute is done when it returns; a GPU's is ordered by an event the collectives
  // wait for on the device (the NCCL groups wait for its latest record).
  Event compute_event() override {
    if (backend_) backend_->record_compute_event();
    return Event{};
  }
  const MeshCoord& coord() const override { return coord_; }
  const ModelSpec& model_spec() const override { return config_.model; }
  const TrainSpec& train() const override { return config_.train; }
  // Built on first use: model-parallel strategies build their own StageModels instead, and must
  // not pay for a whole model's activations.
  StageModel& model() override {
    if (!model_) {
      model_ = std::make_unique<StageModel>(config_.model, config_.train.micro_batch,
                                            whole_model(config_.model), memory_,
                                            config_.train.recompute, config_.train.precision.param);
      if (model_->acquire_slot() != kModelSlot) throw Error("CoreContext: the model's slot");
    }
    return *model_;
  }
  MemoryLedger& memory() override { return memory_; }
  Group& group(Axis axis) override { return *groups_.at(axis); }
  CommStream& comm_stream(int index) override {
    if (index < 0 || index > 7) throw Error("comm_stream(" + std::to_string(index) + "): 0..7");
    while (int(streams_.size()) <= index)
      streams_.push_back(std::make_unique<CommStream>(ledger_, "comm" + std::to_string(index)));
    return *streams_[index];
  }
  // With cp > 1 the rank's share of each sequence: its two chunks of seq / (2 cp) tokens
  // (cp_position).
  MicroBatch micro_batch(int step, int micro) override {
    const TrainSpec& t = config_.train;
    const int B = t.micro_batch, T = config_.model.seq, Tc = T / config_.mesh.cp;
    // Global sample index: micro-batches first, then dp ranks, so any split sees the same batch.
    std::int64_t first = std::int64_t(micro) * B * config_.mesh.dp + std::int64_t(coord_.dp) * B;
    const std::size_t n = std::size_t(B) * T, nc = std::size_t(B) * Tc;
    // The tokens on the run's device: generated on the host, copied over (once) on a GPU.
    std::int32_t* host = backend_ ? host_tokens_.data() : tokens_.data();
    for (int b = 0; b < B; ++b) data_->fill(step, first + b, host + b * T, host + n + b * T);
    if (Tc != T) {  // keep the share: inputs then targets, [B, Tc] each, in place
      const int cp = config_.mesh.cp, chunk = Tc / 2;
      for (std::size_t half = 0; half < 2; ++half)
        for (std::size_t b = 0; b < std::size_t(B); ++b)
          for (int c = 0; c < 2; ++c)  // chunks move only towards the front: no overlap
            std::copy_n(host + half * n + b * T + cp_position(T, cp, coord_.cp, c * chunk), chunk,
                        host + half * nc + b * Tc + c * chunk);
    }
    if (backend_) backend_->copy(tokens_.data(), host, 2 * nc * sizeof(std::int32_t));
    open_micro_batch_range(micro);
    return MicroBatch{tokens_.data(), tokens_.data() + nc, B, Tc};
  }
  void add_phase_time(Phase phase, double seconds) override {
    phase_s_[static_cast<int>(phase)] += seconds;
  }
  // On a GPU a phase lasts from the compute stream's mark at its start (begin_phase) to the mark
  // at its end, measured once the step has synchronised the stream (resolve_device_phases): the
  // kernels' time, not the host's enqueueing, and no synchronisation inside the step. A phase
  // reported without begin_phase (a plugin calling this directly) ends when the stream drains.
  void begin_phase(Phase) override {
    if (IdleClock* clock = device_clock()) open_phase_marks_.push_back(clock->mark());
  }
  void add_phase_interval(Phase phase, double t0, double t1) override {
    if (IdleClock* clock = device_clock(); clock && !open_phase_marks_.empty()) {
      device_phases_.push_back({phase, open_phase_marks_.back(), clock->mark()});
      open_phase_marks_.pop_back();
      return;
    }
    if (backend_) {
      backend_->synchronize();
      t1 = now();
    }
    phase_s_[static_cast<int>(phase)] += t1 - t0;
    if (config_.trace) intervals_.push_back({phase, t0, t1});
  }
  // --cuda-graphs: the first call of an identity runs the passes, the second captures them, and
  // every later one replays the graph.
  void run_graphed(const std::vector<const void*>& identity,
                   const std::function<void()>& passes) override {
    if (!config_.train.cuda_graphs || !backend_) return passes();
    ++graphed_calls_;
    Graphed& g = graphs_[identity];
    if (!g.warmed_up) {
      g.warmed_up = true;
      return passes();
    }
    if (!g.graph) {
      g.graph = backend_->capture(passes);
      ++graphs_captured_;
    }
    g.graph->launch();
    ++graph_launches_;
  }
  std::uint64_t graphed_calls() const { return graphed_calls_; }
  int graphs_captured() const { return graphs_captured_; }
  std::uint64_t graph_launches() const { return graph_launches_; }
  void report_loss(double loss_sum, double tokens) override {
    loss_sum_ += loss_sum;
    loss_tokens_ += tokens;
  }

  void copy_to_host(BufferView host, BufferView device) override {
    recorded_host_copy(ledger_, CommOp::d2h, host, device);
  }
  void copy_to_device(BufferView device, BufferView host) override {
    recorded_host_copy(ledger_, CommOp::h2d, device, host);
  }

  void begin_step() {
    phase_s_.fill(0);
    loss_sum_ = loss_tokens_ = 0;
  }
  // The profiler's micro-batch range: from a micro-batch's tokens being handed out to the next
  // micro-batch's, or to the end of the step (a pipeline stage without tokens opens none).
  void open_micro_batch_range(int micro) {
    close_micro_batch_range();
    if (profiler_attached())
      micro_batch_range_ = profiler_range_start(("micro_batch " + std::to_string(micro)).c_str());
  }
  void close_micro_batch_range() { profiler_range_end(std::exchange(micro_batch_range_, 0)); }
  // After the step's synchronisation: each device-timed phase's seconds, and for --trace its
  // interval on the host clock, placed by a last mark that the drained stream passes at once.
  void resolve_device_phases() {
    if (device_phases_.empty()) return;
    IdleClock& clock = *device_clock();
    const std::uint64_t last = clock.mark();
    backend_->synchronize();
    const double t_last = now();
    for (const DevicePhase& p : device_phases_) {
      const double seconds = clock.seconds_between(p.start, p.end);
      phase_s_[static_cast<int>(p.phase)] += seconds;
      if (config_.trace) {
        const double t1 = t_last - clock.seconds_between(p.end, last);
        intervals_.push_back({p.phase, t1 - seconds, t1});
      }
      clock.release(p.start);
      clock.release(p.end);
    }
    clock.release(last);
    device_phases_.clear();
  }
  void synchronize_streams() {
    for (auto& s : streams_) s->synchronize();
    if (backend_) backend_->synchronize();
  }
  double phase_s(Phase p) const { return phase_s_[static_cast<int>(p)]; }
  double loss_sum() const { return loss_sum_; }
  double loss_tokens() const { return loss_tokens_; }
  const DataSource& data() const { return *data_; }
  struct Interval {
    Phase phase;
    double t0, t1;
  };
  // Phase intervals recorded since the last call (--trace only).
  std::vector<Interval> take_intervals() { return std::exchange(intervals_, {}); }

 private:
  const RunConfig& config_;
  MeshCoord coord_;
  CommLedger& ledger_;
  MemoryLedger memory_;
  DeviceBackend* backend_;               // null on the CPU
  std::uint64_t micro_batch_range_ = 0;  // the open profiler range, 0 when none
  IdleClock* device_clock() const { return backend_ ? idle_clock() : nullptr; }
  struct DevicePhase {
    Phase phase;
    std::uint64_t start, end;  // marks on the compute stream (idle_clock())
  };
  std::vector<std::uint64_t> open_phase_marks_;  // phases begun, not yet ended (innermost last)
  std::vector<DevicePhase> device_phases_;       // ended this step, not yet measured
  std::map<Axis, std::unique_ptr<Group>> groups_;
  std::vector<std::unique_ptr<CommStream>> streams_;
  std::unique_ptr<DataSource> data_;
  Buffer<std::int32_t> tokens_;            // inputs | targets of the micro-batch [2, B*T]
  std::vector<std::int32_t> host_tokens_;  // GPU runs: the same, before the copy
  std::unique_ptr<StageModel> model_;
  struct Graphed {
    bool warmed_up = false;
    std::unique_ptr<StreamGraph> graph;
  };
  std::map<std::vector<const void*>, Graphed> graphs_;  // --cuda-graphs, by identity
  int graphs_captured_ = 0;
  std::uint64_t graphed_calls_ = 0, graph_launches_ = 0;
  std::array<double, 4> phase_s_{};
  double loss_sum_ = 0, loss_tokens_ = 0;
  std::vector<Interval> intervals_;
};

}  // namespace strata
