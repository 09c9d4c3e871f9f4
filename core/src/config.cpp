#include "config.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "comm/transport.hpp"
#include "data.hpp"
#include "strata/types.hpp"

extern char** environ;
namespace po = boost::program_options;

namespace strata {
namespace {

// One parsed value: the text as given, and its number for numeric kinds.
struct OptionValue {
  std::string text;
  long long integer = 0;
  double real = 0;
  bool flag = false;
};
using Apply = std::function<void(RunConfig&, const OptionValue&)>;
// A text option's own rule: "" when `value` is fine, else what is wrong with it.
using Rule = std::string (*)(const std::string& value);

struct Row {
  RunnerOption option;
  Apply apply;
  Rule rule = nullptr;
  std::string rule_accepts;  // text options: what the rule allows, for messages
  std::string example;       // text options: a value the rule allows
};

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::string integer_text(double v) { return std::to_string(std::llround(v)); }

// "80GiB", "512MiB", "1e9": bytes, finite and above 0; false for anything else.
bool parse_size(const std::string& text, double* bytes) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (...) {
    return false;
  }
  const std::string unit = text.substr(used);
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
    if (unit == name && std::isfinite(value) && value > 0 && std::isfinite(value * scale)) {
      *bytes = value * scale;
      return true;
    }
  return false;
}

bool is_file_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s[0] == '.') return false;
  for (char ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '+' &&
        ch != '-')
      return false;
  return true;
}

// --mesh dp=D,tp=T,pp=P: each axis at most once, each size a decimal in 1..65536.
std::string mesh_rule(const std::string& text) {
  std::stringstream ss(text);
  std::string item, seen;
  if (text.empty() || text.back() == ',') return "empty entry";
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string num = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key != "dp" && key != "tp" && key != "pp") return "unknown axis '" + key + "'";
    if (seen.find(key) != std::string::npos) return key + " given twice";
    seen += key;
    if (num.empty() || num.size() > 5 || num.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(num) < 1 || std::stoi(num) > 65536)
      return key + " must be a whole number in 1..65536";
  }
  return "";
}

void apply_mesh(RunConfig& c, const std::string& text) {
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    (key == "dp"   ? c.mesh.dp
     : key == "tp" ? c.mesh.tp
                   : c.mesh.pp) = std::stoi(item.substr(eq + 1));
  }
  c.mesh_given = true;
}

std::string key_value_rule(const std::string& kv) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) return "expected KEY=VALUE";
  return "";
}

std::string directory_rule(const std::string& path) {
  std::error_code ec;
  if (path.empty()) return "empty";
  if (!std::filesystem::is_directory(path, ec)) return "not a directory";
  return "";
}

std::string readable_file_rule(const std::string& path) {
  struct stat st {};
  if (path.empty()) return "empty";
  if (::stat(path.c_str(), &st) != 0) return "cannot open the file";
  if (S_ISDIR(st.st_mode)) return "is a directory, not a file";
  if (!std::ifstream(path)) return "cannot open the file";
  return "";
}

std::string out_dir_rule(const std::string& path) {
  std::error_code ec;
  if (path.empty()) return "empty";
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_directory(path, ec))
    return "exists and is not a directory";
  return "";
}

constexpr double kMaxInt = 2147483647;
constexpr const char* kNameAccepts =
    "a name of letters, digits, '.', '_', '+', '-' (at most 128, not starting with '.')";
const std::map<std::string, double> kPresetLr = {
    {"tiny", 3e-3}, {"small", 1e-3}, {"gpt2-124m", 6e-4}};

