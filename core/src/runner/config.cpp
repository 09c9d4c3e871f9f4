#include "runner/config.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <type_traits>

#include "comm/transport.hpp"
#ifdef STRATA_HAVE_GLOO
#include "comm/gloo_transport.hpp"
#endif
#include "backends/cpu/gemm_bf16.hpp"
#include "run/data.hpp"
#include "runner/config_table.hpp"
#include "strata/types.hpp"

extern char** environ;
namespace po = boost::program_options;

namespace strata {
namespace {

using options::check_value;
using options::find_row;
using options::is_file_name;
using options::join;
using options::kNameAccepts;
using options::OptionValue;
using options::readable_file_rule;
using options::Row;
using options::rows;

// Where a value came from, for messages: "--steps abc", "STRATA_STEPS=abc", "--config f: steps =
// abc".
enum class Source { cli, file, env };
struct Given {
  const Row* row;
  std::string value;
  Source source;
  std::string where;
};

std::string quoted_cli(const std::string& name, const std::string& value, bool flag) {
  if (flag && value.empty()) return "--" + name;
  return "--" + name + " " + (value.empty() ? "''" : value);
}

po::options_description make_description(bool with_help_text) {
  po::options_description all("runner: run one strategy on the standard GPT workload");
  std::map<std::string, po::options_description> sections;
  std::vector<std::string> order;
  for (const Row& r : rows()) {
    const RunnerOption& o = r.option;
    if (!sections.count(o.section)) {
      sections.emplace(o.section, po::options_description(o.section));
      order.push_back(o.section);
    }
    const std::string names = o.name == "help" ? "help,h" : o.name;
    std::string help = with_help_text ? o.help : "";
    if (with_help_text && o.kind != OptionKind::flag) help += " [" + o.accepts() + "]";
    po::value_semantic* semantic = nullptr;
    if (o.kind == OptionKind::flag) {
      semantic = po::value<std::string>()->zero_tokens()->implicit_value("true");
    } else if (o.repeatable) {
      semantic = po::value<std::vector<std::string>>()->composing();
    } else {
      auto* s = po::value<std::string>();
      if (with_help_text && !o.default_value.empty()) s->default_value(o.default_value);
      semantic = s;
    }
    sections.at(o.section).add_options()(names.c_str(), semantic, help.c_str());
  }
  for (const auto& s : order) all.add(sections.at(s));
  return all;
}

// Boost 1.74's error_with_option_name::what() loops for ever when a substituted name holds one of
// its own placeholders ("%canonical_option%"): such a name is refused before Boost sees it.
void refuse_percent_in_name(const std::string& where, const std::string& name) {
  if (name.find('%') != std::string::npos)
    throw ConfigError(where + "'" + name.substr(0, 64) + "': no such option (see runner --help)");
}

// Boost's messages for an unknown option, or for a flag given a value, quote the whole word, value
// included: a '%' in the value loops there as in a name, so those words are refused here too.
void refuse_percent_in_word(const std::string& word) {
  const std::string name = word.substr(0, word.find('='));
  refuse_percent_in_name("", name);
  if (word.find('%') == std::string::npos) return;
  const std::size_t start = name.find_first_not_of('-');  // "-=%x": no name at all
  const Row* row = start == std::string::npos ? nullptr : find_row(name.substr(start));
  if (row == nullptr)
    throw ConfigError("'" + name.substr(0, 64) + "': no such option (see runner --help)");
  if (row->option.kind == OptionKind::flag && name.size() < word.size())
    throw ConfigError("'" + name + "': a flag takes no value (see runner --help)");
}

// Boost's message for a command line it refused. Its what() substitutes the words it quotes into
// its own "%name%" placeholders and loops when a word holds one, whatever the word ("-mesh=%x%"
// as much as a name): the message is taken from the same words with each '%' shown as '?'.
std::string boost_message(int argc, char** argv, const po::options_description& desc, int style) {
  std::vector<std::string> words(argv, argv + argc);
  for (std::string& w : words) std::replace(w.begin(), w.end(), '%', '?');
  std::vector<char*> shown;
  for (std::string& w : words) shown.push_back(w.data());
  try {
    po::command_line_parser(argc, shown.data()).options(desc).style(style).run();
  } catch (const po::error& e) {
    return e.what();
  }
  return "the command line cannot be parsed";
}

void collect_cli(int argc, char** argv, std::vector<Given>& given) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.rfind('-', 0) == 0) refuse_percent_in_word(word);
  }
  const po::options_description desc = make_description(false);
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  po::parsed_options parsed(&desc);
  try {
    parsed = po::command_line_parser(argc, argv).options(desc).style(style).run();
  } catch (const po::error&) {
    throw ConfigError(boost_message(argc, argv, desc, style) + " (see runner --help)");
  }
  for (const po::option& o : parsed.options) {
    if (o.position_key >= 0 || o.string_key.empty()) {
      const std::string word = o.original_tokens.empty() ? "" : o.original_tokens.front();
      throw ConfigError("stray word '" + word +
                        "': runner takes no positional arguments, only --options (see runner "
                        "--help)");
    }
    const Row* row = find_row(o.string_key);
    const bool is_flag = row->option.kind == OptionKind::flag;
    const std::string value = o.value.empty() ? (is_flag ? "true" : "") : o.value.front();
    given.push_back(
        {row, value, Source::cli, quoted_cli(o.string_key, o.value.empty() ? "" : value, is_flag)});
  }
}

