// The runner's option table (config_table.hpp) and the checks of single values.
#include "runner/config_table.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "backends/backend.hpp"
#include "comm/transport.hpp"
#include "strata/types.hpp"

namespace strata {
namespace options {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

bool is_file_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s[0] == '.') return false;
  for (char ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '+' &&
        ch != '-')
      return false;
  return true;
}

std::string readable_file_rule(const std::string& path) {
  struct stat st {};
  if (path.empty()) return "empty";
  if (::stat(path.c_str(), &st) != 0) return "cannot open the file";
  if (S_ISDIR(st.st_mode)) return "is a directory, not a file";
  // Opening a FIFO waits for its writer: the option's reader decides (--config reads one, as from
  // <(...); --data wants a regular file and says so without waiting).
  if (S_ISFIFO(st.st_mode)) return "";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "cannot open the file";
  ::close(fd);
  return "";
}

const char* const kNameAccepts =
    "a name of letters, digits, '.', '_', '+', '-' (at most 128, not starting with '.')";
namespace {

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

// --mesh dp=D,tp=T,pp=P,ep=E,cp=C: each axis at most once, each size a decimal in 1..65536.
std::string mesh_rule(const std::string& text) {
  std::stringstream ss(text);
  std::string item, seen;
  if (text.empty() || text.back() == ',') return "empty entry";
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string num = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key != "dp" && key != "tp" && key != "pp" && key != "ep" && key != "cp")
      return "unknown axis '" + key + "'";
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
     : key == "ep" ? c.mesh.ep
     : key == "cp" ? c.mesh.cp
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

std::string profile_rule(const std::string& path) {
  std::error_code ec;
  if (path.empty()) return "empty";
  if (std::filesystem::is_directory(path, ec)) return "is a directory, not a file";
  return "";
}

// "1,2,4": positive micro-batch sizes, comma-separated.
std::string micro_batch_list_rule(const std::string& text) {
  if (text.empty()) return "empty";
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    if (item.empty() || item.size() > 5 ||
        item.find_first_not_of("0123456789") != std::string::npos || std::stoi(item) < 1)
      return "'" + item + "' is not a micro-batch size in 1..65536";
    if (std::stoi(item) > 65536) return "'" + item + "' is above 65536";
    at = comma + 1;
  }
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

// A row's common part; the helpers below fill in what their kind needs.
Row base_row(const char* name, const char* section, OptionKind kind, const char* def,
             const std::string& help) {
  Row r;
  r.option.name = name, r.option.section = section, r.option.kind = kind;
  r.option.default_value = def, r.option.help = help;
  return r;
}
Row flag(const char* name, const char* section, const std::string& help,
         void (*set)(RunConfig&, bool)) {
  Row r = base_row(name, section, OptionKind::flag, "", help);
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.flag); };
  return r;
}
Row integer(const char* name, const char* section, const char* def, double lo, double hi,
            const std::string& help, void (*set)(RunConfig&, long long)) {
  Row r = base_row(name, section, OptionKind::integer, def, help);
  r.option.min = lo, r.option.max = hi;
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.integer); };
  return r;
}
Row real(const char* name, const char* section, const char* def, double lo, double hi,
         bool lo_exclusive, const std::string& help, void (*set)(RunConfig&, double)) {
  Row r = base_row(name, section, OptionKind::real, def, help);
  r.option.min = lo, r.option.max = hi, r.option.min_exclusive = lo_exclusive;
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.real); };
  return r;
}
Row size(const char* name, const char* section, double hi, const std::string& help,
         void (*set)(RunConfig&, double)) {
  Row r = base_row(name, section, OptionKind::size, "", help);
  r.option.max = hi;
  r.apply = [set](RunConfig& c, const OptionValue& v) { set(c, v.real); };
  return r;
}
Row text(const char* name, const char* section, OptionKind kind, const char* def,
         const std::string& help, void (*set)(RunConfig&, const std::string&)) {
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

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets()) names.push_back(p.spec.preset);
  return names;
}

// "tiny 0.003, small 0.001, gpt2-124m 0.0006"
std::string preset_learning_rates() {
  std::vector<std::string> lrs;
  for (const ModelPreset& p : model_presets())
    lrs.push_back(p.spec.preset + " " + number_text(p.lr));
  return join(lrs);
}