// A row's common part; the helpers below fill in what their kind needs.
Row base_row(const char* name, const char* section, OptionKind kind, const char* def,
             const char* help) {
  Row r;
  r.option.name = name, r.option.section = section, r.option.kind = kind;
  r.option.default_value = def, r.option.help = help;
  return r;
}
Row flag(const char* name, const char* section, const char* help, void (*set)(RunConfig&, bool)) {
  Row r = base_row(name, section, OptionKind::flag, "", help);
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.flag); };
  return r;
}
Row integer(const char* name, const char* section, const char* def, double lo, double hi,
            const char* help, void (*set)(RunConfig&, long long)) {
  Row r = base_row(name, section, OptionKind::integer, def, help);
  r.option.min = lo, r.option.max = hi;
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.integer); };
  return r;
}
Row real(const char* name, const char* section, const char* def, double lo, double hi,
         bool lo_exclusive, const char* help, void (*set)(RunConfig&, double)) {
  Row r = base_row(name, section, OptionKind::real, def, help);
  r.option.min = lo, r.option.max = hi, r.option.min_exclusive = lo_exclusive;
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.real); };
  return r;
}
Row size(const char* name, const char* section, double hi, const char* help,
         void (*set)(RunConfig&, double)) {
  Row r = base_row(name, section, OptionKind::size, "", help);
  r.option.max = hi;
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.real); };
  return r;
}
Row text(const char* name, const char* section, OptionKind kind, const char* def, const char* help,
         void (*set)(RunConfig&, const std::string&)) {
  Row r = base_row(name, section, kind, def, help);
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.text); };
  return r;
}
Row with_rule(Row r, Rule rule, const char* accepts, const char* example,
              std::vector<std::string> also_invalid) {
  r.rule = rule, r.rule_accepts = accepts, r.example = example;
  r.option.also_invalid = std::move(also_invalid);
  return r;
}
Row choice(Row r, std::vector<std::string> choices) {
  r.option.choices = std::move(choices);
  return r;
}
Row repeatable(Row r) {
  r.option.repeatable = true;
  return r;
}

