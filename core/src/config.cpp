#include "config.hpp"

#include <boost/program_options.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "comm/transport.hpp"
#include "strata/types.hpp"

namespace po = boost::program_options;

namespace strata {

// "mpi, ucx": the transports of this build, for help and errors.
static std::string built_transports() {
  std::string built;
  for (const auto& t : transports_built()) built += (built.empty() ? "" : ", ") + t;
  return built;
}

static std::string transport_help() {
  return "communication backend of the mesh groups: " + built_transports() + " (in this build)";
}

static void parse_mesh(const std::string& text, MeshSpec& mesh) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto eq = item.find('=');
    int value = 0;
    try {
      value = eq == std::string::npos ? 0 : std::stoi(item.substr(eq + 1));
    } catch (...) {
    }
    std::string key = item.substr(0, eq);
    if (value < 1 || (key != "dp" && key != "tp" && key != "pp"))
      throw ConfigError("--mesh " + text +
                        ": expected a comma list of dp=N, tp=N, pp=N with N >= 1");
    (key == "dp" ? mesh.dp : key == "tp" ? mesh.tp : mesh.pp) = value;
  }
}

double parse_bytes(const std::string& option, const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  std::string unit = text.substr(used);
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"B", 1},
                                                  {"KiB", 1024.0},
                                                  {"MiB", 1048576.0},
                                                  {"GiB", 1073741824.0},
                                                  {"TiB", 1099511627776.0},
                                                  {"KB", 1e3},
                                                  {"MB", 1e6},
                                                  {"GB", 1e9},
                                                  {"TB", 1e12}};
  for (const auto& [name, scale] : units)
    if (used > 0 && unit == name && value > 0) return value * scale;
  throw ConfigError(option + " " + text + ": expected a size such as 80GiB, 512MiB or 1e9");
}

