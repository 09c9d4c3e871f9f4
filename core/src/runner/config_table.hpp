// The runner's option table: one row per option, with what it accepts, its default, its help and
// how a value is applied to RunConfig (run_config.hpp). RunnerOption and runner_options() are its
// public face (the help, the bad-input suite); the rows in strata::options are private to
// config.cpp, which parses with them, and config_table.cpp.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "runner/run_config.hpp"

namespace strata {

// What a runner option accepts.
enum class OptionKind {
  flag,     // no value on the command line; true/false/yes/no/on/off/1/0 in a file or variable
  integer,  // decimal digits, in [min, max]
  real,     // a finite number, in [min, max] (or (min, max] with min_exclusive)
  size,     // bytes with an optional unit: 80GiB, 512MiB, 1e9; in (0, max]
  choice,   // one of `choices`
  name,     // a file-name-safe word: letters, digits, '.', '_', '+', '-'; not starting with '.'
  text,     // anything non-empty (checked by the option's own rule)
};

struct RunnerOption {
  std::string name;  // the long name, without "--"
  std::string section;
  OptionKind kind;
  std::string default_value;  // empty: none
  std::string help;
  double min = 0, max = 0;
  bool min_exclusive = false;
  std::vector<std::string> choices;
  bool repeatable = false;
  std::vector<std::string> also_invalid;  // refused values beyond those the kind implies
  // "an integer in 1..4096": the allowed values, as error messages and the help say them.
  std::string accepts() const;
  // Values this option must refuse (from its kind and range, plus also_invalid).
  std::vector<std::string> invalid_examples() const;
  // A value this option accepts.
  std::string valid_example() const;
};

// Every runner option, in help order.
const std::vector<RunnerOption>& runner_options();

}  // namespace strata

namespace strata::options {

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

// One option: its description (RunnerOption) and what the core does with it.
struct Row {
  RunnerOption option;
  Apply apply;
  Rule rule = nullptr;
  std::string rule_accepts;  // text options: what the rule allows, for messages
  std::string example;       // text options: a value the rule allows
};

// Every row, in help order (also the order values are applied: the model preset before the sizes
// that override it).
const std::vector<Row>& rows();
// The row of option `name` (without "--"), or null.
const Row* find_row(const std::string& name);
// Check `text` against `row`; returns the parsed value or throws ConfigError naming `where`.
OptionValue check_value(const Row& row, const std::string& where, const std::string& text);

std::string join(const std::vector<std::string>& v, const char* sep = ", ");
// "" when `path` names a readable regular file, else what is wrong with it.
std::string readable_file_rule(const std::string& path);
bool is_file_name(const std::string& s);
extern const char* const kNameAccepts;

}  // namespace strata::options