// Which strategy, transport and device; the actions instead of a run.
std::vector<Row> what_to_run_rows() {
  using K = OptionKind;
  const char* W = "What to run";
  return {
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
  };
}

// What to run, continued: the predictor's requests (profiles, calibration, memory, the advisor).
std::vector<Row> prediction_rows() {
  using K = OptionKind;
  const char* W = "What to run";
  return {
      with_rule(text("profile", W, K::text, "",
                     "machine profile (HDF5): --dry-run predicts step time, tokens/s and MFU from "
                     "it, a run stores its predicted step time beside the measured one in "
                     "/summary; --calibrate creates it or merges into it",
                     [](RunConfig& c, const std::string& s) { c.profile = s; }),
                profile_rule, "a file path", "machine.h5", {"", "/"}),
      flag("calibrate", W,
           "measure unit passes, the optimizer and the collectives of this mesh into --profile "
           "and exit (seconds)",
           [](RunConfig& c, bool b) { c.calibrate = b; }),
      with_rule(repeatable(text(
                    "calibrate-from", W, K::text, "",
                    "with --calibrate: take the comm samples of this run file's "
                    "/calibration (--calibrate-comm) instead of measuring "
                    "(repeatable); a .txt table of published figures (profiles/) makes a "
                    "new profile from it alone",
                    [](RunConfig& c, const std::string& s) { c.calibrate_from.push_back(s); })),
                readable_file_rule, "a readable run file or table", "/dev/null",
                {"", "/nonexistent-strata-run.h5", "/"}),
      size("memory-limit", W, 1125899906842624.0,
           "bytes of memory per rank to fit in (e.g. 80GiB; a GPU's device memory): --dry-run "
           "and --advise check against it; a run is refused before it starts when its predicted "
           "memory exceeds it (default: what this host lets its ranks use, --skip-memory-check)",
           [](RunConfig& c, double v) { c.memory_limit = v; }),
      flag("skip-memory-check", W,
           "start the run even when its predicted memory exceeds what the host lets its ranks "
           "use or --memory-limit",
           [](RunConfig& c, bool b) { c.skip_memory_check = b; }),
      flag("advise", W,
           "rank every strategy, mesh (tp inside a node), --advise-micro-batches size and "
           "recompute mode that fits --memory-limit for --model on --nodes x --ranks-per-node "
           "devices by --profile's predicted tokens/s, and exit (--plugin: only that one)",
           [](RunConfig& c, bool b) { c.advise = b; }),
      with_rule(text("advise-micro-batches", W, K::text, "1,2,4,8",
                     "with --advise: the micro-batch sizes to try",
                     [](RunConfig& c, const std::string& s) {
                       c.advise_micro_batches.clear();
                       for (std::size_t at = 0; at < s.size(); at = s.find(',', at) + 1) {
                         c.advise_micro_batches.push_back(std::stoi(s.substr(at)));
                         if (s.find(',', at) == std::string::npos) break;
                       }
                     }),
                micro_batch_list_rule, "sizes 1..65536, comma-separated", "1,2,4",
                {"", "0", "1,,2", "a", "1,-2", "99999"}),
      integer("advise-top", W, "10", 1, 100000, "with --advise: table rows to print",
              [](RunConfig& c, long long v) { c.advise_top = int(v); }),
  };
}