RunConfig parse_cli(int argc, char** argv) {
  RunConfig c;
  std::string model_preset, mesh_text, config_file, memory_limit, recompute;
  int layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
  int global_batch = 0;
  long long seed = 1234;

  // clang-format off
  po::options_description what("What to run");
  what.add_options()
      ("plugin", po::value(&c.plugin), "strategy to run (see --list-plugins)")
      ("plugin-opt", po::value(&c.plugin_opts)->composing(), "KEY=VALUE strategy option (repeatable)")
      ("plugin-path", po::value(&c.plugin_paths)->composing(), "extra directory with plugins (repeatable)")
      ("list-plugins", po::bool_switch(&c.list_plugins), "list the strategies found and exit")
      ("list-transports", po::bool_switch(&c.list_transports), "list the transports of this build (one per line) and exit")
      ("describe", po::value(&c.describe), "describe a strategy and its options and exit")
      ("dry-run", po::bool_switch(&c.dry_run), "print the predicted memory and comm per step and exit")
      ("memory-limit", po::value(&memory_limit), "with --dry-run: bytes per rank to fit in (e.g. 80GiB, 512MiB)")
      ("transport", po::value(&c.transport)->default_value("mpi"), transport_help().c_str())
      ("device", po::value(&c.device)->default_value("cpu"), "compute backend: cpu")
      ("config", po::value(&config_file), "INI file of options (same names as the CLI)")
      ("help,h", po::bool_switch(&c.help), "this help");
  po::options_description model("Model");
  model.add_options()
      ("model", po::value(&model_preset)->default_value("tiny"), "preset: tiny, small, gpt2-124m")
      ("layers", po::value(&layers), "transformer blocks (overrides the preset)")
      ("hidden", po::value(&hidden), "hidden size")
      ("heads", po::value(&heads), "attention heads (must divide hidden)")
      ("seq", po::value(&seq), "sequence length")
      ("vocab", po::value(&vocab), "vocabulary size");
  po::options_description train("Training");
  train.add_options()
      ("micro-batch", po::value(&c.train.micro_batch)->default_value(8), "sequences per micro-batch per rank")
      ("global-batch", po::value(&global_batch), "sequences per step over all ranks (default micro-batch x dp); more means gradient accumulation")
      ("steps", po::value(&c.train.steps)->default_value(20), "optimizer steps")
      ("warmup", po::value(&c.train.warmup)->default_value(2), "first steps left out of the summary statistics")
      ("seed", po::value(&seed)->default_value(1234), "seed of initialisation and synthetic data")
      ("lr", po::value(&c.train.lr), "AdamW learning rate, constant (default by preset: tiny 3e-3, small 1e-3, gpt2-124m 6e-4)")
      ("weight-decay", po::value(&c.train.weight_decay)->default_value(0.1), "AdamW weight decay on 2-D weights")
      ("grad-clip", po::value(&c.train.grad_clip)->default_value(1.0), "global gradient-norm clip (0 = off)")
      ("recompute", po::value(&recompute)->default_value("none"), "activation recomputation: none, full (keep block inputs), selective (attention core)")
      ("data", po::value(&c.data_file), "flat binary file of uint16 tokens (default: synthetic data)");
  po::options_description mesh("Mesh and launch");
  mesh.add_options()
      ("nodes", po::value(&c.mesh.nodes), "nodes (virtual nodes on one machine)")
      ("ranks-per-node", po::value(&c.mesh.ranks_per_node), "ranks per node")
      ("mesh", po::value(&mesh_text), "dp=D,tp=T,pp=P (default dp = world)")
      ("blas-threads", po::value(&c.blas_threads)->default_value(0), "BLAS threads per rank (0 = cores / ranks on the host)");
  po::options_description out("Results");
  out.add_options()
      ("out", po::value(&c.out_dir)->default_value("results/local"), "directory for the run file")
      ("run-id", po::value(&c.run_id), "name of the run file (default: time, strategy, mesh)")
      ("peak-tflops", po::value(&c.peak_tflops)->default_value(0), "peak TFLOP/s per rank for MFU (0 = measure the best SGEMM rate at start-up)")
      ("watchdog", po::value(&c.watchdog_s)->default_value(300), "seconds a collective may take before the job is ended")
      ("quiet", po::bool_switch(&c.quiet), "no per-step lines")
      ("trace", po::bool_switch(&c.trace),
       "record every compute and comm interval of every rank: /trace in the run file and "
       "<run-id>.trace.json (Chrome/Perfetto timeline)")
      ("calibrate-comm", po::bool_switch(&c.calibrate_comm),
       "before the timed steps, measure busbw of all_reduce, reduce_scatter and all_gather at "
       "64 KiB, 1 MiB and 16 MiB on every mesh group of the run's transport: /calibration");
  po::options_description all("runner: run one strategy on the standard GPT workload");
  // clang-format on
  all.add(what).add(model).add(train).add(mesh).add(out);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).run(), vm);
    if (vm.count("config")) {
      config_file = vm["config"].as<std::string>();
      std::ifstream f(config_file);
      if (!f) throw ConfigError("--config " + config_file + ": cannot open the file");
      po::store(po::parse_config_file(f, all), vm);
    }
    // STRATA_STEPS=10 means --steps 10, and so on, for every long option (lowest precedence).
    po::store(po::parse_environment(all,
                                    [&](const std::string& env) -> std::string {
                                      if (env.rfind("STRATA_", 0) != 0) return "";
                                      std::string name = env.substr(7);
                                      for (char& ch : name)
                                        ch = ch == '_' ? '-' : char(std::tolower(ch));
                                      return all.find_nothrow(name, false) ? name : "";
                                    }),
              vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + " (see runner --help)");
  }
  std::ostringstream help;
  help << all;
  c.help_text = help.str();
  for (int i = 0; i < argc; ++i) c.command_line += (i ? " " : "") + std::string(argv[i]);

  if (!parse_recompute(recompute, &c.train.recompute))
    throw ConfigError("--recompute " + recompute + ": must be one of none, full, selective");
  if (!memory_limit.empty()) c.memory_limit = parse_bytes("--memory-limit", memory_limit);
  c.nodes_given = vm.count("nodes") > 0;
  c.ranks_per_node_given = vm.count("ranks-per-node") > 0;
  c.mesh_given = !mesh_text.empty();
  if (c.mesh_given) parse_mesh(mesh_text, c.mesh);
  c.train.seed = std::uint64_t(seed);

  if (!is_model_preset(model_preset))
    throw ConfigError("--model " + model_preset + ": must be one of tiny, small, gpt2-124m");
  c.model = strata::model_preset(model_preset);
  if (layers) c.model.layers = layers, c.model.preset = "custom";
  if (hidden) c.model.hidden = hidden, c.model.preset = "custom";
  if (heads) c.model.heads = heads, c.model.preset = "custom";
  if (seq) c.model.seq = seq, c.model.preset = "custom";
  if (vocab) c.model.vocab = vocab, c.model.preset = "custom";
  if (!vm.count("lr"))
    c.train.lr = model_preset == "tiny" ? 3e-3 : model_preset == "small" ? 1e-3 : 6e-4;
  if (global_batch)
    c.train.global_batch = global_batch;
  else
    c.train.global_batch = 0;  // resolved with the mesh

  auto positive = [](const char* opt, long long v) {
    if (v < 1)
      throw ConfigError(std::string("--") + opt + " " + std::to_string(v) + ": must be >= 1");
  };
  positive("layers", c.model.layers);
  positive("hidden", c.model.hidden);
  positive("heads", c.model.heads);
  positive("seq", c.model.seq);
  if (c.model.vocab < 2 || c.model.vocab > 65536)
    throw ConfigError("--vocab " + std::to_string(c.model.vocab) +
                      ": must be in 2..65536 (tokens are uint16)");
  if (c.model.hidden % c.model.heads != 0)
    throw ConfigError("--heads " + std::to_string(c.model.heads) + ": must divide --hidden " +
                      std::to_string(c.model.hidden));
  positive("steps", c.train.steps);
  positive("micro-batch", c.train.micro_batch);
  if (c.nodes_given) positive("nodes", c.mesh.nodes);
  if (c.ranks_per_node_given) positive("ranks-per-node", c.mesh.ranks_per_node);
  if (c.train.warmup < 0) throw ConfigError("--warmup: must be >= 0");
  if (c.train.lr <= 0) throw ConfigError("--lr: must be > 0");
  if (c.train.grad_clip < 0) throw ConfigError("--grad-clip: must be >= 0 (0 = off)");
  if (c.watchdog_s <= 0) throw ConfigError("--watchdog: must be > 0 seconds");
  if (c.peak_tflops < 0) throw ConfigError("--peak-tflops: must be >= 0 (0 = measure)");
  if (c.blas_threads < 0) throw ConfigError("--blas-threads: must be >= 0 (0 = auto)");
  if (!transport_built(c.transport))
    throw ConfigError("--transport " + c.transport + ": must be one of " + built_transports() +
                      " (the transports in this build)");
  if (c.device != "cpu")
    throw ConfigError("--device " + c.device + ": must be cpu (the only device in this build)");
  if (!c.data_file.empty() && !std::ifstream(c.data_file))
    throw ConfigError("--data " + c.data_file + ": cannot open the file");
  return c;
}