// A config file's text, read once: at most 1 MiB (`--config /dev/zero` must not read for ever),
// no NUL byte (a binary file; it would also cut the messages that quote a line), a UTF-8 byte
// order mark at its start dropped as editors write it (CRLF line ends Boost already takes).
std::string config_text(const std::string& where, const std::string& path) {
  constexpr std::size_t kMaxConfigBytes = 1 << 20;
  std::ifstream in(path, std::ios::binary);
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(std::size_t(in.gcount()));
  if (text.size() > kMaxConfigBytes)
    throw ConfigError(where + " " + path + ": larger than 1 MiB, not a config file");
  if (const auto nul = text.find('\0'); nul != std::string::npos)
    throw ConfigError(where + " " + path + ": a NUL byte at offset " + std::to_string(nul) +
                      ", not a text file");
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  return text;
}

void collect_config_file(const std::string& where, const std::string& path,
                         std::vector<Given>& given) {
  if (std::string why = readable_file_rule(path); !why.empty())
    throw ConfigError(where + " " + (path.empty() ? "''" : path) + ": " + why);
  const std::string text = config_text(where, path);
  {
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
      refuse_percent_in_name(where + " " + path + ": ", line.substr(0, line.find('=')));
  }
  std::istringstream f(text);
  const po::options_description desc = make_description(false);
  po::parsed_options parsed(&desc);
  try {
    parsed = po::parse_config_file(f, desc);
  } catch (const po::error& e) {
    throw ConfigError(where + " " + path + ": " + e.what());
  }
  for (const po::option& o : parsed.options) {
    if (o.string_key == "config")
      throw ConfigError(where + " " + path + ": config = ...: a config file cannot name another");
    const Row* row = find_row(o.string_key);
    const std::string value = o.value.empty() ? "" : o.value.front();
    given.push_back(
        {row, value, Source::file, where + " " + path + ": " + o.string_key + " = " + value});
  }
}

// STRATA_<OPTION> variables (STRATA_STEPS=10 is --steps 10; option_from_environment says which);
// other STRATA_* variables belong to the scripts (STRATA_MPIRUN, STRATA_HOME, ...) and are left
// alone.
void collect_env(std::vector<Given>& given) {
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind("STRATA_", 0) != 0) continue;
    const auto eq = entry.find('=');
    std::string name = entry.substr(7, eq - 7);
    for (char& ch : name) ch = ch == '_' ? '-' : char(std::tolower(static_cast<unsigned char>(ch)));
    const Row* row = find_row(name);
    if (!row || name == "config" || !option_from_environment(name)) continue;
    given.push_back({row, entry.substr(eq + 1), Source::env, entry});
  }
}