// What to run, continued: the backends, the config file, the help.
std::vector<Row> backend_rows() {
  using K = OptionKind;
  const char* W = "What to run";
  return {
      choice(text("transport", W, K::choice, "mpi", "communication backend of the mesh groups",
                  [](RunConfig& c, const std::string& s) { c.transport = s; }),
             transports_built()),
      choice(text("device", W, K::choice, "cpu", "compute backend (cuda: one GPU per rank)",
                  [](RunConfig& c, const std::string& s) {
                    c.device = s;
                    c.train.device = s == "cuda" ? Device::cuda : Device::cpu;
                  }),
             backend_built(Device::cuda) ? std::vector<std::string>{"cpu", "cuda"}
                                         : std::vector<std::string>{"cpu"}),
      choice(text("attention", W, K::choice, "auto",
                  "attention kernels of --device cuda: own (strata's bf16 tensor-core flash "
                  "kernel; --precision bf16), cudnn (cuDNN's fused flash attention, in a build "
                  "with cuDNN; --precision bf16), reference (the fp32 flash kernel on CUDA "
                  "cores), auto (own where it applies, else reference); the CPU computes its "
                  "reference",
                  [](RunConfig& c, const std::string& s) { c.attention = s; }),
             {"auto", "own", "cudnn", "reference"}),
      flag("cuda-graphs", W,
           "--device cuda: capture each run of unit passes with no communication inside (a "
           "micro-batch's forward or backward, a pipeline chunk's) once as a CUDA graph and replay "
           "it; not where comm runs between the passes (tp, zero2, zero3, fsdp)",
           [](RunConfig& c, bool b) { c.train.cuda_graphs = b; }),
      with_rule(text("config", W, K::text, "",
                     "INI file of options (same names as the CLI); also STRATA_CONFIG",
                     [](RunConfig&, const std::string&) {}),
                readable_file_rule, "a readable file", "/dev/null",
                {"", "/nonexistent-strata.ini", "/"}),
      flag("help", W, "this help", [](RunConfig& c, bool b) { c.help = b; }),
      flag("version", W, "print the version (project version and git describe) and exit",
           [](RunConfig& c, bool b) { c.version = b; }),
  };
}

// The preset, then the sizes that override it.
std::vector<Row> model_rows() {
  using K = OptionKind;
  const char* M = "Model";
  return {
      choice(text("model", M, K::choice, "tiny", "preset (the sizes below override it)",
                  [](RunConfig& c, const std::string& s) {
                    const ModelPreset& p = *find_model_preset(s);
                    c.model = p.spec;
                    c.train.lr = p.lr;
                  }),
             preset_names()),
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
      integer("vocab", M, "", 2, 2147483647,
              "vocabulary size (token ids are int32 in the kernels; --data files hold uint16 or "
              "uint32 tokens)",
              [](RunConfig& c, long long v) { c.model.vocab = int(v), c.model.preset = "custom"; }),
      choice(text("arch", M, K::choice, "",
                  "model family: gpt2 (LayerNorm, GELU, learned "
                  "positions, tied head), llama (RMSNorm, SwiGLU, rotary, grouped-query "
                  "attention, untied head) or moe (llama with a top-k routed mixture of SwiGLU "
                  "experts for its MLP; default 8 experts, top 2, dropless); default the preset's",
                  [](RunConfig& c, const std::string& s) {
                    Arch arch = c.model.arch;  // unset: the preset's
                    if (!parse_arch(s, &arch) || arch == c.model.arch) return;
                    ModelSpec& m = c.model;
                    m.arch = arch;
                    m.preset = "custom";
                    if (arch != Arch::moe) {  // a moe preset's experts go with its family
                      m.experts = m.top_k = m.shared_experts = 0;
                      m.capacity_factor = 0;
                    } else {  // Mixtral's, unless given
                      if (m.experts == 0) m.experts = 8;
                      if (m.top_k == 0) m.top_k = 2;
                    }
                  }),
             {"gpt2", "llama", "moe"}),
      integer(
          "kv-heads", M, "", 1, 4096,
          "K/V heads of grouped-query attention (--arch llama; must divide --heads)",
          [](RunConfig& c, long long v) { c.model.kv_heads = int(v), c.model.preset = "custom"; }),
      integer("ffn", M, "", 1, 1048576,
              "the MLP's hidden size (default 4 x --hidden, or the preset's)",
              [](RunConfig& c, long long v) { c.model.ffn = int(v), c.model.preset = "custom"; }),
      integer(
          "experts", M, "", 2, 65536, "routed experts of --arch moe (default 8)",
          [](RunConfig& c, long long v) { c.model.experts = int(v), c.model.preset = "custom"; }),
      integer("top-k", M, "", 1, 65536,
              "experts each token is routed to (--arch moe; default 2, at most --experts)",
              [](RunConfig& c, long long v) { c.model.top_k = int(v), c.model.preset = "custom"; }),
      real("capacity-factor", M, "", 0, 1e6, false,
           "--arch moe: tokens an expert takes per sequence, as a multiple of k x seq / experts; "
           "the rest are dropped and counted (0: dropless, the default)",
           [](RunConfig& c, double v) { c.model.capacity_factor = v, c.model.preset = "custom"; }),
      integer("shared-experts", M, "", 0, 65536,
              "--arch moe: experts every token goes through beside its top k (DeepSeekMoE's "
              "shared experts; default 0, or the preset's)",
              [](RunConfig& c, long long v) {
                c.model.shared_experts = int(v), c.model.preset = "custom";
              }),
      real("aux-loss-coef", M, "", 0, 1e6, false,
           "--arch moe: the sequence-wise load-balancing loss's coefficient (default 0.01, or "
           "the preset's; 0: none)",
           [](RunConfig& c, double v) { c.model.aux_loss_coef = v; }),
  };
}