void resolve_mesh(RunConfig& c, int world, int ranks_per_host) {
  MeshSpec& m = c.mesh;
  if (c.nodes_given && c.ranks_per_node_given) {
    if (m.nodes * m.ranks_per_node != world)
      throw ConfigError("--nodes " + std::to_string(m.nodes) + " x --ranks-per-node " +
                        std::to_string(m.ranks_per_node) + " = " +
                        std::to_string(m.nodes * m.ranks_per_node) +
                        " ranks, but the launcher started " + std::to_string(world));
  } else if (c.nodes_given) {
    if (world % m.nodes != 0)
      throw ConfigError("--nodes " + std::to_string(m.nodes) + ": must divide the world size " +
                        std::to_string(world));
    m.ranks_per_node = world / m.nodes;
  } else if (c.ranks_per_node_given) {
    if (world % m.ranks_per_node != 0)
      throw ConfigError("--ranks-per-node " + std::to_string(m.ranks_per_node) +
                        ": must divide the world size " + std::to_string(world));
    m.nodes = world / m.ranks_per_node;
  } else {
    m.ranks_per_node = (ranks_per_host > 0 && world % ranks_per_host == 0) ? ranks_per_host : world;
    m.nodes = world / m.ranks_per_node;
  }
  if (!c.mesh_given) m.dp = world / (m.tp * m.pp);
  if (m.dp * m.tp * m.pp != world)
    throw ConfigError("--mesh dp=" + std::to_string(m.dp) + ",tp=" + std::to_string(m.tp) +
                      ",pp=" + std::to_string(m.pp) + " covers " + std::to_string(m.world()) +
                      " ranks, but the world has " + std::to_string(world) +
                      ": dp x tp x pp must equal the world size");
  TrainSpec& t = c.train;
  if (t.global_batch == 0) t.global_batch = t.micro_batch * m.dp;
  if (t.global_batch % (t.micro_batch * m.dp) != 0)
    throw ConfigError(
        "--global-batch " + std::to_string(t.global_batch) +
        ": must be a multiple of --micro-batch x dp = " + std::to_string(t.micro_batch * m.dp));
  if (t.warmup >= t.steps) t.warmup = t.steps > 1 ? 1 : 0;
}

std::vector<std::pair<std::string, std::string>> RunConfig::resolved() const {
  std::vector<std::pair<std::string, std::string>> r;
  auto add = [&](const std::string& k, const auto& v) {
    std::ostringstream s;
    s << v;
    r.emplace_back(k, s.str());
  };
  std::string opts;
  for (const auto& o : plugin_opts) opts += (opts.empty() ? "" : ",") + o;
  add("plugin", plugin);
  add("plugin_opts", opts);
  add("transport", transport);
  add("device", device);
  add("model", model.preset);
  add("layers", model.layers);
  add("hidden", model.hidden);
  add("heads", model.heads);
  add("seq", model.seq);
  add("vocab", model.vocab);
  add("params", model.total_params());
  add("micro_batch", train.micro_batch);
  add("global_batch", train.global_batch);
  add("micro_steps", train.global_batch ? train.micro_steps(mesh) : 0);
  add("steps", train.steps);
  add("warmup", train.warmup);
  add("seed", train.seed);
  add("lr", train.lr);
  add("weight_decay", train.weight_decay);
  add("grad_clip", train.grad_clip);
  add("recompute", recompute_name(train.recompute));
  add("data", data_file.empty() ? "synthetic" : data_file);
  add("nodes", mesh.nodes);
  add("ranks_per_node", mesh.ranks_per_node);
  add("world", mesh.world());
  add("dp", mesh.dp);
  add("tp", mesh.tp);
  add("pp", mesh.pp);
  add("blas_threads", blas_threads);
  add("watchdog_s", watchdog_s);
  add("peak_tflops", peak_tflops);
  add("trace", trace ? "true" : "false");
  add("calibrate_comm", calibrate_comm ? "true" : "false");
  add("out", out_dir);
  return r;
}

}  // namespace strata