// The value each option takes: the command line over the config file over the environment. A
// single-valued option given twice in one place is refused; repeatable ones collect every value,
// environment first, so a later (stronger) KEY=VALUE wins.
std::vector<std::pair<const Row*, OptionValue>> choose(const std::vector<Given>& given) {
  std::vector<std::pair<const Row*, OptionValue>> chosen;
  for (const Row& row : rows()) {
    for (Source s : {Source::env, Source::file, Source::cli}) {
      const Given* first = nullptr;
      for (const Given& g : given) {
        if (g.row != &row || g.source != s) continue;
        OptionValue v = check_value(row, g.where, g.value);
        if (!row.option.repeatable && first)
          throw ConfigError(g.where + ": --" + row.option.name + " is given twice (also " +
                            first->where + ")");
        first = &g;
        if (!row.option.repeatable) {
          auto it = std::find_if(chosen.begin(), chosen.end(),
                                 [&](const auto& c) { return c.first == &row; });
          if (it != chosen.end()) chosen.erase(it);
        }
        chosen.emplace_back(&row, std::move(v));
      }
    }
  }
  return chosen;
}

bool given_any(const std::vector<Given>& given, const std::string& name) {
  for (const Given& g : given)
    if (g.row->option.name == name) return true;
  return false;
}

// --advise: what it needs, and what it decides itself.
void check_advise(const RunConfig& c, const std::vector<Given>& given) {
  for (const char* o : {"advise-micro-batches", "advise-top"})
    if (!c.advise && given_any(given, o))
      throw ConfigError("--" + std::string(o) + ": only with --advise");
  if (!c.advise) return;
  if (c.profile.empty())
    throw ConfigError(
        "--advise: needs --profile FILE (a machine profile, e.g. "
        "profiles/h100-sxm-published.txt made into one with --calibrate)");
  if (c.memory_limit <= 0)
    throw ConfigError("--advise: needs --memory-limit (device memory per rank, e.g. 80GiB)");
  if (c.dry_run || c.calibrate)
    throw ConfigError(
        "--advise: predicts many configurations; leave out --dry-run and --calibrate");
  if (c.mesh_given)
    throw ConfigError(
        "--mesh: --advise tries every dp x tp x pp; give --nodes and "
        "--ranks-per-node instead");
}

// --attention own|cudnn: tensor-core kernels computing in bf16 on a GPU, for the shapes they tile.
void check_attention(const RunConfig& c) {
  if (c.attention != "own" && c.attention != "cudnn") return;
  const std::string option = "--attention " + c.attention;
  if (c.device != "cuda")
    throw ConfigError(option +
                      ": a GPU kernel; needs --device cuda (the CPU computes its reference)");
  if (c.train.precision.param != DType::bf16)
    throw ConfigError(
        option + ": bf16 tensor cores; needs --precision bf16 (or --attention reference|auto)");
  const ModelSpec& m = c.model;
  if (c.attention == "own" && !cuda_tensor_core_attention(c.train.micro_batch, m.hidden, m.heads))
    throw ConfigError(option + ": head size " + std::to_string(m.hidden / m.heads) +
                      " (--hidden / --heads) must be a multiple of 16 up to 128, and "
                      "--micro-batch x --heads at most 65535");
  if (c.attention == "cudnn" && !cuda_cudnn_attention(m.hidden, m.heads))
    throw ConfigError(option + ": head size " + std::to_string(m.hidden / m.heads) +
                      " (--hidden / --heads) must be a multiple of 8 up to 128");
}

