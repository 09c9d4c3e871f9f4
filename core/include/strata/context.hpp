// strata SDK: what a strategy sees of the run. The core implements Context; a plugin receives it
// in setup() and train_step().
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/comm.hpp"
#include "strata/device.hpp"
#include "strata/export.hpp"
#include "strata/memory.hpp"
#include "strata/mesh.hpp"
#include "strata/model.hpp"
#include "strata/stage_model.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

struct TrainSpec {
  int micro_batch = 8;   // sequences per micro-batch per rank
  int global_batch = 8;  // sequences per optimizer step, all ranks
  int steps = 20;
  int warmup = 2;  // first steps excluded from the summary statistics (still trained)
  std::uint64_t seed = 1234;
  double lr = 1e-3;
  double grad_clip = 1.0;  // global-norm clipping; 0 = off
  double weight_decay = 0.1;
  Recompute recompute = Recompute::none;  // activation recomputation (Megatron's modes)
  // param, gradient and activation-comm dtypes (--precision, --reduce-dtype, --tp-comm-dtype)
  MixedPrecision precision;
  Device device = Device::cpu;  // where the model computes (--device)
  // --cuda-graphs: Context::run_graphed() captures and replays (a GPU run; the runner refuses
  // it where the plan puts communication between the unit passes of every micro-batch, or tp > 1).
  bool cuda_graphs = false;
  // Micro-batches per rank per step (gradient accumulation) on this mesh.
  int micro_steps(const MeshSpec& m) const {
    return int(global_batch / (std::int64_t(micro_batch) * m.dp));
  }
};

// bubble: time a pipeline stage sits idle waiting for its neighbours (blocked in the receive of an
// activation or gradient, or in the completion of its own send before reusing a buffer).
enum class Phase { forward, backward, optimizer, bubble };
inline constexpr std::array<const char*, 4> kPhaseNames = {"forward", "backward", "optimizer",
                                                           "bubble"};
inline const char* phase_name(Phase phase) { return kPhaseNames[static_cast<int>(phase)]; }

// A named range on an attached profiler's timeline: NVTX in CUDA builds, so Nsight Systems shows
// a run's phases, micro-batches and comm calls under the names its --trace timeline uses. Opened
// and closed on any thread; without a profiler (or in a CPU build) a call costs a branch.
std::uint64_t profiler_range_start(const char* name);
void profiler_range_end(std::uint64_t range);

class Context {
 public:
  virtual ~Context() = default;
  virtual const MeshSpec& mesh() const = 0;
  virtual const MeshCoord& coord() const = 0;
  virtual const ModelSpec& model_spec() const = 0;
  virtual const TrainSpec& train() const = 0;
  // The whole model at tp 1 (whole_model()) with one activation slot, kModelSlot, held for the
  // run: what forward_backward() drives for a data-parallel strategy, parameters and gradients
  // wherever the strategy keeps them (UnitPtrs). Built on first use, so a strategy that builds
  // its own StageModels does not pay for its activations.
  virtual StageModel& model() = 0;
  static constexpr int kModelSlot = 0;
  virtual MemoryLedger& memory() = 0;
  virtual Group& group(Axis axis) = 0;
  virtual CommStream& comm_stream(int index = 0) = 0;
  // An event at the compute stream's current position: work enqueued on a comm stream after it
  // (CommStream::enqueue(work, after), the collectives' `after`) starts once everything computed
  // so far is in memory. On the CPU compute runs on the calling thread, so it is already done; on
  // a GPU it is recorded on the compute stream and the comm stream waits for it on the device.
  virtual Event compute_event() = 0;
  // The run's backend for elementwise work on buffers (device.hpp): copy, cast, fill, scale,
  // axpy, sum of squares. Plugins use it instead of touching buffer memory themselves.
  virtual DeviceOps& ops() = 0;
  // This rank's micro-batch `micro` of step `step` (data parallel rank coord().dp); with
  // --mesh cp > 1 its share of each sequence: the two chunks cp_position gives cp rank coord().cp
  // (seq / cp tokens: MicroBatch::seq).
  virtual MicroBatch micro_batch(int step, int micro) = 0;
  virtual void add_phase_time(Phase phase, double seconds) = 0;
  // The same for a known interval [t0, t1) on strata::now()'s clock: it also appears on the
  // --trace timeline. PhaseTimer uses this.
  virtual void add_phase_interval(Phase phase, double t0, double t1) {
    add_phase_time(phase, t1 - t0);
  }
  // Sum of per-token losses over `tokens` tokens seen by this rank in this step. Ranks that do not
  // compute the loss (e.g. early pipeline stages) report nothing.
  virtual void report_loss(double loss_sum, double tokens) = 0;
  // Copies between the run's device and host memory (CPU offload: `host` is memory of
  // MemTag::offload, `device` of the run's device; same dtype and count). The core records each
  // in the comm ledger as a d2h or h2d call on the group "host", timed like a collective: called on
  // the compute thread it blocks it (all exposed), called in a comm stream's work
  // (comm_stream(k).enqueue) it overlaps what the compute thread does meanwhile. The defaults only
  // copy (a Context without a ledger, e.g. a test's).
  virtual void copy_to_host(BufferView host, BufferView device) { copy_across(host, device); }
  virtual void copy_to_device(BufferView device, BufferView host) { copy_across(device, host); }
  // A phase starts (PhaseTimer calls this; add_phase_interval ends it). On a GPU the core marks
  // the compute stream here and at the end, so the phase's time is the device's, from events,
  // without synchronising the stream inside the step.
  virtual void begin_phase(Phase phase) { (void)phase; }
  // Runs `passes`: work for the compute stream only (unit passes; no collective, no host
  // synchronisation, no PhaseTimer, no loss read-back inside). With --cuda-graphs the core runs
  // them as they are the first time it sees `identity` (allocations and cuBLASLt's plans happen
  // then), captures them into a CUDA graph the second time, and from then on replays that graph:
  // one launch instead of one per kernel, as PyTorch's make_graphed_callables after its warm-up.
  // `identity` lists every address the passes read or write that may differ between calls (and
  // any other value they bake in); the same identity replays the same graph. Without
  // --cuda-graphs (and on the CPU) this is passes().
  virtual void run_graphed(const std::vector<const void*>& identity,
                           const std::function<void()>& passes) {
    (void)identity;
    passes();
  }
};

// The identity of a run of `model`'s passes in `slot` for Context::run_graphed(): the model, the
// slot and the direction, the micro-batch's token addresses and every unit's parameter and
// gradient addresses (params[u], grads[u]).
std::vector<const void*> passes_identity(const StageModel& model, int slot, bool backward,
                                         const MicroBatch& mb, const UnitPtrs& params,
                                         const UnitPtrs& grads);

// Times a region into a phase of the current step record.
class PhaseTimer {
 public:
  PhaseTimer(Context& ctx, Phase phase)
      : ctx_(ctx), phase_(phase), range_(profiler_range_start(phase_name(phase))) {
    ctx_.begin_phase(phase_);
    t0_ = now();
  }
  ~PhaseTimer() {
    ctx_.add_phase_interval(phase_, t0_, now());
    profiler_range_end(range_);
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  Context& ctx_;
  Phase phase_;
  std::uint64_t range_;
  double t0_ = 0;
};

}  // namespace strata
STRATA_EXPORT_END
