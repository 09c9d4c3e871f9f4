// runner: run one strategy plugin on the standard GPT workload and write its run file.
//   runner --list-plugins | --list-transports | --describe NAME
//   runner --plugin ddp --nodes 2 --ranks-per-node 2 --model tiny --steps 30
// Started alone with more than one rank requested, it re-launches itself under mpirun or srun.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <new>
#include <optional>
#include <system_error>
#include <thread>

#include "comm/mpi_transport.hpp"
#include "comm/transport.hpp"
#if defined(STRATA_HAVE_CUDA_BACKEND) && !defined(STRATA_CUDA_LIBRARY)
#include "backends/cuda/attach.hpp"
#endif
#include "backends/backend.hpp"
#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"
#include "predict/advise_cli.hpp"
#include "predict/calibrate_machine.hpp"
#include "predict/predictor.hpp"
#include "provenance/provenance.hpp"
#include "results/run_claim.hpp"
#include "run/exit_codes.hpp"
#include "run/process_memory.hpp"
#include "run/trace_timeline.hpp"
#include "run/trainer.hpp"
#include "run/watchdog.hpp"
#include "runner/config.hpp"
#include "runner/launch.hpp"
#include "runner/memory_admission.hpp"
#include "runner/plugin_loader.hpp"
#include "util/format.hpp"

using namespace strata;