// The option table. Sections are the help's headings; the order is the order values are applied
// (the model preset before the sizes that override it).
std::vector<Row> make_rows() {
  using K = OptionKind;
  const char* W = "What to run";
  const char* M = "Model";
  const char* T = "Training";
  const char* L = "Mesh and launch";
  const char* R = "Results";
  std::vector<Row> rows = {
      text("plugin", W, K::name, "", "strategy to run (see --list-plugins)",
           [](RunConfig& c, const std::string& s) { c.plugin = s; }),
      with_rule(
          repeatable(text("plugin-opt", W, K::text, "", "KEY=VALUE strategy option (repeatable)",
                          [](RunConfig& c, const std::string& s) { c.plugin_opts.push_back(s); })),
          key_value_rule, "KEY=VALUE", "key=value", {"", "novalue", "=1"}),
      with_rule(repeatable(
                    text("plugin-path", W, K::text, "", "extra directory with plugins (repeatable)",
                         [](RunConfig& c, const std::string& s) { c.plugin_paths.push_back(s); })),
                directory_rule, "an existing directory", "/", {"", "/nonexistent-strata-dir"}),
      flag("list-plugins", W, "list the strategies found and exit",
           [](RunConfig& c, bool b) { c.list_plugins = b; }),
      flag("list-transports", W, "list the transports of this build (one per line) and exit",
           [](RunConfig& c, bool b) { c.list_transports = b; }),
      text("describe", W, K::name, "", "describe a strategy and its options and exit",
           [](RunConfig& c, const std::string& s) { c.describe = s; }),
      flag("dry-run", W, "print the predicted memory and comm per step and exit",
           [](RunConfig& c, bool b) { c.dry_run = b; }),
      size("memory-limit", W, 1125899906842624.0,
           "with --dry-run: bytes per rank to fit in (e.g. 80GiB)",
           [](RunConfig& c, double v) { c.memory_limit = v; }),
      choice(text("transport", W, K::choice, "mpi", "communication backend of the mesh groups",
                  [](RunConfig& c, const std::string& s) { c.transport = s; }),
             transports_built()),
      choice(text("device", W, K::choice, "cpu", "compute backend",
                  [](RunConfig& c, const std::string& s) { c.device = s; }),
             {"cpu"}),
      with_rule(text("config", W, K::text, "",
                     "INI file of options (same names as the CLI); also STRATA_CONFIG",
                     [](RunConfig&, const std::string&) {}),
                readable_file_rule, "a readable file", "/dev/null",
                {"", "/nonexistent-strata.ini", "/"}),
      flag("help", W, "this help", [](RunConfig& c, bool b) { c.help = b; }),
      choice(text("model", M, K::choice, "tiny", "preset (the sizes below override it)",
                  [](RunConfig& c, const std::string& s) {
                    c.model = model_preset(s);
                    c.train.lr = kPresetLr.at(s);
                  }),
             {"tiny", "small", "gpt2-124m"}),
      integer(
          "layers", M, "", 1, 4096, "transformer blocks",
          [](RunConfig& c, long long v) { c.model.layers = int(v), c.model.preset = "custom"; }),
      integer(
          "hidden", M, "", 1, 65536, "hidden size",
          [](RunConfig& c, long long v) { c.model.hidden = int(v), c.model.preset = "custom"; }),
      integer("heads", M, "", 1, 4096, "attention heads (must divide --hidden)",
              [](RunConfig& c, long long v) { c.model.heads = int(v), c.model.preset = "custom"; }),
      integer("seq", M, "", 1, 1048576, "sequence length",
              [](RunConfig& c, long long v) { c.model.seq = int(v), c.model.preset = "custom"; }),
      integer("vocab", M, "", 2, 65536, "vocabulary size (tokens are uint16)",
              [](RunConfig& c, long long v) { c.model.vocab = int(v), c.model.preset = "custom"; }),
      integer("micro-batch", T, "8", 1, 65536, "sequences per micro-batch per rank",
              [](RunConfig& c, long long v) { c.train.micro_batch = int(v); }),
      integer("global-batch", T, "", 1, kMaxInt,
              "sequences per step over all ranks (default micro-batch x dp); more means "
              "gradient accumulation",
              [](RunConfig& c, long long v) { c.train.global_batch = int(v); }),
      integer("steps", T, "20", 1, 1e9, "optimizer steps",
              [](RunConfig& c, long long v) { c.train.steps = int(v); }),
      integer("warmup", T, "2", 0, 1e9, "first steps left out of the summary statistics",
              [](RunConfig& c, long long v) { c.train.warmup = int(v); }),
      integer("seed", T, "1234", 0, 9007199254740991.0, "seed of initialisation and data",
              [](RunConfig& c, long long v) { c.train.seed = std::uint64_t(v); }),
      real("lr", T, "", 0, 10, true,
           "AdamW learning rate, constant (default by preset: tiny 3e-3, small 1e-3, gpt2-124m "
           "6e-4)",
           [](RunConfig& c, double v) { c.train.lr = v; }),
      real("weight-decay", T, "0.1", 0, 10, false, "AdamW weight decay on 2-D weights",
           [](RunConfig& c, double v) { c.train.weight_decay = v; }),
      real("grad-clip", T, "1.0", 0, 1e9, false, "global gradient-norm clip (0 = off)",
           [](RunConfig& c, double v) { c.train.grad_clip = v; }),
      choice(
          text("recompute", T, K::choice, "none",
               "activation recomputation: none, full (keep block inputs), selective "
               "(attention core)",
               [](RunConfig& c, const std::string& s) { parse_recompute(s, &c.train.recompute); }),
          {"none", "full", "selective"}),
      with_rule(text("data", T, K::text, "",
                     "flat binary file of uint16 tokens (default: synthetic data)",
                     [](RunConfig& c, const std::string& s) { c.data_file = s; }),
                readable_file_rule, "a readable file of uint16 tokens", "/etc/hostname",
                {"", "/nonexistent-strata-tokens", "/"}),
      integer("nodes", L, "", 1, 65536, "nodes (virtual nodes on one machine)",
              [](RunConfig& c, long long v) { c.mesh.nodes = int(v), c.nodes_given = true; }),
      integer("ranks-per-node", L, "", 1, 1024, "ranks per node",
              [](RunConfig& c, long long v) {
                c.mesh.ranks_per_node = int(v), c.ranks_per_node_given = true;
              }),
      with_rule(text("mesh", L, K::text, "", "dp=D,tp=T,pp=P (default dp = world)",
                     [](RunConfig& c, const std::string& s) { apply_mesh(c, s); }),
                mesh_rule, "a comma list of dp=N, tp=N, pp=N, each axis once, N in 1..65536",
                "dp=1", {"", "dp=2abc", "dp=2,dp=2", "dp=0", "xx=2", "dp", "dp=2,", "dp=99999999"}),
      integer("blas-threads", L, "0", 0, 1024, "BLAS threads per rank (0 = cores / ranks on host)",
              [](RunConfig& c, long long v) { c.blas_threads = int(v); }),
      with_rule(text("out", R, K::text, "results/local", "directory for the run file",
                     [](RunConfig& c, const std::string& s) { c.out_dir = s; }),
                out_dir_rule, "a directory (created if missing)", "results/local",
                {"", "/etc/hostname"}),
      text("run-id", R, K::name, "", "name of the run file (default: time, strategy, mesh)",
           [](RunConfig& c, const std::string& s) { c.run_id = s; }),
      real("peak-tflops", R, "0", 0, 1e6, false,
           "peak TFLOP/s per rank for MFU (0 = measure the best SGEMM rate at start-up)",
           [](RunConfig& c, double v) { c.peak_tflops = v; }),
      real("watchdog", R, "300", 1, 604800, false,
           "seconds a blocking call may take, and a rank may be silent, before the job is ended",
           [](RunConfig& c, double v) { c.watchdog_s = v; }),
      flag("quiet", R, "no per-step lines", [](RunConfig& c, bool b) { c.quiet = b; }),
      flag("trace", R,
           "record every compute and comm interval of every rank: /trace in the run file and "
           "<run-id>.trace.json (Chrome/Perfetto timeline)",
           [](RunConfig& c, bool b) { c.trace = b; }),
      flag("calibrate-comm", R,
           "before the timed steps, measure busbw of all_reduce, reduce_scatter and all_gather "
           "at 64 KiB, 1 MiB and 16 MiB on every mesh group: /calibration",
           [](RunConfig& c, bool b) { c.calibrate_comm = b; }),
  };
  return rows;
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = make_rows();
  return table;
}

