// fuzz_config: libFuzzer target for the runner's option parser, parse_cli
// (core/src/runner/config.cpp), and the mesh checks that follow it (resolve_mesh) and the printing
// of the result (resolved()). Contract: each returns or throws strata::ConfigError. Any other
// exception, a crash, a hang, a leak or a sanitizer report is a bug.
//
// parse_cli reads argv, an optional `--config FILE` (program_options INI) and STRATA_* environment
// variables, so the input drives all three. It is text, so that seeds and the dictionary read
// naturally; one item per line:
//   argv words (argv[0] is "runner"), then any of these sections, each until the next:
//   %config   the INI file: the lines after it are written to a file in the harness's temporary
//             directory, passed as `--config FILE` after the words
//   %env      NAME=VALUE lines, set as environment variables for the call (STRATA_ is prefixed
//             when missing) and unset after it
//   %world W R  (one line) resolve_mesh with world size W and R ranks per host (default 1 1)
// Hermetic: the harness writes only in its temporary directory, clears every STRATA_* variable of
// its own environment at start, and refuses inputs naming /dev, /proc or /sys (a --config /dev/zero
// would read forever: not the parser's business). parse_cli itself only reads (--config, --data).
// FUZZ_VERBOSE=1 prints each call's outcome (to check what a seed or a reproducer reaches).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "runner/config.hpp"
#include "strata/types.hpp"

namespace {

namespace fs = std::filesystem;

struct Input {
  std::vector<std::string> words{"runner"};
  bool has_config = false;
  std::string config_body;
  std::vector<std::pair<std::string, std::string>> env;
  int world = 1, ranks_per_host = 1;
};

int bounded_int(const std::string& text, int fallback) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  return end == text.c_str() || v < 1 || v > (1 << 20) ? fallback : int(v);
}

Input split_input(std::string_view data) {
  Input in;
  enum class Section { words, config, env } section = Section::words;
  std::size_t start = 0;
  while (start <= data.size()) {
    std::size_t end = data.find('\n', start);
    if (end == std::string_view::npos) end = data.size();
    const std::string line(data.substr(start, end - start));
    start = end + 1;
    if (line == "%config") {
      section = Section::config;
      in.has_config = true;
    } else if (line == "%env") {
      section = Section::env;
    } else if (line.rfind("%world ", 0) == 0) {
      const std::size_t space = line.find(' ', 7);
      in.world = bounded_int(line.substr(7), 1);
      if (space != std::string::npos) in.ranks_per_host = bounded_int(line.substr(space + 1), 1);
    } else if (section == Section::words) {
      if (end < data.size() || !line.empty()) in.words.push_back(line);
    } else if (section == Section::config) {
      in.config_body += line + "\n";
    } else if (const std::size_t eq = line.find('='); eq != std::string::npos) {
      std::string name = line.substr(0, eq);
      if (name.rfind("STRATA_", 0) != 0) name = "STRATA_" + name;
      in.env.emplace_back(name, line.substr(eq + 1));
    }
  }
  return in;
}

// Sets the input's variables for the lifetime of the object; unsets them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::vector<std::pair<std::string, std::string>>& vars) {
    for (const auto& [name, value] : vars)
      if (::setenv(name.c_str(), value.c_str(), 1) == 0) names_.push_back(name);
  }
  ~ScopedEnv() {
    for (const auto& name : names_) ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::string> names_;
};

[[noreturn]] void contract_broken(const char* where, const std::exception* e) {
  std::fprintf(stderr, "fuzz_config: %s threw %s, not strata::ConfigError: %s\n", where,
               e ? typeid(*e).name() : "a non-std::exception", e ? e->what() : "");
  std::abort();
}

const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;

// Runs `f`; ConfigError is an answer, anything else thrown is a bug.
template <typename F>
bool returns_or_config_error(const char* where, F&& f) {
  try {
    f();
    if (verbose) std::fprintf(stderr, "fuzz_config: %s returned\n", where);
    return true;
  } catch (const strata::ConfigError& e) {
    if (verbose) std::fprintf(stderr, "fuzz_config: %s: ConfigError: %s\n", where, e.what());
    return false;
  } catch (const std::exception& e) {
    contract_broken(where, &e);
  } catch (...) {
    contract_broken(where, nullptr);
  }
}

fs::path work_dir;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string templ = (fs::temp_directory_path() / "strata-fuzz-config-XXXXXX").string();
  if (!::mkdtemp(templ.data())) {
    std::perror("fuzz_config: mkdtemp");
    std::exit(1);
  }
  work_dir = templ;
  std::vector<std::string> inherited;
  for (char** e = environ; *e; ++e)
    if (std::string_view(*e).rfind("STRATA_", 0) == 0) {
      std::string_view entry(*e);
      inherited.emplace_back(entry.substr(0, entry.find('=')));
    }
  for (const auto& name : inherited) ::unsetenv(name.c_str());
  std::atexit([] {
    std::error_code ignored;
    fs::remove_all(work_dir, ignored);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const char* special : {"/dev", "/proc", "/sys"})
    if (text.find(special) != std::string_view::npos) return -1;  // not for the corpus
  Input in = split_input(text);
  if (in.has_config) {
    const fs::path ini = work_dir / "run.ini";
    std::ofstream(ini, std::ios::binary) << in.config_body;
    in.words.push_back("--config");
    in.words.push_back(ini.string());
  }
  std::vector<char*> argv;
  for (auto& w : in.words) argv.push_back(w.data());
  argv.push_back(nullptr);

  ScopedEnv env(in.env);
  strata::RunConfig config;
  if (!returns_or_config_error(
          "parse_cli", [&] { config = strata::parse_cli(int(argv.size()) - 1, argv.data()); }))
    return 0;
  returns_or_config_error("RunConfig::resolved", [&] { (void)config.resolved(); });
  if (returns_or_config_error("resolve_mesh",
                              [&] { strata::resolve_mesh(config, in.world, in.ranks_per_host); }))
    returns_or_config_error("RunConfig::resolved after resolve_mesh",
                            [&] { (void)config.resolved(); });
  return 0;
}
