// The bad-input suite of the runner's options, driven by the option table itself
// (config_table.cpp): every option accepts its valid example and refuses every value its row says
// it must refuse, from the command line, a --config file and the STRATA_* environment, with one
// line that names the option (or the variable it came from). A new option joins the table and so
// this suite.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "runner/config.hpp"
#include "runner/config_table.hpp"

namespace fs = std::filesystem;
using namespace strata;

namespace {

struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("strata-options-" + std::to_string(::getpid()));
  Scratch() {
    fs::create_directories(dir);
    std::ofstream(dir / "empty.ini");
    std::ofstream tokens(dir / "tokens.bin", std::ios::binary);
    for (int i = 0; i < 4096; ++i) tokens.put(char(i % 200)).put(0);  // uint16 tokens < 256
  }
  ~Scratch() { fs::remove_all(dir); }
};

const Scratch& scratch() {
  static Scratch s;
  return s;
}

// A value the option accepts, with real files where it names one.
std::string valid_value(const RunnerOption& o) {
  if (o.name == "data") return (scratch().dir / "tokens.bin").string();
  if (o.name == "config") return (scratch().dir / "empty.ini").string();
  if (o.name == "out") return (scratch().dir / "out").string();
  return o.valid_example();
}

RunConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "runner");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_cli(int(argv.size()), argv.data());
}

std::vector<std::string> cli_args(const RunnerOption& o, const std::string& value) {
  if (o.kind == OptionKind::flag) return {"--" + o.name + "=" + value};
  return {"--" + o.name, value};
}

// Expect `f` to throw one ConfigError line that contains `name`.
template <class F>
void expect_refused(F&& f, const std::string& name, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(name), std::string::npos) << what << ": '" << m << "' does not name " << name;
    EXPECT_EQ(m.find('\n'), std::string::npos) << what << ": more than one line: " << m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not a ConfigError: " << e.what();
  }
}

std::string env_name(const std::string& option) {
  std::string v = "STRATA_";
  for (char c : option) v += c == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(c)));
  return v;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

TEST(Options, EveryOptionHasInvalidExamples) {
  for (const RunnerOption& o : runner_options()) {
    EXPECT_GE(o.invalid_examples().size(), 2u) << o.name;
    EXPECT_FALSE(o.accepts().empty()) << o.name;
    EXPECT_FALSE(o.help.empty()) << o.name;
  }
}

TEST(Options, EveryOptionAcceptsItsValidExample) {
  for (const RunnerOption& o : runner_options()) {
    const std::string v = valid_value(o);
    std::vector<std::string> args =
        o.kind == OptionKind::flag ? std::vector<std::string>{"--" + o.name} : cli_args(o, v);
    if (o.name == "memory-limit" || o.name == "profile") args.push_back("--dry-run");
    if (o.name == "calibrate") args.insert(args.end(), {"--profile", "machine.h5"});
    if (o.name == "calibrate-from")
      args.insert(args.end(), {"--calibrate", "--profile", "machine.h5"});
    if (o.name.rfind("advise", 0) == 0)  // --advise and its own options
      args.insert(args.end(), {"--profile", "machine.h5", "--memory-limit", "80GiB"});
    if (o.name.rfind("advise-", 0) == 0) args.push_back("--advise");
    if (o.name == "kv-heads")  // a llama's, dividing its heads (head size 2: rotary pairs)
      args.insert(args.end(), {"--arch", "llama", "--heads", "64", "--hidden", "128"});
    if (o.name == "experts" || o.name == "capacity-factor" || o.name == "shared-experts")
      args.insert(args.end(), {"--arch", "moe"});  // a mixture of experts' options
    if (o.name == "top-k") args.insert(args.end(), {"--arch", "moe", "--experts", "65536"});
    if (o.name == "cuda-graphs") {  // a GPU option: refused in one line without --device cuda
      expect_refused([&] { parse(args); }, "--cuda-graphs", "--cuda-graphs without --device cuda");
      if (!backend_built(Device::cuda)) continue;
      args.insert(args.end(), {"--device", "cuda", "--transport", "nccl"});
    }
    EXPECT_NO_THROW(parse(args)) << "--" << o.name << " " << v;
  }
}

TEST(Options, CommandLineRefusesEveryInvalidValue) {
  int cases = 0;
  for (const RunnerOption& o : runner_options())
    for (const std::string& bad : o.invalid_examples()) {
      expect_refused([&] { parse(cli_args(o, bad)); }, "--" + o.name,
                     "--" + o.name + " '" + bad + "'");
      ++cases;
    }
  std::printf("%d invalid command-line values refused\n", cases);
}