const Row& row_of(const RunnerOption& o) {
  for (const Row& r : rows())
    if (r.option.name == o.name) return r;
  throw Error("internal: no row for option " + o.name);
}

// Where a value came from, for messages: "--steps abc", "STRATA_STEPS=abc", "--config f: steps =
// abc".
enum class Source { cli, file, env };
struct Given {
  const Row* row;
  std::string value;
  Source source;
  std::string where;
};

const Row* find_row(const std::string& name) {
  for (const Row& r : rows())
    if (r.option.name == name) return &r;
  return nullptr;
}

// Check `text` against `row`; returns the parsed value or throws ConfigError naming `where`.
OptionValue check_value(const Row& row, const std::string& where, const std::string& text) {
  const RunnerOption& o = row.option;
  auto refuse = [&](const std::string& why = "") -> OptionValue {
    throw ConfigError(
        where + ": " +
        (why.empty() ? "must be " + o.accepts() : why + " (expected " + o.accepts() + ")"));
  };
  OptionValue v;
  v.text = text;
  switch (o.kind) {
    case OptionKind::flag: {
      static const std::map<std::string, bool> words = {
          {"true", true},   {"yes", true}, {"on", true},   {"1", true},
          {"false", false}, {"no", false}, {"off", false}, {"0", false}};
      auto it = words.find(text);
      if (it == words.end()) return refuse();
      v.flag = it->second;
      return v;
    }
    case OptionKind::integer: {
      const bool digits =
          !text.empty() && text.size() <= 19 &&
          text.find_first_not_of("0123456789", text[0] == '-') == std::string::npos && text != "-";
      if (!digits) return refuse();
      v.integer = std::stoll(text);
      if (double(v.integer) < o.min || double(v.integer) > o.max) return refuse();
      return v;
    }
    case OptionKind::real: {
      char* end = nullptr;
      errno = 0;
      v.real = text.empty() ? NAN : std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v.real) ||
          v.real < o.min || (o.min_exclusive && v.real == o.min) || v.real > o.max)
        return refuse();
      return v;
    }
    case OptionKind::size:
      if (!parse_size(text, &v.real) || v.real > o.max) return refuse();
      return v;
    case OptionKind::choice:
      for (const auto& c : o.choices)
        if (text == c) return v;
      return refuse();
    case OptionKind::name:
      if (!is_file_name(text)) return refuse();
      return v;
    case OptionKind::text:
      if (std::string why = row.rule(text); !why.empty()) return refuse(why);
      return v;
  }
  return refuse();
}

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