namespace {

// What a strategy composes with, from its descriptor: the choices of its `dp` option (what the
// data-parallel axis of a model-parallel mesh does) and of its `offload` option; "-" for none.
std::string composition(const StrategySpec& s) {
  std::string out;
  for (const OptionSpec& o : s.options) {
    if ((o.name != "dp" && o.name != "offload") || o.type != OptionType::choice) continue;
    std::string choices;
    for (const std::string& c : o.choices) choices += (choices.empty() ? "" : "|") + c;
    out += (out.empty() ? "" : " ") + o.name + "=" + choices;
  }
  return out.empty() ? "-" : out;
}

void list_plugins(const PluginRegistry& registry) {
  int width = 24;  // the COMPOSITION column fits its longest entry
  for (const LoadedPlugin& p : registry.plugins())
    for (const StrategySpec& s : p.descriptor->strategies)
      width = std::max(width, int(composition(s).size()));
  std::printf("%-14s %-10s %-*s %s\n", "STRATEGY", "FAMILY", width, "COMPOSITION", "SUMMARY");
  for (const LoadedPlugin& p : registry.plugins())
    for (const StrategySpec& s : p.descriptor->strategies)
      std::printf("%-14s %-10s %-*s %s\n", s.name.c_str(), p.descriptor->family.c_str(), width,
                  composition(s).c_str(), s.summary.c_str());
  for (const std::string& problem : registry.problems())
    std::fprintf(stderr, "note: skipped %s\n", problem.c_str());
}

std::string known_strategies(const PluginRegistry& registry) {
  std::string names;
  for (const std::string& n : registry.strategy_names()) names += (names.empty() ? "" : ", ") + n;
  return names.empty() ? "none found" : names;
}

std::string default_run_id(const RunConfig& c) {
  char suffix[8];
  std::snprintf(suffix, sizeof suffix, "%04x",
                unsigned((::getpid() * 2654435761u) ^ unsigned(std::time(nullptr))) & 0xffffu);
  return utc_timestamp(true) + "-" + c.plugin + "-" + std::to_string(c.mesh.nodes) + "x" +
         std::to_string(c.mesh.ranks_per_node) + "-" + suffix;
}

// Device<->host copies (CPU offload) are ledger ops like collectives; --dry-run lists them apart.
bool is_transfer_op(const std::string& op) {
  return op == op_name(CommOp::d2h) || op == op_name(CommOp::h2d);
}

void print_bytes_row(const char* name, double bytes, const std::string& suffix = "") {
  std::printf("  %-13s %14.0f bytes  %12s%s\n", name, bytes, human_bytes(bytes).c_str(),
              suffix.c_str());
}

// The largest rank's bytes per tag, device tags then host tags, each side with its total: host
// memory (offloaded optimizer state) is not in the device's total, nor in --memory-limit.
void print_memory_sides(const std::array<double, kNumMemTags>& peak, double device_total,
                        int device_rank, double host_total, int host_rank) {
  std::printf("predicted device memory per rank (largest rank per tag)\n");
  for (int t = 0; t < kNumMemTags; ++t)
    if (!is_host_tag(MemTag(t))) print_bytes_row(kMemTagNames[t], peak[t]);
  print_bytes_row("total", device_total, "  (rank " + std::to_string(device_rank) + ")");
  std::printf("predicted host memory per rank (largest rank per tag; not in the device total)\n");
  if (host_total == 0) std::printf("  none (no offload)\n");
  for (int t = 0; t < kNumMemTags; ++t)
    if (is_host_tag(MemTag(t)) && host_total > 0) print_bytes_row(kMemTagNames[t], peak[t]);
  if (host_total > 0)
    print_bytes_row("total", host_total, "  (rank " + std::to_string(host_rank) + ")");
}

// Bytes per step of the largest rank per op: collectives, then the device<->host transfers.
void print_comm_and_transfers(const std::map<std::string, double>& comm) {
  for (const bool transfers : {false, true}) {
    std::printf(transfers ? "predicted device<->host transfers per rank per step (offload copies; "
                            "ledger ops d2h, h2d)\n"
                          : "predicted comm per rank per step (nccl-tests sizes)\n");
    int rows = 0;
    for (const auto& [op, b] : comm)
      if (is_transfer_op(op) == transfers) print_bytes_row(op.c_str(), b), ++rows;
    if (rows == 0) std::printf("  none\n");
  }
}

// The predictor's question for this run, with the threads a rank will have when its node's ranks
// share one mask.
StepQuery run_query(const RunConfig& c, const Strategy& strategy, int ranks_on_host = 0) {
  const int on_host = ranks_on_host > 0 ? ranks_on_host : c.mesh.ranks_per_node;
  return step_query(c.plugin, strategy, c.mesh, c.model, c.train, blas_threads_for(c, on_host),
                    on_host);
}

// --dry-run --profile: the predicted step time from the machine profile (predictor.hpp).
void print_step_time(const RunConfig& c, const Strategy& strategy) {
  const MachineProfile profile = read_profile(c.profile);
  const StepTime t = predict_step_time(profile, run_query(c, strategy));
  std::printf("predicted time per step (profile %s, %s)\n", c.profile.c_str(),
              profile.source.c_str());
  if (!t.modelled) {
    std::printf("  %s\n", t.why.c_str());
    return;
  }
  std::printf("  %-13s %14.3f ms\n", "step", t.step_s * 1e3);
  std::printf("  %-13s %14.3f ms\n", "compute", t.compute_s * 1e3);
  std::printf("  %-13s %14.3f ms\n", "comm", t.comm_s * 1e3);
  std::printf("  %-13s %14.3f ms\n", "exposed comm", t.exposed_comm_s * 1e3);
  std::printf("  %-13s %14.3f ms\n", "bubble", t.bubble_s * 1e3);
  std::printf("  %-13s %14.0f tokens/s\n", "throughput", t.tokens_per_s);
  if (t.mfu >= 0)
    std::printf("  %-13s %14.1f %%\n", "MFU", 100 * t.mfu);
  else
    std::printf("  %-13s %14s\n", "MFU", "unknown (the profile has no node peak)");
  if (!t.notes.empty()) std::printf("  assumptions: %s\n", t.notes.c_str());
}

// --dry-run: the strategy's predictions for every rank of the mesh, without starting any rank.
// Returns the exit code: 0, or 4 when --memory-limit is given and the largest rank does not fit.
int dry_run(const RunConfig& c, const Strategy& strategy) {
  const int world = c.mesh.world();
  std::array<double, kNumMemTags> peak{};
  std::map<std::string, double> comm;
  double worst_total = 0, worst_host = 0;
  int worst_rank = 0, worst_host_rank = 0;
  std::string notes;
  double bubble = -1;
  for (int r = 0; r < world; ++r) {
    const PredictInput in{c.mesh, c.model, c.train, r};
    const Prediction p = predict(strategy, in);
    const auto bytes = plan_comm_bytes(strategy.plan_step(in), c.model, c.train, c.mesh.tp);
    double total = 0, host = 0;
    for (int t = 0; t < kNumMemTags; ++t) {
      peak[t] = std::max(peak[t], p.memory_bytes[t]);
      (is_host_tag(MemTag(t)) ? host : total) += p.memory_bytes[t];
    }
    if (total > worst_total) worst_total = total, worst_rank = r;
    if (host > worst_host) worst_host = host, worst_host_rank = r;
    for (int op = 0; op < kNumCommOps; ++op)
      if (bytes[op] > 0) comm[op_name(CommOp(op))] = std::max(comm[op_name(CommOp(op))], bytes[op]);
    if (r == 0) notes = p.notes, bubble = p.bubble_fraction;
  }
  std::printf(
      "dry run: %s on %d rank(s) (%d node(s) x %d), mesh %s, model %s "
      "(%s), micro-batch %d, global batch %d (%d micro-step(s))\n",
      c.plugin.c_str(), world, c.mesh.nodes, c.mesh.ranks_per_node, mesh_text(c.mesh).c_str(),
      c.model.preset.c_str(), params_text(c.model).c_str(), c.train.micro_batch,
      c.train.global_batch, c.train.micro_steps(c.mesh));
  print_memory_sides(peak, worst_total, worst_rank, worst_host, worst_host_rank);
  print_comm_and_transfers(comm);
  if (bubble >= 0) std::printf("predicted pipeline bubble: %.1f%% of a step\n", 100 * bubble);
  if (!notes.empty()) std::printf("notes: %s\n", notes.c_str());
  if (!c.profile.empty()) print_step_time(c, strategy);
  if (c.memory_limit > 0) {
    bool fits = worst_total <= c.memory_limit;
    std::printf("memory limit %s per rank (device memory): %s (largest rank needs %s)\n",
                human_bytes(c.memory_limit).c_str(), fits ? "fits" : "does NOT fit",
                human_bytes(worst_total).c_str());
    return fits ? exit_code::ok : exit_code::does_not_fit;
  }
  return 0;
}

// What comm a plan action is, for a message: the collective or copy, send, recv or a wait.
std::string action_text(const PlanAction& a) {
  if (a.op == PlanOp::comm || a.op == PlanOp::copy) return op_name(a.collective);
  if (a.op == PlanOp::send || a.op == PlanOp::recv) return a.op == PlanOp::send ? "send" : "recv";
  return "a wait";
}

// --cuda-graphs captures runs of unit passes with nothing between them; the rest of a step (ddp's
// last backward with its bucket all-reduces, a pipeline's sends) runs as it is. Refused before any
// work where no such run exists: communication inside the passes (tp > 1), or between the unit
// passes of every micro-batch (its plan's per-micro-batch actions: zero2, zero3, fsdp), on each
// pipeline stage's plan (rank 0's pp group, as the predictor asks for them).
void check_cuda_graphs(const RunConfig& c, const Strategy& strategy) {
  if (!c.train.cuda_graphs) return;
  std::string why;
  if (c.mesh.tp > 1) why = "tensor parallelism has collectives inside the passes";
  for (int rank : Mesh(c.mesh).group(Axis::pp, 0)) {
    if (!why.empty()) break;
    const StepPlan plan = strategy.plan_step(PredictInput{c.mesh, c.model, c.train, rank});
    if (plan.empty())
      why = "it has no step plan to tell" +
            (plan.unmodelled.empty() ? std::string() : " (" + plan.unmodelled + ")");
    const PlanAction* first = nullptr;  // its first comm, else its first wait
    for (const PlanAction& a : plan.micro_batch)
      if (a.op != PlanOp::forward && a.op != PlanOp::backward && a.op != PlanOp::weight &&
          (!first || (first->op == PlanOp::wait && a.op != PlanOp::wait)))
        first = &a;
    if (first) why = "every micro-batch has " + action_text(*first) + " between its unit passes";
  }
  if (!why.empty())
    throw ConfigError("--cuda-graphs: " + c.plugin + " cannot be captured: " + why +
                      "; graphs replay unit passes with no communication between them (dp, ddp, "
                      "zero1, allreduce, the pipelines with dp=allreduce|zero1)");
}

// Everything that can be checked before any rank starts. Returns false when the action is done.
// The requests answered with a print and no run (--help, --version, --list-transports,
// --list-plugins, --describe); scans the plugin directories on the way. True when one was.
bool answered_request(const RunConfig& config, const LaunchEnv& env, PluginRegistry& registry) {
  if (config.help) {
    if (env.rank == 0) std::printf("%s", config.help_text.c_str());
    return true;
  }
  if (config.version) {
    if (env.rank == 0) std::printf("runner: %s\n", version_line().c_str());
    return true;
  }
  if (config.list_transports) {  // "name<TAB>library version", one per line
    for (const std::string& t : transports_built())
      std::printf("%s\t%s\n", t.c_str(),
                  t == "mpi" ? mpi::library_version().c_str() : transport_version(t).c_str());
    return true;
  }
  std::vector<std::string> dirs{default_plugin_dir()};
  dirs.insert(dirs.end(), config.plugin_paths.begin(), config.plugin_paths.end());
  registry.scan(dirs);
  if (config.list_plugins) {
    list_plugins(registry);
    return true;
  }
  if (!config.describe.empty()) {
    const StrategySpec* spec = nullptr;
    const LoadedPlugin* p = registry.find(config.describe, &spec);
    if (!p)
      throw ConfigError("--describe " + config.describe +
                        ": no such strategy (found: " + known_strategies(registry) + ")");
    std::printf("%s", describe(*p, *spec).c_str());
    return true;
  }
  return false;
}

// Before any rank starts: a GPU for every rank of this node (with --device cuda), the run's id,
// and an --out directory rank 0 can write.
void check_where_it_runs(RunConfig& config, const LaunchEnv& env) {
  if (config.device_kind() != Device::cpu) {
    // Relaunched here, the ranks see the GPUs this process sees; under srun or mpirun each may
    // see only its own (--gpus-per-task): there the run checks once the ranks exist.
    const int local = env.under_launcher ? 1 : config.mesh.ranks_per_node;
    const std::string why = backend_unavailable(
        config.device_kind(), BackendRequest{0, local, config.attention_kernel()});
    if (!why.empty()) throw ConfigError("--device " + config.device + ": " + why);
  }
  if (config.run_id.empty()) config.run_id = default_run_id(config);
  if (env.rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(config.out_dir, ec);
    if (ec || ::access(config.out_dir.c_str(), W_OK) != 0)
      throw ConfigError("--out " + config.out_dir + ": cannot create or write the directory");
    const std::string json = trace_json_path(run_file_path(config));
    if (config.trace && std::filesystem::is_directory(json, ec))
      throw ConfigError("--trace: " + json + " is a directory (the timeline is written there)");
  }
}

// Memory admission (memory_admission.hpp) before any rank starts or allocates: false, with the
// refusal printed, when the ranks of this host would not fit. Under a launcher every rank checks
// its host (which ranks share it is known only once MPI runs), so each refusing rank says so.
bool admitted(const RunConfig& config, const Strategy& strategy, const LaunchEnv& env, int world) {
  const int here = env.under_launcher ? std::max(env.local_size, 1) : world;
  HostMemory host = host_memory();
  // OpenBLAS's threads from its load (cpu::blas_threads() before set_blas_threads) or the rank's.
  host.runtime_address_space =
      runtime_address_space(std::max(blas_threads_for(config, here), cpu::blas_threads()));
  host.device_free = device_free_memory(config.device_kind(), BackendRequest{0, here});
  const std::string refusal = memory_admission(config, strategy, here, host);
  if (refusal.empty()) return true;
  if (env.under_launcher)
    std::fprintf(stderr, "runner: error: rank %d: %s\n", env.rank, refusal.c_str());
  else
    std::fprintf(stderr, "runner: error: %s\n", refusal.c_str());
  return false;
}

bool prepare(int argc, char** argv, const LaunchEnv& env, RunConfig& config,
             PluginRegistry& registry, int& code) {
  config = parse_cli(argc, argv);
  if (answered_request(config, env, registry)) return false;
  // A library in a named directory that did not load is worth a line in a run too.
  if (env.rank == 0)
    for (const std::string& problem : registry.problems())
      std::fprintf(stderr, "runner: note: skipped %s\n", one_line(problem).c_str());
  if (config.advise) {  // predictions only: no ranks
    if (env.rank == 0) code = advise_from_config(config, registry);
    return false;
  }
  if (config.calibrate && !config.calibrate_from.empty()) {  // no measurement: no ranks
    if (env.rank == 0)
      calibrate_from_runs(config, [&](const std::string& name, const std::vector<std::string>& kv) {
        const StrategySpec* spec = nullptr;
        if (!registry.find(name, &spec))
          throw ConfigError("--calibrate-from: a run of strategy " + name +
                            ", which is not installed here (found: " + known_strategies(registry) +
                            ")");
        return registry.create(name, validate_options(*spec, kv));
      });
    return false;
  }
  if (config.plugin.empty() && config.calibrate) config.plugin = "ddp";  // options only
  if (config.plugin.empty())
    throw ConfigError("--plugin: required, one of: " + known_strategies(registry));
  const StrategySpec* spec = nullptr;
  if (!registry.find(config.plugin, &spec))
    throw ConfigError("--plugin " + config.plugin +
                      ": no such strategy (found: " + known_strategies(registry) + ")");
  Options options = validate_options(*spec, config.plugin_opts);

  int world = 1;
  if (env.under_launcher)
    world = env.world;
  else if (config.nodes_given || config.ranks_per_node_given)
    world = config.mesh.nodes * config.mesh.ranks_per_node;
  else if (config.mesh_given)
    world = config.mesh.world();
  resolve_mesh(config, world, env.under_launcher ? env.local_size : world);
  std::shared_ptr<Strategy> strategy = registry.create(config.plugin, options);
  // --calibrate measures any mesh (a pipeline's or tp's groups too): no strategy runs on it.
  if (!config.calibrate)
    validate_strategy(config.plugin, *strategy, config.mesh, config.train, config.model);
  check_cuda_graphs(config, *strategy);
  if (config.dry_run) {
    code = dry_run(config, *strategy);
    return false;
  }
  if (!config.profile.empty() && !config.calibrate) {  // predicted beside measured (/summary)
    const StepTime t = predict_step_time(read_profile(config.profile),
                                         run_query(config, *strategy, env.local_size));
    config.predicted_step_s = t.modelled ? t.step_s : 0;
    config.predicted_bubble_s = t.modelled ? t.bubble_s : 0;
    if (!t.modelled && env.rank == 0)
      std::fprintf(stderr, "runner: note: --profile: %s\n", t.why.c_str());
  }
  check_where_it_runs(config, env);
  if (!env.under_launcher && world > 1) check_local_world(config, world);
  if (!config.calibrate && !config.skip_memory_check && !admitted(config, *strategy, env, world)) {
    code = exit_code::does_not_fit;
    return false;
  }
  // The last check, once nothing else refuses the run: one run per run file (run_claim.hpp).
  if (env.rank == 0 && !config.calibrate)
    claim_run_file(run_file_path(config), config.run_id, config.overwrite);
  if (!env.under_launcher && world > 1) {
    try {
      code = relaunch(config, world, argc, argv);
    } catch (...) {
      release_run_file_claim(run_file_path(config));
      throw;
    }
    return false;
  }
  return true;
}

// An allocation refused: memory (std::bad_alloc), or a thread that could not start for want of
// memory or of processes (std::system_error from std::thread: EAGAIN or ENOMEM).
bool out_of_resources(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  const auto* se = dynamic_cast<const std::system_error*>(&e);
  return se && (se->code() == std::errc::resource_unavailable_try_again ||
                se->code() == std::errc::not_enough_memory);
}

// A failure on this rank ends the job: rank 0 writes the run file; another rank tells rank 0, which
// writes it and ends the job (or, should rank 0 not act, this rank ends it after a while).
[[noreturn]] void end_after_failure(const std::exception& e, RunState& state) {
  const int rank = mpi::world_rank();
  const std::string status = out_of_resources(e) ? "oom" : "failed";
  std::string message = "rank " + std::to_string(rank) + ": " + one_line(e.what());
  if (dynamic_cast<const std::system_error*>(&e) && status == "oom")
    message +=
        " (a thread or its memory was refused: the address-space limit, ulimit -v, or the "
        "process limit, ulimit -u)";
  if (auto* se = dynamic_cast<const Error*>(&e); se && !se->hint().empty())
    message += " (hint: " + se->hint() + ")";
  std::fprintf(stderr, "runner: error: %s\n", message.c_str());
  int code = exit_code::for_status(status);
  if (rank == 0) {
    code = write_failure(state, status, message, code);
  } else {
    mpi::send_error_to_root(status + "|" + message);
    std::this_thread::sleep_for(std::chrono::seconds(10));  // rank 0 writes, then ends the job
  }
  mpi::abort_job(code);
}

// Where this rank's BLAS thread count came from (blas_threads_for), for /provenance.
std::string g_blas_threads_origin;
Provenance blas_threads_provenance() { return {{"blas_threads_origin", g_blas_threads_origin}}; }

// After MPI starts: the ranks of this host that share this rank's affinity mask split its CPUs.
void set_threads_per_rank(const RunConfig& config) {
  const int sharing = mpi::node_ranks_with(affinity_fingerprint());
  cpu::set_blas_threads(blas_threads_for(config, sharing, &g_blas_threads_origin));
  register_provenance_provider(blas_threads_provenance);
}

// The exit of a process that started no rank. Under an address-space limit (ulimit -v) OpenBLAS's
// threads, started when it loaded, may spin in blas_memory_alloc for a buffer they cannot map,
// and exit() would join them for ever: such a process leaves without its exit handlers.
int leave(int code) {
  if (current_address_space_limit() > 0) {
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  configure_allocator();  // process_memory.hpp: before any thread starts
  // Before the options: --device's and --transport's choices come from the registries.
#ifdef STRATA_CUDA_LIBRARY
  // The CUDA backend, the NCCL transport and their provenance (versions, GPU names, NVML's links),
  // loaded by the first run on --device cuda: a CPU run does not pay cuBLAS's 0.4 s start-up.
  declare_backend_library(Device::cuda, path_from_prefix(STRATA_CUDA_LIBRARY), {"nccl"});
#elif defined(STRATA_HAVE_CUDA_BACKEND)
  strata_attach_backend();  // runner_emu: the emulated backend and NCCL stand-in, linked in
#endif
  const LaunchEnv env = detect_launch_env();
  RunConfig config;
  PluginRegistry registry;
  try {
    int code = 0;
    if (!prepare(argc, argv, env, config, registry, code)) return leave(code);
  } catch (const ConfigError& e) {
    if (env.rank == 0) std::fprintf(stderr, "runner: error: %s\n", one_line(e.what()).c_str());
    return leave(exit_code::bad_input);
  } catch (const Error& e) {
    if (env.rank == 0)
      std::fprintf(stderr, "runner: error: %s%s%s\n", e.what(), e.hint().empty() ? "" : " (hint: ",
                   e.hint().empty() ? "" : (e.hint() + ")").c_str());
    return leave(exit_code::error);
  }

  // A first count before MPI starts its own threads (as if every rank of the host shared this
  // mask), made exact once the ranks sharing it are known.
  cpu::set_blas_threads(blas_threads_for(config, env.local_size > 0 ? env.local_size : env.world));
  // bf16: GEMMs on oneDNN's threads, or on OpenBLAS's where they run widened (gemm_bf16.hpp).
  cpu::set_one_thread_pool(config.train.precision.mixed() && !cpu::bf16_gemm_widened());
  try {
    mpi::init(&argc, &argv, !env.under_launcher);
  } catch (const Error& e) {
    std::fprintf(stderr, "runner: error: %s (hint: %s)\n", e.what(), e.hint().c_str());
    return exit_code::error;
  }
  set_threads_per_rank(config);
  if (config.calibrate) {
    try {
      calibrate_machine(config, cpu::blas_threads());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "runner: error: rank %d: --calibrate: %s\n", mpi::world_rank(),
                   one_line(e.what()).c_str());
      mpi::abort_job(exit_code::failed);
    }
    mpi::control_barrier();
    mpi::finalize();
    return 0;
  }
  install_signal_handlers();
  RunState state;
  int code = 0;
  {
    std::optional<Watchdog> watchdog;  // its thread may not start (ulimit -v, -u): a run file
    try {
      begin_record(config, state);
      watchdog.emplace(config.watchdog_s, state);
      gather_record_hosts(state);
      train(config, registry, state, *watchdog);
    } catch (const std::exception& e) {
      end_after_failure(e, state);
    }
    mpi::control_barrier();
  }
  close_backends();  // the GPU's streams and pool, before MPI (and NCCL's bootstrap) goes
  mpi::finalize();
  return code;
}