// Checks across options, after every value is known.
void check_combination(RunConfig& c, const std::vector<Given>& given) {
  const ModelSpec& m = c.model;
  if (m.hidden % m.heads != 0)
    throw ConfigError("--heads " + std::to_string(m.heads) + ": must divide --hidden " +
                      std::to_string(m.hidden));
  validate_model_spec(m);
  if (given_any(given, "warmup") && c.train.warmup >= c.train.steps)
    throw ConfigError("--warmup " + std::to_string(c.train.warmup) + ": must be below --steps " +
                      std::to_string(c.train.steps));
  // 0 means the node's measured peak; a positive peak below 1 MFLOP/s only makes MFU absurd.
  if (c.peak_tflops > 0 && c.peak_tflops < 1e-6) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", c.peak_tflops);
    throw ConfigError("--peak-tflops " + std::string(text) +
                      ": must be 0 (the node's measured peak) or at least 1e-06");
  }
  check_advise(c, given);
  check_attention(c);
  // moe's dispatch plan is made on the host from the router's choices: a step reads them back
  // (refused before the device is looked at: the same line in a build without CUDA).
  if (c.train.cuda_graphs && c.model.arch == Arch::moe)
    throw ConfigError(
        "--cuda-graphs: --arch moe reads its routing back to the host each step "
        "(its dispatch plan); run it without graphs");
  if (c.train.cuda_graphs && c.device != "cuda")
    throw ConfigError("--cuda-graphs: CUDA graphs need --device cuda");
  if (c.calibrate && c.profile.empty())
    throw ConfigError("--calibrate: needs --profile FILE (the profile to create or merge into)");
  if (!c.calibrate_from.empty() && !c.calibrate)
    throw ConfigError("--calibrate-from: only with --calibrate --profile FILE");
  if (c.calibrate && c.dry_run)
    throw ConfigError("--calibrate: measures, --dry-run predicts; give one of them");
  if (c.calibrate && c.mesh.cp > 1)  // its passes are whole sequences'; the predictor splits them
    throw ConfigError(
        "--calibrate: measures whole sequences; leave cp out of --mesh (the "
        "predictor takes a cp rank's passes from them)");
  if (c.mesh_given && double(c.mesh.dp) * c.mesh.cp * c.mesh.tp * c.mesh.pp > 16777216.0)
    throw ConfigError("--mesh: dp x cp x tp x pp is more than 16777216 ranks");
  // NCCL moves device buffers only: on the CPU backend it would be handed host memory.
  if (c.transport == "nccl" && c.device != "cuda")
    throw ConfigError("--transport nccl: moves device memory; needs --device cuda");
  if (c.device == "cuda" && c.transport != "nccl")
    throw ConfigError("--device cuda: needs --transport nccl (mpi, ucx and gloo move host memory)");
#ifdef STRATA_HAVE_GLOO
  if (c.transport == "gloo") {  // the interface named in the environment exists
    try {
      gloo_comm::interface_choice(true);
    } catch (const Error& e) {
      throw ConfigError(e.what());
    }
  }
#endif
  const MixedPrecision& mp = c.train.precision;
  if (mp.reduce == DType::bf16 && mp.param != DType::bf16)
    throw ConfigError("--reduce-dtype bf16: needs --precision bf16 (fp32 parameters reduce fp32)");
  if (mp.tp_comm == DType::bf16 && mp.param != DType::bf16)
    throw ConfigError(
        "--tp-comm-dtype bf16: needs --precision bf16 (an fp32 run moves fp32 activations); "
        "allowed with --precision fp32: fp32");
  if (mp.param == DType::bf16 && c.device == "cpu" && !cpu::have_bf16_gemm())
    throw ConfigError(
        "--precision bf16: this build's CPU backend has no bf16 matmul (built without oneDNN); "
        "install libdnnl-dev (scripts/install-deps.sh) and rebuild, or use --precision fp32");
  if (!c.data_file.empty()) check_token_file(c.data_file, m.seq, m.vocab);
}

}  // namespace