// Batch, steps, optimizer, recomputation and data.
std::vector<Row> training_rows() {
  using K = OptionKind;
  const char* T = "Training";
  return {
      integer("micro-batch", T, "8", 1, 65536, "sequences per micro-batch per rank",
              [](RunConfig& c, long long v) { c.train.micro_batch = int(v); }),
      integer("global-batch", T, "", 1, kMaxInt,
              "sequences per step over all ranks (default micro-batch x dp); more means "
              "gradient accumulation",
              [](RunConfig& c, long long v) { c.train.global_batch = int(v); }),
      integer("steps", T, "20", 1, 1e9, "optimizer steps",
              [](RunConfig& c, long long v) { c.train.steps = int(v); }),
      real("target-ci", T, "0", 0, 1, false,
           "stop the steps once the median step time's 95% interval is within +-this fraction of "
           "it (from 6 timed steps on), --steps being the most; 0: run --steps",
           [](RunConfig& c, double v) { c.target_ci = v; }),
      integer("warmup", T, "2", 0, 1e9, "first steps left out of the summary statistics",
              [](RunConfig& c, long long v) { c.train.warmup = int(v); }),
      integer("seed", T, "1234", 0, 9007199254740991.0, "seed of initialisation and data",
              [](RunConfig& c, long long v) { c.train.seed = std::uint64_t(v); }),
      real("lr", T, "", 0, 10, true,
           "AdamW learning rate, constant (default by preset: " + preset_learning_rates() + ")",
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
      // Rows apply in table order: precision sets tp_comm's default, tp-comm-dtype (below)
      // overrides it when given.
      choice(text("precision", T, K::choice, "fp32",
                  "parameter and matmul dtype: fp32, or bf16 (bf16 parameters and matmul "
                  "operands, fp32 master weights, AdamW state, LayerNorm, softmax and loss)",
                  [](RunConfig& c, const std::string& s) {
                    c.train.precision.param = s == "bf16" ? DType::bf16 : DType::f32;
                    c.train.precision.tp_comm = c.train.precision.param;
                  }),
             {"fp32", "bf16"}),
      choice(text("reduce-dtype", T, K::choice, "fp32",
                  "dtype gradients are accumulated and reduced in; bf16 needs --precision bf16",
                  [](RunConfig& c, const std::string& s) {
                    c.train.precision.reduce = s == "bf16" ? DType::bf16 : DType::f32;
                  }),
             {"fp32", "bf16"}),
      choice(text("tp-comm-dtype", T, K::choice, "",
                  "dtype activations and their gradients move in across tensor-parallel "
                  "collectives and pipeline stages (default: --precision); bf16 needs "
                  "--precision bf16",
                  [](RunConfig& c, const std::string& s) {
                    c.train.precision.tp_comm = s == "bf16" ? DType::bf16 : DType::f32;
                  }),
             {"fp32", "bf16"}),
      with_rule(text("data", T, K::text, "",
                     "token file: llm.c's (a header, then uint16 or uint32 tokens) or flat uint16 "
                     "(default: synthetic data)",
                     [](RunConfig& c, const std::string& s) { c.data_file = s; }),
                readable_file_rule, "a readable token file", "/etc/hostname",
                {"", "/nonexistent-strata-tokens", "/"}),
  };
}

// Nodes, ranks and the parallel mesh.
std::vector<Row> launch_rows() {
  using K = OptionKind;
  const char* L = "Mesh and launch";
  return {
      integer("nodes", L, "", 1, 65536, "nodes (virtual nodes on one machine)",
              [](RunConfig& c, long long v) { c.mesh.nodes = int(v), c.nodes_given = true; }),
      integer("ranks-per-node", L, "", 1, 1024, "ranks per node",
              [](RunConfig& c, long long v) {
                c.mesh.ranks_per_node = int(v), c.ranks_per_node_given = true;
              }),
      with_rule(text("mesh", L, K::text, "",
                     "dp=D,tp=T,pp=P,ep=E,cp=C (default dp = world / (cp tp pp); ep, the "
                     "expert-parallel ranks, divides dp; cp, the context-parallel ranks, splits "
                     "each sequence)",
                     [](RunConfig& c, const std::string& s) { apply_mesh(c, s); }),
                mesh_rule,
                "a comma list of dp=N, tp=N, pp=N, ep=N, cp=N, each axis once, N in 1..65536",
                "dp=1", {"", "dp=2abc", "dp=2,dp=2", "dp=0", "xx=2", "dp", "dp=2,", "dp=99999999"}),
      integer("blas-threads", L, "0", 0, 1024,
              "BLAS threads per rank (0 = auto: CPUs of the rank's affinity mask / ranks sharing "
              "it, at most SLURM_CPUS_PER_TASK)",
              [](RunConfig& c, long long v) { c.blas_threads = int(v); }),
  };
}

// Where the run file goes and what it records.
std::vector<Row> results_rows() {
  using K = OptionKind;
  const char* R = "Results";
  return {
      with_rule(text("out", R, K::text, "results/local", "directory for the run file",
                     [](RunConfig& c, const std::string& s) { c.out_dir = s; }),
                out_dir_rule, "a directory (created if missing)", "results/local",
                {"", "/etc/hostname"}),
      text("run-id", R, K::name, "", "name of the run file (default: time, strategy, mesh)",
           [](RunConfig& c, const std::string& s) { c.run_id = s; }),
      flag("overwrite", R,
           "replace an existing run file of the same --run-id (without it the run is refused "
           "before it starts)",
           [](RunConfig& c, bool b) { c.overwrite = b; }),
      real("peak-tflops", R, "0", 0, 1e6, false,
           "peak TFLOP/s per rank for MFU (0 = the node's cached GEMM peak / its ranks)",
           [](RunConfig& c, double v) { c.peak_tflops = v; }),
      real("max-cv", R, "0.1", 0, 1e9, false,
           "coefficient of variation of the timed steps above which the run is marked unstable "
           "(/summary unstable; summary.txt and report.html name it)",
           [](RunConfig& c, double v) { c.max_cv = v; }),
      real("watchdog", R, "300", 1, 604800, false,
           "seconds a blocking call may take, and a rank may be silent, before the job is ended",
           [](RunConfig& c, double v) { c.watchdog_s = v; }),
      flag("quiet", R, "no per-step lines", [](RunConfig& c, bool b) { c.quiet = b; }),
      integer("log-interval", R, "1", 1, 1e9,
              "a progress line every N steps (and the last): step k/N, elapsed, ETA, loss, "
              "ms/step, tok/s, TFLOP/s per rank, over the interval",
              [](RunConfig& c, long long v) { c.log_interval = int(v); }),
      flag("trace", R,
           "record every compute and comm interval of every rank: /trace in the run file and "
           "<run-id>.trace.json (Chrome/Perfetto timeline)",
           [](RunConfig& c, bool b) { c.trace = b; }),
      flag("calibrate-comm", R,
           "before the timed steps, measure busbw of all_reduce, reduce_scatter and all_gather "
           "at 64 KiB, 1 MiB and 16 MiB on every mesh group: /calibration",
           [](RunConfig& c, bool b) { c.calibrate_comm = b; }),
  };
}

// The option table. Sections are the help's headings; the order is the order values are applied
// (the model preset before the sizes that override it).
std::vector<Row> make_rows() {
  std::vector<Row> rows;
  for (auto section : {what_to_run_rows, prediction_rows, backend_rows, model_rows, training_rows,
                       launch_rows, results_rows}) {
    std::vector<Row> more = section();
    rows.insert(rows.end(), more.begin(), more.end());
  }
  return rows;
}

const Row& row_of(const RunnerOption& o) {
  for (const Row& r : rows())
    if (r.option.name == o.name) return r;
  throw Error("internal: no row for option " + o.name);
}

}  // namespace

const std::vector<Row>& rows() {
  static const std::vector<Row> table = make_rows();
  return table;
}

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

}  // namespace options

using options::integer_text;
using options::join;
using options::kNameAccepts;
using options::number_text;
using options::Row;
using options::row_of;
using options::rows;

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

}  // namespace strata