void collect_cli(int argc, char** argv, std::vector<Given>& given) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.rfind('-', 0) == 0) refuse_percent_in_name("", word.substr(0, word.find('=')));
  }
  const po::options_description desc = make_description(false);
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  po::parsed_options parsed(&desc);
  try {
    parsed = po::command_line_parser(argc, argv).options(desc).style(style).run();
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + " (see runner --help)");
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

void collect_config_file(const std::string& where, const std::string& path,
                         std::vector<Given>& given) {
  if (std::string why = readable_file_rule(path); !why.empty())
    throw ConfigError(where + " " + (path.empty() ? "''" : path) + ": " + why);
  {
    std::ifstream lines(path);
    for (std::string line; std::getline(lines, line);)
      refuse_percent_in_name(where + " " + path + ": ", line.substr(0, line.find('=')));
  }
  std::ifstream f(path);
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

// STRATA_<OPTION> variables (STRATA_STEPS=10 is --steps 10); other STRATA_* variables belong to
// the scripts (STRATA_MPIRUN, STRATA_HOME, ...) and are left alone.
void collect_env(std::vector<Given>& given) {
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind("STRATA_", 0) != 0) continue;
    const auto eq = entry.find('=');
    std::string name = entry.substr(7, eq - 7);
    for (char& ch : name) ch = ch == '_' ? '-' : char(std::tolower(static_cast<unsigned char>(ch)));
    const Row* row = find_row(name);
    if (!row || name == "config") continue;
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

// Checks across options, after every value is known.
void check_combination(RunConfig& c, const std::vector<Given>& given) {
  const ModelSpec& m = c.model;
  if (m.hidden % m.heads != 0)
    throw ConfigError("--heads " + std::to_string(m.heads) + ": must divide --hidden " +
                      std::to_string(m.hidden));
  if (given_any(given, "warmup") && c.train.warmup >= c.train.steps)
    throw ConfigError("--warmup " + std::to_string(c.train.warmup) + ": must be below --steps " +
                      std::to_string(c.train.steps));
  if (c.memory_limit > 0 && !c.dry_run)
    throw ConfigError("--memory-limit: only with --dry-run (a run measures its memory)");
  if (c.mesh_given && double(c.mesh.dp) * c.mesh.tp * c.mesh.pp > 16777216.0)
    throw ConfigError("--mesh: dp x tp x pp is more than 16777216 ranks");
  if (c.device != "cpu")
    throw ConfigError("--device " + c.device + ": must be cpu (the only device in this build)");
  if (!c.data_file.empty()) check_token_file(c.data_file, m.seq, m.vocab);
}

}  // namespace