bool option_from_environment(const std::string& name) {
  return name != "help" && name != "version";
}

void check_run_id(const std::string& source, const std::string& run_id) {
  if (!is_file_name(run_id))
    throw ConfigError(source + ": must be " + kNameAccepts + ": it names a file inside --out");
}

RunConfig parse_cli(int argc, char** argv) {
  std::vector<Given> given;
  collect_cli(argc, argv, given);
  std::string config_path, config_where = "--config";
  for (const Given& g : given)
    if (g.row->option.name == "config") config_path = g.value;
  if (config_path.empty() && !given_any(given, "config") && std::getenv("STRATA_CONFIG"))
    config_path = std::getenv("STRATA_CONFIG"), config_where = "STRATA_CONFIG";
  if (given_any(given, "config") || config_where == "STRATA_CONFIG")
    collect_config_file(config_where, config_path, given);
  collect_env(given);

  RunConfig c;  // --model (always applied: it has a default) sets the preset's learning rate
  c.train.global_batch = 0;  // resolved with the mesh unless given
  const auto chosen = choose(given);
  for (const Row& row : rows()) {
    bool has = false;
    for (const auto& [r, v] : chosen)
      if (r == &row) row.apply(c, v), has = true;
    if (!has && !row.option.default_value.empty())
      row.apply(c, check_value(row, "default of --" + row.option.name, row.option.default_value));
  }
  check_combination(c, given);

  std::ostringstream help;
  help << make_description(true);
  c.help_text = help.str();
  for (int i = 0; i < argc; ++i) c.command_line += (i ? " " : "") + std::string(argv[i]);
  return c;
}