TEST(Options, ConfigFileRefusesEveryInvalidValue) {
  const fs::path ini = scratch().dir / "bad.ini";
  int cases = 0;
  for (const RunnerOption& o : runner_options()) {
    if (o.name == "config") continue;  // a config file naming one is refused anyway (below)
    for (const std::string& bad : o.invalid_examples()) {
      // An INI value loses its surrounding blanks: " tiny" written there is "tiny".
      if (!bad.empty() && (bad.front() == ' ' || bad.back() == ' ')) continue;
      std::ofstream(ini) << o.name << " = " << bad << "\n";
      expect_refused(
          [&] {
            parse({"--config", ini.string()});
          },
          o.name, "config file " + o.name + " = '" + bad + "'");
      ++cases;
    }
  }
  std::ofstream(ini) << "config = " << ini.string() << "\n";
  expect_refused([&] { parse({"--config", ini.string()}); }, "config", "a config naming a config");
  std::printf("%d invalid config-file values refused\n", cases);
}

// A config as editors write it: a UTF-8 byte order mark, CRLF line ends. A NUL byte (a binary
// file) and an endless or huge file (/dev/zero) refused with one line that names them.
TEST(Options, ConfigFileTakesBomAndCrlfAndRefusesBinary) {
  const fs::path ini = scratch().dir / "editor.ini";
  std::ofstream(ini, std::ios::binary) << "\xEF\xBB\xBFsteps = 7\r\nmodel = small\r\n";
  const RunConfig c = parse({"--config", ini.string()});
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.model.preset, "small");
  std::ofstream(ini, std::ios::binary) << std::string("steps = 7\nmo\0del = small\n", 22);
  EXPECT_THROW(
      {
        try {
          parse({"--config", ini.string()});
        } catch (const ConfigError& e) {
          EXPECT_EQ(std::string(e.what()),
                    "--config " + ini.string() + ": a NUL byte at offset 12, not a text file");
          throw;
        }
      },
      ConfigError);
  try {
    parse({"--config", "/dev/zero"});
    ADD_FAILURE() << "--config /dev/zero accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "--config /dev/zero: larger than 1 MiB, not a config file");
  }
}

TEST(Options, EnvironmentRefusesEveryInvalidValue) {
  int cases = 0;
  for (const RunnerOption& o : runner_options())
    for (const std::string& bad : o.invalid_examples()) {
      if (!option_from_environment(o.name)) {  // ignored there: any value runs
        const std::string var = env_name(o.name);
        ::setenv(var.c_str(), bad.c_str(), 1);
        EXPECT_NO_THROW(parse({})) << var << "='" << bad << "' is not an option's value";
        ::unsetenv(var.c_str());
        continue;
      }
      const std::string var = env_name(o.name);
      ::setenv(var.c_str(), bad.c_str(), 1);
      expect_refused([&] { parse({}); }, var, var + "='" + bad + "'");
      ::unsetenv(var.c_str());
      ++cases;
    }
  std::printf("%d invalid environment values refused\n", cases);
}

// The runner itself: exit 2, one line on stderr naming the option, no file, for every invalid
// value of every option on its command line.
TEST(Options, RunnerExitsTwoWithOneLineAndNoFile) {
  const fs::path out = scratch().dir / "runner-out";
  const fs::path err = scratch().dir / "stderr.txt";
  int cases = 0;
  for (const RunnerOption& o : runner_options())
    for (const std::string& bad : o.invalid_examples()) {
      fs::remove_all(out);
      fs::create_directories(out);
      std::string cmd = shell_quote(STRATA_RUNNER_PATH) + " --plugin ddp";
      if (o.name != "out") cmd += " --out " + shell_quote(out.string());
      for (const std::string& a : cli_args(o, bad)) cmd += " " + shell_quote(a);
      cmd += " > /dev/null 2> " + shell_quote(err.string());
      const int status = std::system(cmd.c_str());
      std::ifstream f(err);
      std::vector<std::string> lines;
      for (std::string line; std::getline(f, line);) lines.push_back(line);
      const std::string what = "--" + o.name + " '" + bad + "'";
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << what << ": status " << status;
      ASSERT_EQ(lines.size(), 1u) << what;
      EXPECT_NE(lines[0].find("--" + o.name), std::string::npos) << what << ": " << lines[0];
      EXPECT_TRUE(fs::is_empty(out)) << what << ": left a file";
      ++cases;
    }
  std::printf("%d runner invocations refused\n", cases);
}