std::string RunnerOption::accepts() const {
  const std::string range = integer_text(min) + ".." + integer_text(max);
  switch (kind) {
    case OptionKind::flag:
      return "true or false (yes/no, on/off, 1/0)";
    case OptionKind::integer:
      return "a whole number in " + range;
    case OptionKind::real:
      return std::string("a number in ") + (min_exclusive ? "(" : "[") + number_text(min) + ", " +
             number_text(max) + "]";
    case OptionKind::size:
      return "a size such as 80GiB, 512MiB or 1e9, above 0 and at most 1PiB";
    case OptionKind::choice:
      return "one of " + join(choices);
    case OptionKind::name:
      return kNameAccepts;
    case OptionKind::text:
      return row_of(*this).rule_accepts;
  }
  return "";
}

std::vector<std::string> RunnerOption::invalid_examples() const {
  std::vector<std::string> bad;
  switch (kind) {
    case OptionKind::flag:
      bad = {"maybe", "", "2"};
      break;
    case OptionKind::integer:
      bad = {"",
             "abc",
             "1.5",
             "nan",
             "inf",
             "7abc",
             "99999999999999999999",
             "1e3",
             integer_text(min - 1),
             integer_text(max + 1)};
      break;
    case OptionKind::real:
      bad = {"",
             "abc",
             "nan",
             "inf",
             "-inf",
             "1e400",
             "1.5x",
             number_text(max * 10 + 1),
             min_exclusive ? number_text(min) : number_text(min - 1)};
      break;
    case OptionKind::size:
      bad = {"", "abc", "0", "-1GiB", "nan", "inf", "5XB", "1e30TiB"};
      break;
    case OptionKind::choice:
      bad = {"", "nosuch", choices.front() + "x", " " + choices.front()};
      break;
    case OptionKind::name:
      bad = {"", "../x", "/abs", "a/b", ".hidden", "..", "a b", std::string(129, 'a')};
      break;
    case OptionKind::text:
      break;
  }
  bad.insert(bad.end(), also_invalid.begin(), also_invalid.end());
  return bad;
}

std::string RunnerOption::valid_example() const {
  switch (kind) {
    case OptionKind::flag:
      return "true";
    case OptionKind::integer:
      // 64: within every range here, and a size the others divide (heads into hidden)
      return default_value.empty() ? integer_text(std::clamp(64.0, min, max)) : default_value;
    case OptionKind::real:
      return default_value.empty() ? number_text(max) : default_value;
    case OptionKind::size:
      return "1GiB";
    case OptionKind::choice:
      return choices.front();
    case OptionKind::name:
      return "example-1";
    case OptionKind::text:
      return row_of(*this).example;
  }
  return "";
}

const std::vector<RunnerOption>& runner_options() {
  static const std::vector<RunnerOption> options = [] {
    std::vector<RunnerOption> v;
    for (const Row& r : rows()) v.push_back(r.option);
    return v;
  }();
  return options;
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
  if (!c.mesh_given) m.dp = world / (m.tp * m.pp);
  if (std::int64_t(m.dp) * m.tp * m.pp != world)
    throw ConfigError("--mesh dp=" + std::to_string(m.dp) + ",tp=" + std::to_string(m.tp) +
                      ",pp=" + std::to_string(m.pp) + " covers " +
                      std::to_string(std::int64_t(m.dp) * m.tp * m.pp) +
                      " ranks, but the world has " + std::to_string(world) +
                      ": dp x tp x pp must equal the world size");
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

std::vector<std::pair<std::string, std::string>> RunConfig::resolved() const {
  std::vector<std::pair<std::string, std::string>> r;
  auto add = [&](const std::string& k, const auto& v) {
    std::ostringstream s;
    s << v;
    r.emplace_back(k, s.str());
  };
  add("plugin", plugin);
  add("plugin_opts", join(plugin_opts, ","));
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