void resolve_mesh(RunConfig& c, int world, int ranks_per_host) {
  MeshSpec& m = c.mesh;
  if (c.nodes_given && c.ranks_per_node_given) {
    if (std::int64_t(m.nodes) * m.ranks_per_node != world)
      throw ConfigError("--nodes " + std::to_string(m.nodes) + " x --ranks-per-node " +
                        std::to_string(m.ranks_per_node) + " = " +
                        std::to_string(std::int64_t(m.nodes) * m.ranks_per_node) +
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
  if (!c.mesh_given) m.dp = world / (m.tp * m.pp * m.cp);
  const std::int64_t covered = std::int64_t(m.dp) * m.cp * m.tp * m.pp;
  if (covered != world)
    throw ConfigError("--mesh dp=" + std::to_string(m.dp) + ",tp=" + std::to_string(m.tp) + ",pp=" +
                      std::to_string(m.pp) + (m.cp > 1 ? ",cp=" + std::to_string(m.cp) : "") +
                      " covers " + std::to_string(covered) + " ranks, but the world has " +
                      std::to_string(world) + ": dp x cp x tp x pp must equal the world size");
  if (m.dp % m.ep != 0)
    throw ConfigError("--mesh ep=" + std::to_string(m.ep) +
                      ": must divide dp=" + std::to_string(m.dp) +
                      " (the expert-parallel groups are carved out of the data-parallel ranks)");
  TrainSpec& t = c.train;
  const std::int64_t per_micro_step = std::int64_t(t.micro_batch) * m.dp;
  if (t.global_batch == 0) {
    if (per_micro_step > 2147483647)
      throw ConfigError("--micro-batch " + std::to_string(t.micro_batch) + " x dp " +
                        std::to_string(m.dp) + ": more than 2147483647 sequences per step");
    t.global_batch = int(per_micro_step);
  }
  if (t.global_batch % per_micro_step != 0)
    throw ConfigError(
        "--global-batch " + std::to_string(t.global_batch) +
        ": must be a multiple of --micro-batch x dp = " + std::to_string(per_micro_step));
  if (t.warmup >= t.steps) t.warmup = t.steps > 1 ? 1 : 0;  // only the default can get here
}

// auto takes the own kernel, not cuDNN's, until a GPU check has compared cuDNN's with the CPU
// reference (docs/gpu.md).
AttentionKernel RunConfig::attention_kernel() const {
  if (attention == "cudnn") return AttentionKernel::cudnn;
  const bool own =
      attention == "own" ||
      (attention == "auto" && device == "cuda" && train.precision.param == DType::bf16 &&
       cuda_tensor_core_attention(train.micro_batch, model.hidden, model.heads));
  return own ? AttentionKernel::own : AttentionKernel::reference;
}

std::vector<std::pair<std::string, std::string>> RunConfig::resolved(
    std::map<std::string, ConfigType>* types) const {
  std::vector<std::pair<std::string, std::string>> r;
  // The value's C++ type decides how /config stores it (results/run_record.hpp, ConfigType).
  auto add = [&](const std::string& k, const auto& v) {
    using V = std::decay_t<decltype(v)>;
    ConfigType type = ConfigType::text;
    if constexpr (std::is_same_v<V, bool>) {
      r.emplace_back(k, v ? "true" : "false");
      type = ConfigType::boolean;
    } else if constexpr (std::is_floating_point_v<V>) {
      r.emplace_back(k, real_text(double(v)));
      type = ConfigType::real;
    } else {
      std::ostringstream s;
      s << v;
      r.emplace_back(k, s.str());
      if constexpr (std::is_integral_v<V>) type = ConfigType::integer;
    }
    if (types) (*types)[k] = type;
  };
  add("plugin", plugin);
  add("plugin_opts", join(plugin_opts, ","));
  add("transport", transport);
  add("device", device);
  add("attention", attention_kernel_name(attention_kernel()));
  add("cuda_graphs", train.cuda_graphs);
  add("model", model.preset);
  add("layers", model.layers);
  add("hidden", model.hidden);
  add("heads", model.heads);
  add("seq", model.seq);
  add("vocab", model.vocab);
  add("arch", std::string(arch_name(model.arch)));
  add("kv_heads", model.kv_head_count());
  add("ffn", model.ffn_hidden());
  add("rope_theta", model.rope_theta);
  add("experts", model.expert_count());
  add("top_k", model.arch == Arch::moe ? model.top_k : 0);
  add("capacity_factor", model.arch == Arch::moe ? model.capacity_factor : 0.0);
  add("aux_loss_coef", model.arch == Arch::moe ? model.aux_loss_coef : 0.0);
  add("shared_experts", model.arch == Arch::moe ? model.shared_experts : 0);
  add("params", model.total_params());
  add("active_params", model.active_params());
  add("micro_batch", train.micro_batch);
  add("global_batch", train.global_batch);
  add("micro_steps", train.global_batch ? train.micro_steps(mesh) : 0);
  add("steps", train.steps);
  add("steps_requested", train.steps);
  add("target_ci", target_ci);
  add("warmup", train.warmup);
  add("seed", train.seed);
  add("lr", train.lr);
  add("weight_decay", train.weight_decay);
  add("grad_clip", train.grad_clip);
  add("recompute", recompute_name(train.recompute));
  add("precision", dtype_name(train.precision.param));
  add("reduce_dtype", dtype_name(train.precision.reduce));
  add("tp_comm_dtype", dtype_name(train.precision.tp_comm));
  add("data", data_file.empty() ? "synthetic" : data_file);
  add("nodes", mesh.nodes);
  add("ranks_per_node", mesh.ranks_per_node);
  add("world", mesh.world());
  add("dp", mesh.dp);
  add("tp", mesh.tp);
  add("pp", mesh.pp);
  add("ep", mesh.ep);
  add("cp", mesh.cp);
  add("blas_threads", blas_threads);
  add("watchdog_s", watchdog_s);
  add("peak_tflops", peak_tflops);
  add("max_cv", max_cv);
  add("trace", trace);
  add("calibrate_comm", calibrate_comm);
  if (!profile.empty()) add("profile", profile);
  add("out", out_dir);
  return r;
}

}  // namespace strata
